package console_test

import (
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/outboxkit/outbox/console"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/ops"
)

// The mapping of the OIDC tests: --oidc-role admins=approver
// --oidc-role oncall=operator --oidc-role staff=viewer.
var oidcRoles = map[string]ops.Role{"admins": ops.Approver, "oncall": ops.Operator, "staff": ops.Viewer}

// oidcRig is a console (with the users file's users too) signing in
// through a provider in the test, its log kept in logs.
func oidcRig(t *testing.T) (*rig, *provider, *testenv.Buffer) {
	t.Helper()
	p := newProvider(t)
	p.accounts["ada"] = map[string]any{"preferred_username": "ada", "email": "ada@example.com", "groups": []any{"staff", "oncall"}}
	p.accounts["grace"] = map[string]any{"email": "grace@example.com", "groups": []any{"staff", "oncall", "admins"}}
	p.accounts["linus"] = map[string]any{"preferred_username": "linus", "groups": []any{"contractors"}}
	p.accounts["nogroups"] = map[string]any{"preferred_username": "nogroups"}
	p.accounts["otto"] = map[string]any{"preferred_username": "otto", "groups": "staff"} // a users-file name
	p.accounts["system"] = map[string]any{"preferred_username": "(outbox)", "groups": "admins"}
	logs := &testenv.Buffer{}
	r := newRig(t, &rigOptions{users: true, oidc: p.oidc(oidcRoles, ""),
		cfg: console.Config{Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}})
	return r, p, logs
}

