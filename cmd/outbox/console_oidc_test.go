package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv/await"
)

// The console's OpenID Connect flags fail closed at start, each with a
// one-line error naming the flag; so do --dev with a users file or with
// OIDC, and a users file open to its group or others (with the chmod
// that fixes it).
func TestConsoleOIDCFailsClosed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	users := filepath.Join(dir, "users.json")
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("the-client-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := runInProcess(t, "", "console", "user", "add", "olga", "--role", "operator", "--users", users); err != nil {
		t.Fatal(err)
	}
	none := filepath.Join(dir, "none.json")
	pg := dbURL()
	oidc := func(issuer string, more ...string) []string {
		return append([]string{"console", "--db", pg, "--users", none, "--oidc-issuer", issuer, "--oidc-client-id", "outbox",
			"--oidc-client-secret-file", secret, "--addr", "127.0.0.1:8080"}, more...)
	}
	if os.Getenv(envOIDCSecret) != "" {
		t.Fatalf("%s is set in the test's environment: unset it", envOIDCSecret)
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"console", "--db", pg, "--users", none, "--oidc-client-id", "x"}, "--oidc-client-id needs --oidc-issuer"},
		{[]string{"console", "--db", pg, "--users", none, "--oidc-role", "a=viewer"}, "--oidc-role needs --oidc-issuer"},
		{append(oidc("https://idp.example", "--oidc-role", "a=viewer"), "--dev"), "--dev signs everyone in without a password, so it does not take --oidc-issuer"},
		{[]string{"console", "--db", pg, "--users", users, "--dev"}, "--dev signs everyone in without a password, so it does not take users"},
		{oidc("http://idp.example", "--oidc-role", "a=viewer"), "--oidc-issuer: http://idp.example: http is allowed on the loopback only"},
		{oidc("http://127.0.0.1:1", "--oidc-role", "a=viewer"), "--oidc-issuer: discovery at http://127.0.0.1:1/.well-known/openid-configuration failed"},
		{oidc("https://idp.example", "--oidc-role", "admins=admin"), `--oidc-role admins=admin: unknown role "admin"`},
		{oidc("https://idp.example", "--oidc-role", "admins"), `--oidc-role "admins": use CLAIMVALUE=ROLE`},
		{oidc("https://idp.example"), "--oidc-role: map at least one value of the groups claim"},
		{[]string{"console", "--db", pg, "--users", none, "--oidc-issuer", "https://idp.example", "--oidc-role", "a=viewer"}, "--oidc-client-id: required"},
		{[]string{"console", "--db", pg, "--users", none, "--oidc-issuer", "https://idp.example", "--oidc-client-id", "x", "--oidc-role", "a=viewer"}, "--oidc-client-secret-file: required with --oidc-issuer (or set OUTBOX_OIDC_CLIENT_SECRET)"},
		{append(oidc("https://idp.example", "--oidc-role", "a=viewer"), "--addr", "127.0.0.1:0"), "--oidc-redirect-url: required with --addr 127.0.0.1:0"},
		{append(oidc("https://idp.example", "--oidc-role", "a=viewer"), "--oidc-redirect-url", "https://console.example/cb"), "--oidc-redirect-url: https://console.example/cb: the path must be /login/oidc/callback"},
	}
	for _, c := range cases {
		out, err := runInProcess(t, "", c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: %v (output %q); want one line saying %q", c.args, err, out, c.want)
		}
		if err != nil && strings.Contains(err.Error()+out, "the-client-secret") {
			t.Errorf("%v: the client secret shows: %v %q", c.args, err, out)
		}
	}
	if err := os.Chmod(users, 0o640); err != nil {
		t.Fatal(err)
	}
	failsWithOneLine(t, nil, "run `chmod 600 "+users+"`", "console", "--db", pg, "--users", users)
}

// SIGHUP makes a running `outbox console` process re-read its users
// file: a removed user's token stops working and an added user's starts;
// a file that no longer loads (open to others) leaves the users as they
// were, and the log says why.
func TestConsoleSIGHUPReloadsUsers(t *testing.T) {
	t.Parallel()
	_, flags := migrated(t)
	users := filepath.Join(t.TempDir(), "users.json")
	add := func(name, role string) string {
		t.Helper()
		out, err := runInProcess(t, "", "console", "user", "add", name, "--role", role, "--users", users)
		if err != nil {
			t.Fatal(err)
		}
		return regexp.MustCompile(`API token: (obx_\S+)`).FindStringSubmatch(out)[1]
	}
	vera := add("vera", "viewer")
	p, base := startConsoleProcess(t, append([]string{"--users", users, "--addr", "127.0.0.1:0"}, flags...)...)
	consoleCall(t, base, "GET", "/api/v1/overview", vera, nil, http.StatusOK, nil)

	if _, err := runInProcess(t, "", "console", "user", "remove", "vera", "--users", users); err != nil {
		t.Fatal(err)
	}
	olga := add("olga", "operator")
	consoleCall(t, base, "GET", "/api/v1/overview", olga, nil, http.StatusUnauthorized, nil) // not yet
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	await.Eventually(t, 30*time.Second, func() error {
		if !strings.Contains(p.stderr.String(), "users file reloaded") {
			return fmt.Errorf("no %q in the console's log yet", "users file reloaded")
		}
		return nil
	})
	consoleCall(t, base, "GET", "/api/v1/overview", olga, nil, http.StatusOK, nil)
	consoleCall(t, base, "GET", "/api/v1/overview", vera, nil, http.StatusUnauthorized, nil)

	if err := os.Chmod(users, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	await.Eventually(t, 30*time.Second, func() error {
		if !strings.Contains(p.stderr.String(), "users file not reloaded") {
			return fmt.Errorf("no %q in the console's log yet", "users file not reloaded")
		}
		return nil
	})
	if !strings.Contains(p.stderr.String(), "chmod 600 "+users) {
		t.Fatalf("the log does not say how to fix the file:\n%s", p.stderr.String())
	}
	consoleCall(t, base, "GET", "/api/v1/overview", olga, nil, http.StatusOK, nil)
	select {
	case err := <-p.done:
		t.Fatalf("the console ended after SIGHUP: %v", err)
	default:
	}
}
