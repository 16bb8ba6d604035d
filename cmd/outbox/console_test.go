package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
)

// inProcess runs the command line in this process with ctx and input.
func inProcess(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer, args ...string) error {
	root := newRoot()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	return root.ExecuteContext(ctx)
}

func runInProcess(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	var out testenv.Buffer
	err := inProcess(testenv.Context(t, time.Minute), strings.NewReader(stdin), &out, &out, args...)
	return out.String(), err
}

// The console fails closed: it does not start without users (unless
// --dev), --dev listens on the loopback only, and a non-loopback address
// needs TLS.
func TestConsoleFailsClosed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	users := filepath.Join(dir, "users.json")
	pg := testenv.DatabaseURL()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"console", "--db", pg, "--users", users}, "no console users"},
		{[]string{"console", "--db", pg, "--users", users, "--dev", "--addr", "0.0.0.0:0"}, "--dev listens on the loopback only"},
		{[]string{"console", "--db", pg, "--users", users, "--tls-cert", "x.pem"}, "--tls-cert and --tls-key go together"},
	}
	for _, c := range cases {
		if out, err := runInProcess(t, "", c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v (output %q); want an error saying %q", c.args, err, out, c.want)
		}
	}
	if _, err := runInProcess(t, "", "console", "user", "add", "olga", "--role", "operator", "--users", users); err != nil {
		t.Fatal(err)
	}
	if _, err := runInProcess(t, "", "console", "--db", pg, "--users", users, "--addr", "0.0.0.0:0"); err == nil || !strings.Contains(err.Error(), "--proxy-tls") {
		t.Errorf("a non-loopback address without TLS: %v; want a refusal naming --tls-cert and --proxy-tls", err)
	}
	if _, err := runInProcess(t, "", "console", "--db", pg, "--users", users, "--destination", "x", "--route-by", "type"); err == nil || !strings.Contains(err.Error(), "--destination sends every event") {
		t.Errorf("contradicting routing flags: %v; want the relay's refusal", err)
	}
	if _, err := runInProcess(t, "", "console", "--db", pg, "--users", users, "--route-by", "payload"); err == nil || !strings.Contains(err.Error(), "cannot route by") {
		t.Errorf("an unknown routing column: %v", err)
	}
}

// `outbox console user` adds (printing the password and token once),
// lists and removes users; the file keeps hashes only, readable by its
// owner only.
func TestConsoleUsers(t *testing.T) {
	t.Parallel()
	users := filepath.Join(t.TempDir(), "users.json")
	out, err := runInProcess(t, "", "console", "user", "add", "vera", "--role", "viewer", "--users", users)
	if err != nil {
		t.Fatal(err)
	}
	password := regexp.MustCompile(`password:\s+(\S+)`).FindStringSubmatch(out)
	token := regexp.MustCompile(`API token: (obx_\S+)`).FindStringSubmatch(out)
	if password == nil || token == nil {
		t.Fatalf("user add printed %q; want the password and the token", out)
	}
	if _, err := runInProcess(t, "a password from a script\n", "console", "user", "add", "olga", "--role", "operator", "--users", users, "--password-stdin"); err != nil {
		t.Fatal(err)
	}
	file, err := os.ReadFile(users)
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{password[1], token[1], "a password from a script"} {
		if strings.Contains(string(file), secret) {
			t.Fatalf("the users file holds %q in the clear:\n%s", secret, file)
		}
	}
	if fi, err := os.Stat(users); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("users file mode %v (%v); want 0600", fi.Mode(), err)
	}
	refusals := [][]string{
		{"console", "user", "add", "vera", "--role", "viewer", "--users", users},
		{"console", "user", "add", "root", "--role", "admin", "--users", users},
		{"console", "user", "add", "bad name", "--role", "viewer", "--users", users},
		{"console", "user", "remove", "nobody", "--users", users},
	}
	for _, args := range refusals {
		if _, err := runInProcess(t, "", args...); err == nil {
			t.Errorf("%v succeeded", args)
		}
	}
	if _, err := runInProcess(t, "short\n", "console", "user", "add", "pia", "--role", "viewer", "--users", users, "--password-stdin"); err == nil {
		t.Error("a 5-byte password was accepted")
	}
	if _, err := runInProcess(t, "", "console", "user", "remove", "vera", "--users", users); err != nil {
		t.Fatal(err)
	}
	list, err := runInProcess(t, "", "console", "user", "list", "--users", users)
	if err != nil || !strings.Contains(list, "olga") || strings.Contains(list, "vera") {
		t.Fatalf("user list = %q, %v; want olga only", list, err)
	}
}

