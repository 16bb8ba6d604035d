// Command image builds the container image of the outbox command without a
// container daemon: it builds cmd/outbox statically (CGO_ENABLED=0; the
// SQLite driver, modernc.org/sqlite, is pure Go, so PostgreSQL, MySQL/MariaDB
// and SQLite all work), and lays it on an empty base with a non-root user
// (uid and gid 65532), the CA certificates of the build machine and OCI
// labels taken from the binary's own build information, as `outbox version`
// reads it.
//
//	go run ./deploy/image -o outbox.tar                       # docker load -i outbox.tar
//	go run ./deploy/image -o outbox.tar -platform linux/arm64 -tag registry.example/outbox:v1.4.0
//	go run ./deploy/image -format oci -o outbox-oci           # an OCI image layout folder
//
// The tarball (-format docker, the default) is what `docker load`, `crane
// push` and `skopeo copy docker-archive:` read; the layout folder is what
// `skopeo copy oci:` and `crane push` read. Times in the image are the
// commit's (vcs.time), so one commit builds the same layers. See
// docs/deploy.md.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"debug/buildinfo"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/outboxkit/outbox/internal/deployspec"
	"github.com/outboxkit/outbox/internal/gobuild"
)

const (
	pkg    = "github.com/outboxkit/outbox/cmd/outbox"
	source = "https://github.com/outboxkit/outbox"
)

// The image's fixed parts, which the manifests rely on (deployspec).
const (
	Binary   = deployspec.ImageBinary
	UID, GID = deployspec.ImageUID, deployspec.ImageGID
	User     = deployspec.ImageUser
	Home     = deployspec.ImageHome
	CACerts  = deployspec.ImageCACerts
)

// options are the command's flags.
type options struct {
	out      string // -o
	format   string // -format: docker or oci
	platform string // -platform: os/arch[/variant]
	tag      string // -tag; default outbox:<version>
	caCerts  string // -ca-certs: the PEM bundle copied into the image
	bin      string // a binary built already (tests); empty: build one
}

func main() {
	var o options
	flag.StringVar(&o.out, "o", "", "where to write the image: a tarball (-format docker) or a folder (-format oci)")
	flag.StringVar(&o.format, "format", "docker", "docker (a tarball for docker load, crane push, skopeo docker-archive:) or oci (an OCI image layout folder)")
	flag.StringVar(&o.platform, "platform", "linux/"+defaultArch(), "the image's platform, linux/ARCH[/VARIANT] (GOARCH names: amd64, arm64, arm/v7, ...)")
	flag.StringVar(&o.tag, "tag", "", "the image's name and tag (default outbox:VERSION, the version `outbox version` prints)")
	flag.StringVar(&o.caCerts, "ca-certs", "/etc/ssl/certs/ca-certificates.crt", "the PEM bundle of CA certificates placed at "+CACerts)
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: go run ./deploy/image -o FILE [-format docker|oci] [-platform linux/ARCH] [-tag NAME:TAG] [-ca-certs FILE]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "image: unexpected argument %q\n", flag.Arg(0))
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	b, err := build(ctx, o, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	fmt.Printf("wrote %s (%s, %s, %s)\n", o.out, b.tag, b.platform, b.digest)
}

func defaultArch() string {
	if a := os.Getenv("GOARCH"); a != "" {
		return a
	}
	out, err := exec.Command("go", "env", "GOARCH").Output()
	if err != nil {
		return "amd64"
	}
	return strings.TrimSpace(string(out))
}

// built describes a written image.
type built struct {
	tag      string
	platform string
	version  string  // the binary's module version
	digest   v1.Hash // the manifest's
	config   v1.Hash // the config's (a docker-archive keeps it as is)
}

