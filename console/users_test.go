package console_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/outboxkit/outbox/console"
	"github.com/outboxkit/outbox/ops"
)

// SetUsers takes effect at once: a removed user's session ends at its
// next request and their API token stops working; a changed role is the
// session's at its next request; users that do not check are refused and
// the users stay as they were.
func TestSetUsers(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	viewer, operator := r.users[ops.Viewer], r.users[ops.Operator]
	vb, ob := r.browser(), r.browser()
	vb.login(viewer)
	ob.login(operator)
	id := r.deadLetter()

	next := &console.Users{}
	for _, u := range r.accounts.Users {
		switch u.Name {
		case viewer.name: // removed
		case operator.name:
			u.Role = ops.Viewer
			next.Users = append(next.Users, u)
		default:
			next.Users = append(next.Users, u)
		}
	}
	bad := &console.Users{Users: append(append([]console.User(nil), next.Users...), next.Users[0])} // twice
	if err := r.srv.SetUsers(bad); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("users with a name twice: %v; want a refusal", err)
	}
	if code, _ := vb.get("/"); code != http.StatusOK {
		t.Fatalf("the viewer after a refused reload: %d; want the session kept", code)
	}
	if err := r.srv.SetUsers(next); err != nil {
		t.Fatal(err)
	}
	signedOut(t, vb, "a removed user's session")
	if code, _ := r.api("GET", "/api/v1/overview", viewer.token, nil); code != http.StatusUnauthorized {
		t.Fatalf("a removed user's API token: %d; want 401", code)
	}
	if code := vb.signIn(viewer.name, viewer.password); code != http.StatusUnauthorized {
		t.Fatalf("a removed user's sign-in: %d; want 401", code)
	}
	code, page := ob.get("/")
	if code != http.StatusOK || !strings.Contains(string(page), `id="role">viewer<`) {
		t.Fatalf("the operator made a viewer: %d; want the overview with the viewer role:\n%s", code, page)
	}
	if code, _ := ob.post("/dead-letters/"+id+"/retry", nil, true); code != http.StatusForbidden {
		t.Fatalf("a retry by the operator made a viewer: %d; want 403", code)
	}
	if code, _ := r.api("POST", "/api/v1/dead-letters/"+id+"/retry", operator.token, map[string]string{"reason": "x"}); code != http.StatusForbidden {
		t.Fatalf("a retry with the token of the operator made a viewer: %d; want 403", code)
	}
}

// Dev mode signs everyone in without a password: it takes neither users
// nor OpenID Connect.
func TestDevRefusesUsersAndOIDC(t *testing.T) {
	t.Parallel()
	r := newRig(t, &rigOptions{cfg: console.Config{Dev: true}})
	u := &console.Users{Cost: bcrypt.MinCost}
	if _, err := u.Add("olga", ops.Operator, "a long enough password"); err != nil {
		t.Fatal(err)
	}
	if _, err := console.New(r.op, &console.Config{Dev: true, Users: u}); err == nil || !strings.Contains(err.Error(), "does not take users") {
		t.Errorf("dev with users: %v; want a refusal", err)
	}
	p := newProvider(t)
	p.accounts["ada"] = map[string]any{"groups": "staff"}
	o := p.oidc(map[string]ops.Role{"staff": ops.Viewer}, "")("http://127.0.0.1:1")
	if _, err := console.New(r.op, &console.Config{Dev: true, OIDC: o}); err == nil || !strings.Contains(err.Error(), "does not take OpenID Connect") {
		t.Errorf("dev with OIDC: %v; want a refusal", err)
	}
	if err := r.srv.SetUsers(u); err == nil {
		t.Error("users set on a dev console")
	}
	// OIDC alone is enough to start, without users.
	if _, err := console.New(r.op, &console.Config{OIDC: o}); err != nil {
		t.Errorf("OIDC without users: %v", err)
	}
}

// A users file its group or others may read or write is refused, with
// the chmod that fixes it; at 0600 it loads.
func TestUsersFileMode(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "users.json")
	u := &console.Users{Cost: bcrypt.MinCost}
	if _, err := u.Add("olga", ops.Operator, "a long enough password"); err != nil {
		t.Fatal(err)
	}
	if err := u.Save(path); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("saved users file: %v, %v; want mode 0600", fi.Mode(), err)
	}
	for _, mode := range []os.FileMode{0o640, 0o604, 0o620, 0o660, 0o644} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		_, err := console.LoadUsers(path)
		if err == nil || !strings.Contains(err.Error(), "run `chmod 600 "+path+"`") {
			t.Errorf("mode %04o: %v; want a refusal with the chmod that fixes it", mode, err)
		}
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := console.LoadUsers(path); err != nil || len(got.Users) != 1 {
		t.Fatalf("mode 0600: %v, %v", got, err)
	}
}
