package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/outboxkit/outbox/internal/deployspec"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
)

// shipped reads the Kubernetes manifests under deploy/.
func shipped(t *testing.T) *deployspec.Manifests {
	t.Helper()
	m, err := deployspec.Load(filepath.Join("..", "..", deployspec.KubernetesDir))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// shippedCommand returns the outbox command line a shipped Deployment's
// container runs, and the container.
func shippedCommand(t *testing.T, m *deployspec.Manifests, deployment, container string) ([]string, *corev1.Container) {
	t.Helper()
	d, err := m.Deployment(deployment)
	if err != nil {
		t.Fatal(err)
	}
	c, err := deployspec.Container(d, container)
	if err != nil {
		t.Fatal(err)
	}
	args, err := deployspec.CommandLine(c)
	if err != nil {
		t.Fatal(err)
	}
	return args, c
}

// parseCommandLine finds the subcommand args name and parses the rest with
// that command's own flag set, as `outbox` would before running it.
func parseCommandLine(args []string) (string, error) {
	cmd, rest, err := newRoot().Find(args)
	if err != nil {
		return "", err
	}
	if err := cmd.ParseFlags(rest); err != nil {
		return "", fmt.Errorf("outbox %s: %w", cmd.Name(), err)
	}
	if err := cmd.ValidateArgs(cmd.Flags().Args()); err != nil {
		return "", fmt.Errorf("outbox %s: %w", cmd.Name(), err)
	}
	return cmd.Name(), nil
}

// withFlag returns args with --name's value replaced by value (added when
// absent).
func withFlag(args []string, name, value string) []string {
	out := slices.Clone(args)
	for i, a := range out {
		if a == "--"+name && i+1 < len(out) {
			out[i+1] = value
			return out
		}
		if strings.HasPrefix(a, "--"+name+"=") {
			out[i] = "--" + name + "=" + value
			return out
		}
	}
	return append(out, "--"+name+"="+value)
}

// The command lines the shipped manifests and the systemd unit run are
// outbox commands whose flags parse; a flag outbox lacks would not.
func TestShippedCommandLinesParse(t *testing.T) {
	t.Parallel()
	m := shipped(t)
	relayArgs, _ := shippedCommand(t, m, "outbox-relay", "relay")
	consoleArgs, _ := shippedCommand(t, m, "outbox-console", "console")
	program, unitArgs, err := deployspec.ExecStart(filepath.Join("..", "..", deployspec.SystemdUnit))
	if err != nil {
		t.Fatal(err)
	}
	if program != deployspec.ImageBinary {
		t.Errorf("the systemd unit runs %s, docs/deploy.md installs outbox at %s", program, deployspec.ImageBinary)
	}
	for _, c := range []struct {
		where string
		args  []string
		want  string
	}{
		{"Deployment outbox-relay", relayArgs, "relay"},
		{"Deployment outbox-console", consoleArgs, "console"},
		{deployspec.SystemdUnit, unitArgs, "relay"},
	} {
		got, err := parseCommandLine(c.args)
		if err != nil || got != c.want {
			t.Errorf("%s runs outbox %q: %q, %v; want outbox %s with flags that parse", c.where, c.args, got, err, c.want)
		}
		if _, err := parseCommandLine(append(slices.Clone(c.args), "--no-such-flag=1")); err == nil {
			t.Errorf("%s: outbox %q with --no-such-flag parses: the check cannot fail", c.where, c.args)
		}
	}
}

// systemd-analyze verify finds nothing wrong with the shipped unit (with
// ExecStart's program pointed at a built outbox, since verify wants it to
// exist): no unknown key, no bad value.
func TestShippedSystemdUnitVerifies(t *testing.T) {
	t.Parallel()
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatal("systemd-analyze not found: install systemd (apt-get install systemd) to verify deploy/systemd/outbox-relay.service")
	}
	raw, err := os.ReadFile(filepath.Join("..", "..", deployspec.SystemdUnit))
	if err != nil {
		t.Fatal(err)
	}
	exe, err := filepath.Abs(bin)
	if err != nil {
		t.Fatal(err)
	}
	unit := strings.Replace(string(raw), "ExecStart="+deployspec.ImageBinary+" ", "ExecStart="+exe+" ", 1)
	if unit == string(raw) {
		t.Fatalf("the unit's ExecStart does not run %s", deployspec.ImageBinary)
	}
	path := filepath.Join(t.TempDir(), filepath.Base(deployspec.SystemdUnit))
	if err := os.WriteFile(path, []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", path).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify %s: %v\n%s", deployspec.SystemdUnit, err, out)
	}
	// A misspelt key is reported (verify only warns, exiting 0).
	bad := strings.Replace(unit, "ProtectClock=", "ProtectClok=", 1)
	if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _ := exec.Command(analyze, "verify", path).CombinedOutput(); !strings.Contains(string(out), "ProtectClok") {
		t.Fatalf("systemd-analyze verify says nothing of a misspelt key: %q", out)
	}
}