// build checks o, builds the binary, makes the image and writes it.
func build(ctx context.Context, o options, stderr io.Writer) (built, error) {
	var b built
	if o.out == "" {
		return b, errors.New("-o: name the file (or, with -format oci, the folder) to write")
	}
	if o.format != "docker" && o.format != "oci" {
		return b, fmt.Errorf("-format %q: use docker or oci", o.format)
	}
	if _, err := os.Stat(o.out); o.format == "oci" && err == nil {
		// Refused before the build rather than after it.
		return b, fmt.Errorf("%s exists: -format oci writes a new folder", o.out)
	}
	plat, err := v1.ParsePlatform(o.platform)
	if err != nil || plat.OS != "linux" || plat.Architecture == "" {
		return b, fmt.Errorf("-platform %q: use linux/ARCH[/VARIANT], e.g. linux/amd64 or linux/arm64", o.platform)
	}
	b.platform = plat.String()
	certs, err := os.ReadFile(o.caCerts)
	if err != nil {
		return b, fmt.Errorf("-ca-certs: %w (install the ca-certificates package, or name a PEM bundle)", err)
	}
	if !bytes.Contains(certs, []byte("-----BEGIN CERTIFICATE-----")) {
		return b, fmt.Errorf("-ca-certs %s: holds no PEM certificate", o.caCerts)
	}

	dir, err := os.MkdirTemp("", "outbox-image")
	if err != nil {
		return b, err
	}
	defer os.RemoveAll(dir)
	bin := o.bin
	if bin == "" {
		bin = filepath.Join(dir, "outbox")
		if err := goBuild(ctx, bin, *plat, stderr); err != nil {
			return b, err
		}
	}
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		return b, fmt.Errorf("read the build information of %s: %w", bin, err)
	}
	if err := checkStatic(bin); err != nil {
		return b, err
	}
	meta := metadataOf(info)
	b.version = meta.version
	b.tag = o.tag
	if b.tag == "" {
		b.tag = "outbox:" + tagSafe(meta.version)
	}
	ref, err := name.NewTag(b.tag)
	if err != nil {
		return b, fmt.Errorf("-tag %q: %w", b.tag, err)
	}

	img, err := image(bin, certs, *plat, meta)
	if err != nil {
		return b, err
	}
	if b.digest, err = img.Digest(); err != nil {
		return b, err
	}
	if b.config, err = img.ConfigName(); err != nil {
		return b, err
	}
	switch o.format {
	case "docker":
		err = tarball.WriteToFile(o.out, ref, img)
	case "oci":
		err = writeLayout(o.out, ref, img)
	}
	if err != nil {
		return b, fmt.Errorf("write %s: %w", o.out, err)
	}
	return b, nil
}

// goBuild builds cmd/outbox for plat into bin, without cgo.
func goBuild(ctx context.Context, bin string, plat v1.Platform, stderr io.Writer) error {
	// -buildvcs=auto: stamp the commit (and so the module version) that
	// `outbox version` and the labels read, even where GOFLAGS says
	// -buildvcs=false; a tree without version control builds as (devel).
	// Without cgo and with -trimpath (internal/gobuild): a static binary
	// with no machine paths.
	cmd := gobuild.Command(ctx, "", "-buildvcs=auto", "-ldflags=-s -w", "-o", bin, pkg)
	cmd.Env = append(cmd.Env, "GOOS=linux", "GOARCH="+plat.Architecture)
	if plat.Architecture == "arm" && plat.Variant != "" {
		cmd.Env = append(cmd.Env, "GOARM="+strings.TrimPrefix(plat.Variant, "v"))
	}
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s for %s: %w", pkg, plat.String(), err)
	}
	return nil
}

// checkStatic refuses a binary that needs a dynamic loader: the image has
// none.
func checkStatic(bin string) error {
	f, err := elf.Open(bin)
	if err != nil {
		return fmt.Errorf("%s: %w", bin, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is linked dynamically (it has an ELF interpreter); the image has no C library", bin)
		}
	}
	return nil
}

// metadata is what the image's labels say of the binary.
type metadata struct {
	version, revision string
	created           time.Time
}

// metadataOf reads the binary's build information as `outbox version`
// does (cmd/outbox/version.go): the module version and the VCS revision
// and time.
func metadataOf(info *buildinfo.BuildInfo) metadata {
	m := metadata{version: info.Main.Version}
	if m.version == "" {
		m.version = "(devel)"
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			m.revision = s.Value
		case "vcs.time":
			m.created, _ = time.Parse(time.RFC3339, s.Value)
		}
	}
	return m
}

// tagSafe turns a module version into a valid image tag:
// v0.0.0-20261207-abc+dirty becomes v0.0.0-20261207-abc-dirty, (devel)
// becomes devel.
func tagSafe(version string) string {
	t := regexp.MustCompile(`[^A-Za-z0-9_.-]+`).ReplaceAllString(version, "-")
	t = strings.Trim(t, "-.")
	if t == "" {
		return "latest"
	}
	if len(t) > 128 {
		t = t[:128]
	}
	return t
}

