package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/x509"
	"debug/buildinfo"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/validate"

	"github.com/outboxkit/outbox/internal/deployspec"
)

// The image built for this machine's architecture: read back from the
// tarball, its filesystem unpacked, `outbox version` run from it prints the
// version its labels carry; the binary is static, the user is the
// non-root one of /etc/passwd, the CA certificates parse, and the
// entrypoint is the binary.
func TestImageRunsOutboxVersion(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Fatalf("the image is a Linux image; this test runs its binary: run it on Linux")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute) // a cold build cache on a loaded machine
	defer cancel()
	dir := t.TempDir()
	out := filepath.Join(dir, "outbox.tar")
	var log bytes.Buffer
	b, err := build(ctx, options{out: out, format: "docker", platform: "linux/" + runtime.GOARCH, tag: "example.com/outbox:test",
		caCerts: "/etc/ssl/certs/ca-certificates.crt"}, &log)
	if err != nil {
		t.Fatalf("build the image: %v\n%s", err, log.String())
	}
	tag, err := name.NewTag("example.com/outbox:test")
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(out, &tag)
	if err != nil {
		t.Fatalf("read the written image back: %v", err)
	}
	if err := validate.Image(img, validate.Fast); err != nil {
		t.Fatalf("the written image does not validate: %v", err)
	}
	// A docker-archive keeps the config and the layers, not the manifest.
	config, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	if config != b.config {
		t.Fatalf("the tarball's image has config %s, the built one %s", config, b.config)
	}

	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if want := []string{deployspec.ImageBinary}; !slices.Equal(c.Entrypoint, want) || filepath.Base(c.Entrypoint[0]) != "outbox" {
		t.Errorf("entrypoint %q, want %q", c.Entrypoint, want)
	}
	if want := fmt.Sprintf("%d:%d", deployspec.ImageUID, deployspec.ImageGID); c.User != want {
		t.Errorf("user %q, want %q (non-root)", c.User, want)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s, want linux/%s", cf.OS, cf.Architecture, runtime.GOARCH)
	}
	for _, k := range []string{"title", "description", "version", "source"} {
		if c.Labels["org.opencontainers.image."+k] == "" {
			t.Errorf("label org.opencontainers.image.%s missing; labels %v", k, c.Labels)
		}
	}

	root := filepath.Join(dir, "rootfs")
	extract(t, img, root)

	exe := filepath.Join(root, deployspec.ImageBinary)
	assertStatic(t, exe)
	info, err := buildinfo.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	if settings["CGO_ENABLED"] != "0" {
		t.Errorf("the binary was built with CGO_ENABLED=%q, want 0", settings["CGO_ENABLED"])
	}
	// Go stamps the commit in a clone (a .git folder), not in a git
	// worktree (a .git file) nor in a tree without version control.
	if fi, err := os.Stat("../../.git"); err == nil && fi.IsDir() && settings["vcs.revision"] == "" {
		t.Errorf("built in a git clone, the binary carries no vcs.revision: %v", settings)
	}
	if c.Labels["org.opencontainers.image.revision"] != settings["vcs.revision"] {
		t.Errorf("label revision %q, binary's vcs.revision %q", c.Labels["org.opencontainers.image.revision"], settings["vcs.revision"])
	}
	if got, want := c.Labels["org.opencontainers.image.created"], settings["vcs.time"]; (got == "") != (want == "") {
		t.Errorf("label created %q, binary's vcs.time %q", got, want)
	}

	run := exec.CommandContext(ctx, exe, "version")
	run.Dir, run.Env = root, []string{}
	got, err := run.CombinedOutput()
	if err != nil {
		t.Fatalf("%s version: %v\n%s", exe, err, got)
	}
	version := c.Labels["org.opencontainers.image.version"]
	if first := strings.SplitN(string(got), "\n", 2)[0]; first != "outbox "+version {
		t.Errorf("outbox version printed %q first, want %q (the version label)\n%s", first, "outbox "+version, got)
	}
	if settings["vcs.revision"] != "" && !strings.Contains(string(got), "commit "+settings["vcs.revision"]) {
		t.Errorf("outbox version does not name the commit %s:\n%s", settings["vcs.revision"], got)
	}

	passwd, err := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	wantUser := fmt.Sprintf("%s:x:%d:%d:", deployspec.ImageUser, deployspec.ImageUID, deployspec.ImageGID)
	if !strings.Contains(string(passwd), "\n"+wantUser) {
		t.Errorf("/etc/passwd has no line %s...:\n%s", wantUser, passwd)
	}
	if _, err := os.Stat(filepath.Join(root, "etc/group")); err != nil {
		t.Error(err)
	}
	pem, err := os.ReadFile(filepath.Join(root, deployspec.ImageCACerts))
	if err != nil {
		t.Fatal(err)
	}
	if !x509.NewCertPool().AppendCertsFromPEM(pem) || bytes.Count(pem, []byte("BEGIN CERTIFICATE")) < 10 {
		t.Errorf("%s holds %d certificates that do not all parse", deployspec.ImageCACerts, bytes.Count(pem, []byte("BEGIN CERTIFICATE")))
	}
	if fi, err := os.Stat(filepath.Join(root, deployspec.ImageHome)); err != nil || !fi.IsDir() {
		t.Errorf("the working directory %s is not in the image: %v", deployspec.ImageHome, err)
	}
	if c.WorkingDir != deployspec.ImageHome {
		t.Errorf("working directory %q, want %q", c.WorkingDir, deployspec.ImageHome)
	}

	// The same binary as an OCI image layout (not built again).
	t.Run("layout", func(t *testing.T) { testLayout(t, ctx, exe) })
}