// `outbox console` serves a migrated table on each database (PostgreSQL,
// MySQL/MariaDB, SQLite): an API client with its token reads the
// overview, an operator pauses a scope and `outbox status` shows it, and
// the command stops when its context ends.
func TestConsoleServes(t *testing.T) {
	t.Parallel()
	for _, db := range []string{"postgres", "mysql", "sqlite"} {
		t.Run(db, func(t *testing.T) {
			t.Parallel()
			ctx := testenv.Context(t, time.Minute)
			var flags []string
			switch db {
			case "postgres":
				_, flags = migrated(t)
			case "mysql":
				flags = mysqlMigrated(t).flags
			case "sqlite":
				flags = []string{"--db", "sqlite://" + filepath.Join(t.TempDir(), "app.db")}
				if _, stderr, code := run(t, nil, append([]string{"migrate"}, flags...)...); code != 0 {
					t.Fatalf("migrate: %s", stderr)
				}
			}
			users := filepath.Join(t.TempDir(), "users.json")
			token := func(name, role string) string {
				out, err := runInProcess(t, "", "console", "user", "add", name, "--role", role, "--users", users)
				if err != nil {
					t.Fatal(err)
				}
				return regexp.MustCompile(`API token: (obx_\S+)`).FindStringSubmatch(out)[1]
			}
			vera, otto := token("vera", "viewer"), token("otto", "operator")
			sctx, stop := context.WithCancel(ctx)
			var stderr testenv.Buffer
			done := make(chan error, 1)
			go func() {
				done <- inProcess(sctx, strings.NewReader(""), io.Discard, &stderr, append([]string{"console", "--users", users, "--addr", "127.0.0.1:0"}, flags...)...)
			}()
			listening := regexp.MustCompile(`on (http://127\.0\.0\.1:\d+)`)
			var base string
			await.Eventually(t, 30*time.Second, func() error {
				if m := listening.FindStringSubmatch(stderr.String()); m != nil {
					base = m[1]
					return nil
				}
				select {
				case err := <-done:
					t.Fatalf("console ended before listening: %v; stderr %q", err, stderr.String())
				default:
				}
				return fmt.Errorf("console not listening; stderr %q", stderr.String())
			})
			var overview struct {
				Backlog *int64 `json:"backlog"`
			}
			consoleCall(t, base, "GET", "/api/v1/overview", vera, nil, 200, &overview)
			if overview.Backlog == nil || *overview.Backlog != 0 {
				t.Fatalf("overview: backlog %v, want 0", overview.Backlog)
			}
			consoleCall(t, base, "POST", "/api/v1/pauses/"+url.PathEscape("aggregatetype=order")+"/pause", otto, map[string]string{"reason": "receiver upgrade"}, 200, nil)
			out, stderrOut, code := run(t, nil, append([]string{"status", "--json"}, flags...)...)
			if code != 0 || !strings.Contains(out, `"scope":"aggregatetype"`) || !strings.Contains(out, "receiver upgrade") {
				t.Fatalf("status after the pause: %d %s %s", code, out, stderrOut)
			}
			stop()
			if err := <-done; err != nil {
				t.Fatalf("console after its context ended: %v", err)
			}
		})
	}
}