// image lays the binary and the system files on an empty base.
func image(bin string, certs []byte, plat v1.Platform, m metadata) (v1.Image, error) {
	exe, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	at := m.created.UTC()
	if m.created.IsZero() {
		at = time.Unix(0, 0).UTC() // no VCS time: a fixed one, as reproducible builds do
	}
	dir := func(path string, mode int64, uid int) file {
		return file{hdr: tar.Header{Typeflag: tar.TypeDir, Name: path + "/", Mode: mode, Uid: uid, Gid: uid}}
	}
	reg := func(path string, mode int64, body []byte) file {
		return file{hdr: tar.Header{Typeflag: tar.TypeReg, Name: path, Mode: mode, Size: int64(len(body))}, body: body}
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\n%s:x:%d:%d:%s:%s:/sbin/nologin\n", User, UID, GID, User, Home)
	group := fmt.Sprintf("root:x:0:\n%s:x:%d:\n", User, GID)
	system, err := layer(at,
		dir("etc", 0o755, 0),
		reg("etc/passwd", 0o644, []byte(passwd)),
		reg("etc/group", 0o644, []byte(group)),
		reg("etc/nsswitch.conf", 0o644, []byte("hosts: files dns\n")),
		dir("etc/ssl", 0o755, 0),
		dir("etc/ssl/certs", 0o755, 0),
		reg(strings.TrimPrefix(CACerts, "/"), 0o644, certs),
		dir("home", 0o755, 0),
		dir(strings.TrimPrefix(Home, "/"), 0o700, UID),
		file{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777}},
	)
	if err != nil {
		return nil, err
	}
	program, err := layer(at,
		dir("usr", 0o755, 0),
		dir("usr/local", 0o755, 0),
		dir("usr/local/bin", 0o755, 0),
		reg(strings.TrimPrefix(Binary, "/"), 0o755, exe),
	)
	if err != nil {
		return nil, err
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base,
		mutate.Addendum{Layer: system, MediaType: types.OCILayer, History: v1.History{Created: v1.Time{Time: at}, CreatedBy: "outbox image: /etc/passwd, /etc/group, CA certificates"}},
		mutate.Addendum{Layer: program, MediaType: types.OCILayer, History: v1.History{Created: v1.Time{Time: at}, CreatedBy: "outbox image: " + Binary}},
	)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = plat.OS, plat.Architecture, plat.Variant
	cf.Created = v1.Time{Time: at}
	cf.Config.User = fmt.Sprintf("%d:%d", UID, GID)
	cf.Config.Entrypoint = []string{Binary}
	cf.Config.Cmd = nil
	cf.Config.WorkingDir = Home
	cf.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + Home}
	cf.Config.Labels = labels(m)
	return mutate.ConfigFile(img, cf)
}

// labels are the image's org.opencontainers.image.* annotations.
func labels(m metadata) map[string]string {
	l := map[string]string{
		"org.opencontainers.image.title":         "outbox",
		"org.opencontainers.image.description":   "Transactional outbox: the relay, the operations console and the outbox CLI",
		"org.opencontainers.image.version":       m.version,
		"org.opencontainers.image.source":        source,
		"org.opencontainers.image.url":           source,
		"org.opencontainers.image.documentation": source + "/blob/main/docs/deploy.md",
	}
	if m.revision != "" {
		l["org.opencontainers.image.revision"] = m.revision
	}
	if !m.created.IsZero() {
		l["org.opencontainers.image.created"] = m.created.UTC().Format(time.RFC3339)
	}
	return l
}

// file is one entry of a layer.
type file struct {
	hdr  tar.Header
	body []byte
}

// layer makes a gzip layer of files, each stamped with time at.
func layer(at time.Time, files ...file) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := f.hdr
		h.ModTime, h.Format = at, tar.FormatPAX
		if err := tw.WriteHeader(&h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	// Compressed once here: handed an uncompressed tar, the layer would
	// compress it again for its digest, its size and each write.
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestSpeed) // as go-containerregistry would
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(buf.Bytes()); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	raw := gz.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(raw)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// writeLayout writes img as the only image of an OCI image layout at dir,
// named ref.
func writeLayout(dir string, ref name.Tag, img v1.Image) error {
	// Made here, not merged into: build refused an existing folder, and one
	// made since fails.
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	return p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": ref.TagStr(),
		"io.containerd.image.name":          ref.Name(),
	}))
}
