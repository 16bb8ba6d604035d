package docsnippets

import (
	"bufio"
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"

	"github.com/outboxkit/outbox/internal/gobuild"
	"github.com/outboxkit/outbox/internal/testenv"
)

// The services the README's quick start names, which the test replaces
// with its own.
const (
	quickStartDB   = "postgres://postgres@127.0.0.1:5432/test"
	quickStartNATS = "nats://127.0.0.1:4222"
	quickStartSays = "published OrderPlaced of order 1 to outbox.event.order in stream OUTBOX"
)

// TestQuickStartSaysWhatItPublished runs the README's quick start, on a
// database and a NATS JetStream server of its own, and waits for it to
// say what it published where; then Ctrl-C stops it cleanly.
func TestQuickStartSaysWhatItPublished(t *testing.T) {
	root := moduleRoot(t)
	content, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := extract("README.md", string(content))
	if err != nil {
		t.Fatal(err)
	}
	var code string
	for _, b := range blocks {
		if b.complete && strings.HasPrefix(b.code, "// Command quickstart") {
			code = b.code
		}
	}
	if code == "" || !strings.Contains(code, quickStartDB) || !strings.Contains(code, quickStartNATS) {
		t.Fatalf("README.md has no quick start program (a ```go block starting \"// Command quickstart\") naming %s and %s", quickStartDB, quickStartNATS)
	}

	// A database of its own, for the quick start's public.outbox and orders.
	pool := testenv.Pool(t)
	name := testenv.Name("quickstart")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := pool.Exec(ctx, `CREATE DATABASE `+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP DATABASE IF EXISTS `+name+` WITH (FORCE)`); err != nil {
			t.Logf("drop database %s: %v", name, err)
		}
	})
	dbURL, err := url.Parse(testenv.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	dbURL.Path = "/" + name

	// A NATS JetStream server of its own: the quick start makes stream
	// OUTBOX on outbox.event.>.
	srv, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("the embedded NATS server did not start within 10s")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })

	code = strings.ReplaceAll(code, quickStartDB, dbURL.String())
	code = strings.ReplaceAll(code, quickStartNATS, srv.ClientURL())
	here, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(here, "_quickstart")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "quickstart")
	build := gobuild.Command(ctx, dir, "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build of the quick start: %v\n%s", err, out)
	}

	cmd := exec.CommandContext(ctx, bin)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var said []string
	deadline := time.After(60 * time.Second)
wait:
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				_ = cmd.Wait()
				t.Fatalf("the quick start ended (%v) before it said %q; it said:\n%s", cmd.ProcessState, quickStartSays, strings.Join(said, "\n"))
			}
			said = append(said, l)
			if strings.HasSuffix(l, quickStartSays) {
				break wait
			}
		case <-deadline:
			_ = cmd.Process.Kill()
			t.Fatalf("the quick start did not say %q within 60s; it said:\n%s", quickStartSays, strings.Join(said, "\n"))
		}
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	for l := range lines {
		said = append(said, l)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the quick start after Ctrl-C: %v; it said:\n%s", err, strings.Join(said, "\n"))
	}
}