// oidcFlow starts a sign-in in b, lets the provider sign in account (or
// refuse it), changes the callback URL with mutate (when not nil), and
// returns the callback's status and page.
func oidcFlow(t *testing.T, b *browser, p *provider, account string, mutate func(u *url.URL)) (int, string) {
	t.Helper()
	p.set(func() { p.auto = account })
	resp, err := b.c.Get(b.r.url + "/login/oidc?next=" + url.QueryEscape("/dead-letters"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	auth, err := url.Parse(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusSeeOther || err != nil || !strings.HasPrefix(auth.String(), p.url+"/auth?") {
		t.Fatalf("sign-in start: %d to %q; want 303 to the provider", resp.StatusCode, auth)
	}
	q := auth.Query()
	if q.Get("code_challenge_method") != "S256" || q.Get("state") == "" || q.Get("nonce") == "" || q.Get("client_secret") != "" {
		t.Fatalf("the authorize request %v: want PKCE S256, a state, a nonce and no secret", q)
	}
	resp, err = b.c.Get(auth.String())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	back, err := url.Parse(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusSeeOther || err != nil || !strings.HasPrefix(back.String(), b.r.url+console.OIDCCallbackPath+"?") {
		t.Fatalf("the provider: %d to %q; want 303 to the console's callback", resp.StatusCode, back)
	}
	if mutate != nil {
		mutate(back)
	}
	code, page := b.get(strings.TrimPrefix(back.String(), b.r.url))
	return code, string(page)
}

var continueLink = regexp.MustCompile(`href="([^"]+)" id="continue"`)

// signedInAs follows the page after a sign-in and returns who the
// console says is signed in, and keeps the session's CSRF token.
func signedInAs(t *testing.T, b *browser, page string) string {
	t.Helper()
	m := continueLink.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no link onwards on the page after the sign-in:\n%s", page)
	}
	code, next := b.get(m[1])
	who := regexp.MustCompile(`id="user">([^<]*)</span> <span class="role" id="role">([^<]*)<`).FindSubmatch(next)
	csrf := csrfField.FindSubmatch(next)
	if code != http.StatusOK || who == nil || csrf == nil {
		t.Fatalf("%s after the sign-in: %d\n%s", m[1], code, next)
	}
	b.csrf = string(csrf[1])
	return string(who[1]) + " " + string(who[2])
}

// signedOut asserts b has no session: the overview sends it to sign in.
func signedOut(t *testing.T, b *browser, why string) {
	t.Helper()
	if code, _ := b.get("/"); code != http.StatusSeeOther {
		t.Fatalf("%s: the overview answered %d; want 303 to the sign-in page (no session)", why, code)
	}
}

// A full authorization code flow with PKCE: the console sends the
// browser to the provider with S256, a state and a nonce; the callback
// exchanges the code with the verifier and the secret, verifies the ID
// token and starts a session with the mapped role (the highest of the
// user's groups); the sign-in and sign-out are audited, and signing out
// ends the session. The sign-in page shows the provider's button and,
// with a users file, the password form too.
func TestOIDCSignIn(t *testing.T) {
	t.Parallel()
	r, p, _ := oidcRig(t)
	b := r.browser()
	code, login := b.get("/login")
	host := strings.TrimPrefix(p.url, "http://")
	if code != http.StatusOK || !strings.Contains(string(login), "Sign in with "+host) || !strings.Contains(string(login), `id="password"`) {
		t.Fatalf("sign-in page: %d; want the provider's button and the password form:\n%s", code, login)
	}
	code, page := oidcFlow(t, b, p, "ada", nil)
	if code != http.StatusOK {
		t.Fatalf("callback: %d\n%s", code, page)
	}
	if who := signedInAs(t, b, page); who != "ada operator" {
		t.Fatalf("signed in as %q; want ada operator (staff and oncall: the higher, operator)", who)
	}
	if !strings.Contains(page, `content="0;url=/dead-letters"`) {
		t.Fatalf("the page after the sign-in does not go on to /dead-letters:\n%s", page)
	}
	// The operator may act: the role is the session's.
	id := r.deadLetter()
	if code, body := b.post("/dead-letters/"+id+"/retry", url.Values{"reason": {"fixed"}}, true); code != http.StatusSeeOther {
		t.Fatalf("retry by the OIDC operator: %d %s", code, body)
	}
	last := r.audit()
	if len(last) < 2 || last[1].Action != ops.ActionLogin || last[1].Actor != "ada" || last[1].Role != "operator" || !strings.Contains(last[1].Detail, "through "+host) {
		t.Fatalf("audit: %+v; want ada's login through %s before the retry", last[:min(2, len(last))], host)
	}
	if code, _ := b.post("/logout", nil, true); code != http.StatusSeeOther {
		t.Fatalf("sign-out: %d", code)
	}
	signedOut(t, b, "after the sign-out")
	if a := r.audit()[0]; a.Action != ops.ActionLogout || a.Actor != "ada" {
		t.Fatalf("last audit row %+v; want ada's logout", a)
	}
	// The name falls back to email when there is no preferred_username;
	// admins maps to approver, above operator and viewer.
	b = r.browser()
	code, page = oidcFlow(t, b, p, "grace", nil)
	if code != http.StatusOK {
		t.Fatalf("callback: %d\n%s", code, page)
	}
	if who := signedInAs(t, b, page); who != "grace@example.com approver" {
		t.Fatalf("signed in as %q; want grace@example.com approver", who)
	}
	// The password sign-in stays (a users file is given).
	pw := r.browser()
	pw.login(r.users[ops.Viewer])
}

// With OIDC the console answers two more routes, both public (they are
// how one signs in), and otherwise the routes of the role matrix.
func TestOIDCRoutes(t *testing.T) {
	t.Parallel()
	r, _, _ := oidcRig(t)
	listed := map[string]bool{}
	for _, m := range roleMatrix {
		listed[m.method+" "+m.pattern] = true
	}
	var extra []string
	for _, rt := range r.srv.Routes() {
		if k := rt.Method + " " + rt.Pattern; !listed[k] {
			extra = append(extra, k)
			if !rt.Public || rt.Permission != "" {
				t.Errorf("%s: public %v, permission %q; want a public route", k, rt.Public, rt.Permission)
			}
		}
		delete(listed, rt.Method+" "+rt.Pattern)
	}
	if strings.Join(extra, ", ") != "GET /login/oidc, GET "+console.OIDCCallbackPath || len(listed) != 0 {
		t.Fatalf("routes beyond the role matrix %q, matrix rows not answered %v", extra, listed)
	}
}

// Refusals: a callback whose state is not this browser's, a callback in a
// browser that started no sign-in, an ID token with another nonce, from
// another issuer, for another audience, expired or signed with a key the
// provider does not list, an account the provider refuses, an account
// whose groups map to no role (the page names the claim read and its
// values), one without the claim, a name the console's own actors have,
// and a name a users-file user has. Each
// ends without a session and with a denied audit row.
func TestOIDCRefusals(t *testing.T) {
	t.Parallel()
	r, p, _ := oidcRig(t)
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		account string
		mutate  func(*url.URL)
		tamper  func(map[string]any)
		signer  *rsa.PrivateKey
		status  int
		page    string // on the page
		audit   string // in the denied row's detail
	}{
		{name: "state mismatch", account: "ada", mutate: func(u *url.URL) {
			q := u.Query()
			q.Set("state", "forged-"+q.Get("state"))
			u.RawQuery = q.Encode()
		}, status: 403, page: "does not match the one this browser started", audit: "state"},
		{name: "nonce mismatch", account: "ada", tamper: func(c map[string]any) { c["nonce"] = "another sign-in's" },
			status: 403, page: "was not issued for this sign-in", audit: "nonce"},
		{name: "other issuer", account: "ada", tamper: func(c map[string]any) { c["iss"] = "https://idp.example" },
			status: 403, page: "could not be verified", audit: "issued by a different provider"},
		{name: "other audience", account: "ada", tamper: func(c map[string]any) { c["aud"] = "another-client" },
			status: 403, page: "could not be verified", audit: "audience"},
		{name: "expired", account: "ada", tamper: func(c map[string]any) { c["exp"] = c["iat"].(int64) - 600 },
			status: 403, page: "could not be verified", audit: "expired"},
		{name: "unknown key", account: "ada", signer: other, status: 403, page: "could not be verified", audit: "signature"},
		{name: "provider refuses", account: "mallory", status: 403, page: "did not sign you in: access_denied", audit: "access_denied"},
		{name: "no role", account: "linus", status: 403,
			page:  `Your account linus has no role in this console: none of the values of the claim &#34;groups&#34; (&#34;contractors&#34;)`,
			audit: `no role: claim groups holds "contractors", none mapped`},
		{name: "no claim", account: "nogroups", status: 403, page: "has no role in this console", audit: "absent or empty"},
		{name: "a name in parentheses", account: "system", status: 403, page: "has no usable name (claim preferred_username)", audit: "no usable name"},
		{name: "a users-file name", account: "otto", status: 403, page: "is also a user of the console&#39;s users file", audit: "users-file"},
	}
	for _, c := range cases {
		p.set(func() { p.tamper, p.signer = c.tamper, c.signer })
		before := r.lastAuditID()
		b := r.browser()
		code, page := oidcFlow(t, b, p, c.account, c.mutate)
		if code != c.status || !strings.Contains(page, c.page) {
			t.Errorf("%s: %d; want %d and a page saying %q:\n%s", c.name, code, c.status, c.page, page)
		}
		signedOut(t, b, c.name)
		rows := r.auditSince(before)
		if len(rows) != 1 || rows[0].Action != ops.ActionDenied || !strings.Contains(rows[0].Detail, c.audit) {
			t.Errorf("%s: audit %+v; want one denied row saying %q", c.name, rows, c.audit)
		}
	}
	p.set(func() { p.tamper, p.signer = nil, nil })

	// A callback in a browser that started no sign-in (a login CSRF:
	// another's code and state), and the same attempt twice.
	b := r.browser()
	var stolen *url.URL
	code, _ := oidcFlow(t, b, p, "ada", func(u *url.URL) { c := *u; stolen = &c })
	if code != http.StatusOK {
		t.Fatalf("the victim's own flow: %d", code)
	}
	for _, who := range []*browser{r.browser(), b} {
		code, page := who.get(strings.TrimPrefix(stolen.String(), r.url))
		if code != http.StatusForbidden || !strings.Contains(string(page), "not started in this browser") {
			t.Errorf("a replayed callback: %d; want 403 saying it was not started in this browser:\n%s", code, page)
		}
	}
}

// The client secret never shows: not in the redirect to the provider, not
// on a page, not in the log, also when the token endpoint refuses it.
func TestOIDCSecretNeverShows(t *testing.T) {
	t.Parallel()
	r, p, logs := oidcRig(t)
	var pages []string
	b := r.browser()
	for _, path := range []string{"/login", "/login?next=/audit"} {
		_, page := b.get(path)
		pages = append(pages, string(page))
	}
	_, page := oidcFlow(t, b, p, "ada", nil)
	pages = append(pages, page)
	_, page = oidcFlow(t, r.browser(), p, "linus", nil)
	pages = append(pages, page)
	// The provider no longer knows the console's secret: the exchange
	// fails, logged, and the page says so.
	real := p.secret
	p.set(func() { p.secret = "rotated" })
	code, page := oidcFlow(t, r.browser(), p, "ada", nil)
	if code != http.StatusBadGateway || !strings.Contains(page, "could not be completed") {
		t.Fatalf("a refused exchange: %d; want 502:\n%s", code, page)
	}
	pages = append(pages, page)
	if !strings.Contains(logs.String(), "invalid_client") {
		t.Fatalf("the log does not say why the exchange failed:\n%s", logs)
	}
	var audit strings.Builder
	for _, a := range r.audit() {
		audit.WriteString(a.Detail + "\n")
	}
	for what, text := range map[string]string{"pages": strings.Join(pages, "\n"), "log": logs.String(), "audit": audit.String()} {
		if strings.Contains(text, real) {
			t.Errorf("the client secret is in the %s", what)
		}
	}
}

// NewOIDC fails closed: http on another host than the loopback, no
// client id or secret, a redirect URL elsewhere, no role mapping, an
// unknown role, and an issuer whose discovery fails; each error names the
// field.
func TestOIDCConfigFailsClosed(t *testing.T) {
	t.Parallel()
	p := newProvider(t)
	good := console.OIDCConfig{Issuer: p.url, ClientID: "c", ClientSecret: "s", RedirectURL: "https://console.example" + console.OIDCCallbackPath,
		Roles: map[string]ops.Role{"staff": ops.Viewer}}
	if _, err := console.NewOIDC(t.Context(), &good); err != nil {
		t.Fatalf("a good configuration: %v", err)
	}
	cases := []struct {
		field, want string
		change      func(*console.OIDCConfig)
	}{
		{"Issuer", "http is allowed on the loopback only", func(c *console.OIDCConfig) { c.Issuer = "http://idp.example" }},
		{"Issuer", "discovery at", func(c *console.OIDCConfig) { c.Issuer = p.url + "/nothing-here" }},
		{"ClientID", "empty", func(c *console.OIDCConfig) { c.ClientID = "" }},
		{"ClientSecret", "empty", func(c *console.OIDCConfig) { c.ClientSecret = "" }},
		{"RedirectURL", "the path must be " + console.OIDCCallbackPath, func(c *console.OIDCConfig) { c.RedirectURL = "https://console.example/cb" }},
		{"RedirectURL", "http is allowed on the loopback only", func(c *console.OIDCConfig) { c.RedirectURL = "http://console.example" + console.OIDCCallbackPath }},
		{"Roles", "no mapping", func(c *console.OIDCConfig) { c.Roles = nil }},
		{"Roles", `unknown role "admin"`, func(c *console.OIDCConfig) { c.Roles = map[string]ops.Role{"staff": "admin"} }},
	}
	for _, c := range cases {
		cfg := good
		c.change(&cfg)
		_, err := console.NewOIDC(t.Context(), &cfg)
		var ce *console.OIDCConfigError
		if !errors.As(err, &ce) || ce.Field != c.field || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v; want a one-line error of field %s saying %q", c.field, err, c.field, c.want)
		}
	}
}