// The relay, run with the shipped Deployment's arguments and environment
// (the Secret's database and sink URLs standing for a test table and a
// stdout sink, --metrics-addr on a free loopback port), answers its
// liveness and readiness probes with 200, and the ServiceMonitor's path
// with the outbox metrics.
func TestShippedRelayAnswersItsProbes(t *testing.T) {
	t.Parallel()
	m := shipped(t)
	args, c := shippedCommand(t, m, "outbox-relay", "relay")
	tb, _ := migrated(t)
	addr := freeAddr(t)
	args = withFlag(args, "metrics-addr", addr)
	var env []string
	for _, e := range c.Env {
		switch {
		case e.Name == "OUTBOX_DB":
			env = append(env, "OUTBOX_DB="+dbURL())
		case e.Name == "OUTBOX_SINK":
			env = append(env, "OUTBOX_SINK=stdout:")
		case e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory":
			// What the kubelet sets: the limit in bytes.
			env = append(env, e.Name+"="+strconv.FormatInt(c.Resources.Limits.Memory().Value(), 10))
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+e.Value)
		default:
			t.Fatalf("the relay container's variable %s comes from where this test does not know: %+v", e.Name, e.ValueFrom)
		}
	}
	if !slices.ContainsFunc(env, func(s string) bool { return strings.HasPrefix(s, "OUTBOX_DB=") }) ||
		!slices.ContainsFunc(env, func(s string) bool { return strings.HasPrefix(s, "OUTBOX_SINK=") }) {
		t.Fatalf("the relay container sets neither OUTBOX_DB nor OUTBOX_SINK: %v", c.Env)
	}
	p := startRelayEnv(t, env, append(args[1:], "--schema", tb.Schema, "--table", tb.Name)...)

	probes := map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe}
	for _, kind := range []string{"liveness", "readiness"} {
		path := probes[kind].HTTPGet.Path
		await.Eventually(t, 60*time.Second, func() error {
			select {
			case err := <-p.done:
				p.done <- err
				t.Fatalf("the relay ended: %v\n%s", err, p.stderr.String())
			default:
			}
			resp, err := http.Get("http://" + addr + path)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s probe GET %s: %s", kind, path, resp.Status)
			}
			return nil
		})
	}
	sm := m.ServiceMonitors[0].Spec.Endpoints[0]
	if body := get(t, "http://"+addr+sm.Path); !strings.Contains(body, "outbox_status_up") {
		t.Fatalf("GET %s (the ServiceMonitor's path) has no outbox_status_up:\n%.500s", sm.Path, body)
	}
}

// The console, run with the shipped Deployment's arguments (the TLS and
// users Secrets' files made here, --addr on the loopback), serves its
// probe's path over HTTPS with 200.
func TestShippedConsoleAnswersItsProbe(t *testing.T) {
	t.Parallel()
	m := shipped(t)
	args, c := shippedCommand(t, m, "outbox-console", "console")
	_, flags := migrated(t)
	dir := t.TempDir()
	certFile, keyFile, pool := selfSigned(t, dir)
	users := filepath.Join(dir, "users.json")
	if out, err := runInProcess(t, "", "console", "user", "add", "vera", "--role", "viewer", "--users", users); err != nil {
		t.Fatalf("console user add: %v\n%s", err, out)
	}
	args = withFlag(args, "addr", "127.0.0.1:0")
	args = withFlag(args, "tls-cert", certFile)
	args = withFlag(args, "tls-key", keyFile)
	args = withFlag(args, "users", users)
	var env []string
	for _, e := range c.Env {
		if e.Name == "OUTBOX_DB" {
			env = append(env, "OUTBOX_DB="+flags[1]) // flags: --db URL --schema S --table T
		}
	}
	if len(env) == 0 {
		t.Fatalf("the console container does not set OUTBOX_DB: %v", c.Env)
	}
	cmd := exec.Command(bin, append(args, flags[2:]...)...)
	cmd.Env = append(os.Environ(), env...)
	var stderr testenv.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	listening := regexp.MustCompile(`on https://(127\.0\.0\.1:\d+)`)
	var addr string
	await.Eventually(t, 60*time.Second, func() error {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("the console ended: %v\n%s", err, stderr.String())
		default:
		}
		if mm := listening.FindStringSubmatch(stderr.String()); mm != nil {
			addr = mm[1]
			return nil
		}
		return fmt.Errorf("the console serves no HTTPS yet; stderr %q", stderr.String())
	})
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}}, Timeout: 30 * time.Second}
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
		resp, err := client.Get("https://" + addr + p.HTTPGet.Path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("probe GET %s: %s", p.HTTPGet.Path, resp.Status)
		}
	}
}

// selfSigned writes a self-signed certificate for 127.0.0.1 and its key
// into dir, and returns their files and a pool trusting it.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "outbox-console"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}