// extract unpacks img's filesystem (its layers, flattened) into root.
func extract(t *testing.T, img v1.Image, root string) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(root, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o777|0o200)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.ReadFrom(tr); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("the image holds %s of tar type %q; it ships directories and regular files only", h.Name, h.Typeflag)
		}
	}
}

// assertStatic fails unless exe is an ELF file without an interpreter.
func assertStatic(t *testing.T, exe string) {
	t.Helper()
	f, err := elf.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatalf("%s is linked dynamically", exe)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Fatalf("%s needs the shared libraries %v", exe, libs)
	}
}

// Bad flags are refused with one line, before anything is built.
func TestBadFlags(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		o    options
		want string
	}{
		{options{format: "docker", platform: "linux/amd64"}, "-o: name the file"},
		{options{out: "x", format: "zip", platform: "linux/amd64"}, `-format "zip": use docker or oci`},
		{options{out: "x", format: "docker", platform: "windows/amd64"}, `-platform "windows/amd64": use linux/ARCH`},
		{options{out: "x", format: "docker", platform: "linux/amd64", caCerts: filepath.Join(t.TempDir(), "none.pem")}, "-ca-certs: open"},
	} {
		_, err := build(ctx, c.o, &bytes.Buffer{})
		if err == nil || !strings.HasPrefix(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("build(%+v): %v, want one line starting %q", c.o, err, c.want)
		}
	}
}

// testLayout checks that -format oci writes an OCI image layout whose one
// image is named by the default tag, the binary's version, and that it
// does not write into an existing folder.
func testLayout(t *testing.T, ctx context.Context, exe string) {
	out := filepath.Join(t.TempDir(), "layout")
	var log bytes.Buffer
	b, err := build(ctx, options{out: out, format: "oci", platform: "linux/" + runtime.GOARCH, caCerts: "/etc/ssl/certs/ca-certificates.crt", bin: exe}, &log)
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if want := "outbox:" + tagSafe(b.version); b.tag != want {
		t.Errorf("default tag %q, want %q", b.tag, want)
	}
	p, err := layout.FromPath(out)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 || m.Manifests[0].Digest != b.digest || m.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != strings.TrimPrefix(b.tag, "outbox:") {
		t.Fatalf("layout index %+v, want the one image %s named %s", m.Manifests, b.digest, b.tag)
	}
	if _, err := build(ctx, options{out: out, format: "oci", platform: "linux/" + runtime.GOARCH, caCerts: "/etc/ssl/certs/ca-certificates.crt", bin: exe}, &log); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("a second build into the same folder: %v, want a refusal", err)
	}
}

func TestTagSafe(t *testing.T) {
	for in, want := range map[string]string{
		"v1.4.0": "v1.4.0",
		"v0.0.0-20261207201500-f77a4b6a1b2c+dirty": "v0.0.0-20261207201500-f77a4b6a1b2c-dirty",
		"(devel)": "devel",
		"":        "latest",
	} {
		if got := tagSafe(in); got != want {
			t.Errorf("tagSafe(%q) = %q, want %q", in, got, want)
		}
		if _, err := name.NewTag("outbox:" + tagSafe(in)); err != nil {
			t.Errorf("outbox:%s is not a valid tag: %v", tagSafe(in), err)
		}
	}
}
