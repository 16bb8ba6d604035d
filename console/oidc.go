package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"github.com/outboxkit/outbox/ops"
)

// OIDCCallbackPath is the path of the console's redirect URL: the
// provider sends the browser back there with the authorization code.
const OIDCCallbackPath = "/login/oidc/callback"

// OIDCConfig configures sign-in through an OpenID Connect provider: the
// authorization code flow with PKCE (S256), a state and a nonce per
// attempt bound to the browser, the ID token verified (signature, issuer,
// audience, expiry, nonce) and its claims mapped to a role.
type OIDCConfig struct {
	// Issuer is the provider's issuer URL: https, or http on the loopback.
	Issuer string
	// ClientID and ClientSecret are the console's credentials at the
	// provider. The secret is sent to the token endpoint only.
	ClientID, ClientSecret string
	// RedirectURL is the console's callback as the provider knows it:
	// scheme, host and port browsers reach the console at, and the path
	// OIDCCallbackPath.
	RedirectURL string
	// RolesClaim names the ID token's claim read for the role, a string
	// or a list of strings (default "groups").
	RolesClaim string
	// NameClaim names the claim the user's name comes from (default
	// preferred_username, then email, then sub: the first present).
	NameClaim string
	// Roles maps a value of the roles claim to a role. A user whose claim
	// holds several mapped values gets the highest of their roles, in the
	// order of ops.Roles (viewer, operator, approver); a user whose claim
	// holds none is refused.
	Roles map[string]ops.Role
	// Client talks to the provider (nil: one with a 30-second timeout).
	Client *http.Client
}

// OIDCConfigError is a field of an OIDCConfig that cannot be used.
type OIDCConfigError struct {
	// Field is the OIDCConfig field's name: Issuer, ClientID,
	// ClientSecret, RedirectURL, RolesClaim, NameClaim or Roles.
	Field string
	Err   error
}

func (e *OIDCConfigError) Error() string { return "OIDC " + e.Field + ": " + e.Err.Error() }
func (e *OIDCConfigError) Unwrap() error { return e.Err }

// OIDC is a provider the console signs users in through, made by
// NewOIDC; set it as Config.OIDC.
type OIDC struct {
	cfg      OIDCConfig
	host     string // the issuer's host, for the sign-in button
	oauth    oauth2.Config
	verifier *oidc.IDTokenVerifier
	pending  *attempts
}

// NewOIDC checks c and reads the provider's discovery document. It fails
// closed: an issuer that is not https (but on the loopback), a missing
// credential, a redirect URL elsewhere than OIDCCallbackPath, no role
// mapping or one to an unknown role, or a discovery that fails.
func NewOIDC(ctx context.Context, c *OIDCConfig) (*OIDC, error) {
	if c == nil {
		return nil, errors.New("console: no OIDC configuration")
	}
	cfg := *c
	if cfg.RolesClaim == "" {
		cfg.RolesClaim = "groups"
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: 30 * time.Second}
	}
	bad := func(field, format string, a ...any) error {
		return &OIDCConfigError{Field: field, Err: fmt.Errorf(format, a...)}
	}
	iss, err := webURL(cfg.Issuer)
	if err != nil {
		return nil, &OIDCConfigError{Field: "Issuer", Err: err}
	}
	if cfg.ClientID == "" {
		return nil, bad("ClientID", "empty: give the client id the provider registered for the console")
	}
	if cfg.ClientSecret == "" {
		return nil, bad("ClientSecret", "empty: give the client secret the provider issued for the console")
	}
	ru, err := webURL(cfg.RedirectURL)
	if err != nil {
		return nil, &OIDCConfigError{Field: "RedirectURL", Err: err}
	}
	if ru.Path != OIDCCallbackPath || ru.RawQuery != "" || ru.Fragment != "" {
		return nil, bad("RedirectURL", "%s: the path must be %s, with no query", cfg.RedirectURL, OIDCCallbackPath)
	}
	if strings.TrimSpace(cfg.RolesClaim) != cfg.RolesClaim || strings.TrimSpace(cfg.NameClaim) != cfg.NameClaim {
		return nil, bad("RolesClaim", "a claim's name has no spaces around it")
	}
	if len(cfg.Roles) == 0 {
		return nil, bad("Roles", "no mapping of a %s value to a role, so nobody could sign in: map at least one", cfg.RolesClaim)
	}
	roles := make(map[string]ops.Role, len(cfg.Roles))
	for v, r := range cfg.Roles {
		if v == "" {
			return nil, bad("Roles", "an empty claim value is mapped to %s", r)
		}
		if _, err := ops.ParseRole(string(r)); err != nil {
			return nil, bad("Roles", "%s=%s: %v", v, r, err)
		}
		roles[v] = r
	}
	cfg.Roles = roles
	p, err := oidc.NewProvider(oidc.ClientContext(ctx, cfg.Client), cfg.Issuer)
	if err != nil {
		return nil, bad("Issuer", "discovery at %s/.well-known/openid-configuration failed: %s", strings.TrimSuffix(cfg.Issuer, "/"), oneLine(err.Error(), 300))
	}
	var meta struct {
		PKCE []string `json:"code_challenge_methods_supported"`
	}
	if err := p.Claims(&meta); err == nil && len(meta.PKCE) > 0 && !slices.Contains(meta.PKCE, "S256") {
		return nil, bad("Issuer", "the provider does not support PKCE with S256 (it lists %v)", meta.PKCE)
	}
	o := &OIDC{
		cfg:  cfg,
		host: iss.Host,
		oauth: oauth2.Config{ClientID: cfg.ClientID, ClientSecret: cfg.ClientSecret, Endpoint: p.Endpoint(),
			RedirectURL: cfg.RedirectURL, Scopes: []string{oidc.ScopeOpenID, "profile", "email"}},
		verifier: p.VerifierContext(oidc.ClientContext(context.WithoutCancel(ctx), cfg.Client), &oidc.Config{ClientID: cfg.ClientID}),
		pending:  &attempts{m: map[string]*attempt{}, max: 10000},
	}
	return o, nil
}

// webURL reads an absolute https URL, or an http one on the loopback.
func webURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return nil, fmt.Errorf("%q is not an absolute http(s) URL", s)
	}
	if u.Scheme == "http" && !loopbackHost(u.Host) {
		return nil, fmt.Errorf("%s: http is allowed on the loopback only; use https", s)
	}
	if u.User != nil {
		return nil, fmt.Errorf("%s: no user or password in the URL", u.Redacted())
	}
	return u, nil
}

// Host is the issuer's host, as the sign-in button names it.
func (o *OIDC) Host() string { return o.host }

// attemptTTL is how long a sign-in may stay at the provider.
const attemptTTL = 10 * time.Minute

// attempt is a sign-in sent to the provider: what its callback must
// match. The browser holds its key in a cookie.
type attempt struct {
	state, nonce, verifier, next string
	expires                      time.Time
}

// attempts are the sign-ins under way, each usable once.
type attempts struct {
	mu  sync.Mutex
	m   map[string]*attempt
	max int
}

func (a *attempts) add(x *attempt, now time.Time) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.m) >= a.max {
		for k, v := range a.m {
			if now.After(v.expires) {
				delete(a.m, k)
			}
		}
	}
	for k := range a.m { // still full: one goes
		if len(a.m) < a.max {
			break
		}
		delete(a.m, k)
	}
	key := randomString(32)
	a.m[key] = x
	return key
}

// take removes and returns the live attempt key names (nil: none).
func (a *attempts) take(key string, now time.Time) *attempt {
	a.mu.Lock()
	defer a.mu.Unlock()
	x := a.m[key]
	delete(a.m, key)
	if x == nil || now.After(x.expires) {
		return nil
	}
	return x
}

// oidcRoutes are the routes of a sign-in through the provider: none
// without one. Both are public: they are how a user signs in.
func (s *Server) oidcRoutes(html routeMaker, public func(route) route) []route {
	if s.cfg.OIDC == nil {
		return nil
	}
	return []route{
		public(html("GET", "/login/oidc", s.oidcStart)),
		public(html("GET", OIDCCallbackPath, s.oidcCallback)),
	}
}

// oidcCookie is the cookie that binds an attempt to the browser. It is
// SameSite=Lax: the provider's redirect back is a cross-site navigation.
func (s *Server) oidcCookie() string {
	if s.cfg.SecureCookies {
		return "__Secure-outbox_oidc"
	}
	return "outbox_oidc"
}

// oidcStart sends the browser to the provider with a fresh state, nonce
// and PKCE verifier, bound to it by a short-lived cookie.
func (s *Server) oidcStart(q *req) {
	o := s.cfg.OIDC
	x := &attempt{state: randomString(32), nonce: randomString(32), verifier: oauth2.GenerateVerifier(),
		next: safeNext(q.r.URL.Query().Get("next")), expires: s.now().Add(attemptTTL)}
	key := o.pending.add(x, s.now())
	http.SetCookie(q.w, &http.Cookie{Name: s.oidcCookie(), Value: key, Path: "/login/oidc", HttpOnly: true, Secure: s.cfg.SecureCookies,
		SameSite: http.SameSiteLaxMode, MaxAge: int(attemptTTL.Seconds())})
	http.Redirect(q.w, q.r, o.oauth.AuthCodeURL(x.state, oidc.Nonce(x.nonce), oauth2.S256ChallengeOption(x.verifier)), http.StatusSeeOther)
}

// oidcRefusal is a sign-in through the provider that was refused: the
// page's status and message, and the audit row's detail.
type oidcRefusal struct {
	status       int
	page, detail string
	who          string // the user, when known
}

func (e *oidcRefusal) Error() string { return e.detail }

// oidcCallback finishes a sign-in: the attempt this browser started, its
// state, the code exchanged with the PKCE verifier, the ID token verified
// with its nonce, and the role its claims map to. Anything else ends on a
// page that says why, with no session, and a denied audit row.
func (s *Server) oidcCallback(q *req) {
	ip := clientIP(q.r)
	a, next, err := s.oidcFinish(q)
	var refused *oidcRefusal
	if errors.As(err, &refused) {
		who := refused.who
		if who == "" {
			who = "(anonymous)"
		}
		s.ops.Refused(q.ctx(), ops.Actor{Name: who}, "sign in through "+s.cfg.OIDC.host, refused.detail+" (from "+ip+")", ops.Subject{})
		q.fail(refused.status, refused.page)
		return
	}
	if err != nil { // the provider could not be reached or answered nonsense
		s.log.Error("console: OpenID Connect sign-in failed", "issuer", s.cfg.OIDC.cfg.Issuer, "err", err)
		s.ops.Refused(q.ctx(), ops.Actor{Name: "(anonymous)"}, "sign in through "+s.cfg.OIDC.host, "the provider's answer could not be used (from "+ip+"); the console's log says why", ops.Subject{})
		q.fail(http.StatusBadGateway, "The sign-in through "+s.cfg.OIDC.host+" could not be completed; the console's log says why. Please try again.")
		return
	}
	x := s.sess.create(a)
	s.setSession(q.w, x)
	s.record(q, a, ops.ActionLogin, "through "+s.cfg.OIDC.host+" from "+ip)
	// A page, not a redirect: the session cookie is SameSite=Strict, and
	// a browser does not send it on a redirect chain that began at the
	// provider's site. Going on from this page is a same-site navigation.
	q.actor, q.sess = a, x
	q.render(http.StatusOK, "signed_in", "Signed in", struct{ Next string }{next})
}

// oidcFinish is the checks of oidcCallback: the actor signed in and where
// to go, or an *oidcRefusal, or another error (the provider failed).
func (s *Server) oidcFinish(q *req) (ops.Actor, string, error) {
	o := s.cfg.OIDC
	r := q.r
	refuse := func(status int, page, detail string) (ops.Actor, string, error) {
		return ops.Actor{}, "", &oidcRefusal{status: status, page: page, detail: detail}
	}
	// The attempt is used up whatever happens next.
	http.SetCookie(q.w, &http.Cookie{Name: s.oidcCookie(), Path: "/login/oidc", MaxAge: -1, HttpOnly: true, Secure: s.cfg.SecureCookies, SameSite: http.SameSiteLaxMode})
	c, err := r.Cookie(s.oidcCookie())
	var x *attempt
	if err == nil {
		x = o.pending.take(c.Value, s.now())
	}
	if x == nil {
		return refuse(http.StatusForbidden, "This sign-in was not started in this browser, or it expired. Please sign in again.",
			"no sign-in under way in this browser (missing, used or expired attempt cookie)")
	}
	if !sameToken(r.URL.Query().Get("state"), x.state) {
		return refuse(http.StatusForbidden, "This sign-in does not match the one this browser started. Please sign in again.",
			"the state the provider sent back is not this browser's")
	}
	if e := r.URL.Query().Get("error"); e != "" {
		return refuse(http.StatusForbidden, s.cfg.OIDC.host+" did not sign you in: "+oneLine(e+" "+r.URL.Query().Get("error_description"), 200),
			"the provider answered "+oneLine(e, 64))
	}
	code := r.URL.Query().Get("code")
	if code == "" {
		return refuse(http.StatusBadRequest, "The provider sent no authorization code. Please sign in again.", "no authorization code")
	}
	ctx, cancel := context.WithTimeout(oidc.ClientContext(q.ctx(), o.cfg.Client), 30*time.Second)
	defer cancel()
	tok, err := o.oauth.Exchange(ctx, code, oauth2.VerifierOption(x.verifier))
	if err != nil {
		return ops.Actor{}, "", fmt.Errorf("code exchange: %w", err)
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		return ops.Actor{}, "", errors.New("the token response has no id_token")
	}
	idt, err := o.verifier.Verify(ctx, raw)
	if err != nil {
		return refuse(http.StatusForbidden, "The identity "+o.host+" sent could not be verified. Please sign in again.",
			"ID token refused: "+oneLine(err.Error(), 200))
	}
	if !sameToken(idt.Nonce, x.nonce) {
		return refuse(http.StatusForbidden, "The identity "+o.host+" sent was not issued for this sign-in. Please sign in again.",
			"ID token refused: its nonce is not this sign-in's")
	}
	var claims map[string]any
	if err := idt.Claims(&claims); err != nil {
		return ops.Actor{}, "", fmt.Errorf("ID token claims: %w", err)
	}
	name, nameClaim := o.name(claims)
	if name == "" {
		return refuse(http.StatusForbidden, "The identity "+o.host+" sent has no usable name (claim "+nameClaim+"): a name is 1 to 128 printable characters, starting with a letter or digit.",
			"no usable name in claim "+nameClaim)
	}
	fail := func(page, detail string) (ops.Actor, string, error) {
		return ops.Actor{}, "", &oidcRefusal{status: http.StatusForbidden, page: page, detail: detail, who: name}
	}
	if s.directory().byName[name] != nil {
		return fail("The name "+name+" is also a user of the console's users file, so the two could not be told apart in the audit: ask the administrator to rename one.",
			"the name (claim "+nameClaim+") is also a users-file user's")
	}
	role, values := o.role(claims)
	if role == "" {
		return fail(fmt.Sprintf("Your account %s has no role in this console: none of the values of the claim %q (%s) is mapped to a role. Ask the administrator.",
			name, o.cfg.RolesClaim, claimValues(values)),
			fmt.Sprintf("no role: claim %s holds %s, none mapped", o.cfg.RolesClaim, claimValues(values)))
	}
	return ops.Actor{Name: name, Role: role}, x.next, nil
}

// name is the user's name from the claims, and the claim it was read
// from (or, when none is usable, the claims looked for).
func (o *OIDC) name(claims map[string]any) (string, string) {
	names := []string{"preferred_username", "email", "sub"}
	if o.cfg.NameClaim != "" {
		names = []string{o.cfg.NameClaim}
	}
	for _, c := range names {
		if v, ok := claims[c].(string); ok && v != "" {
			if !usableName(v) {
				return "", c
			}
			return v, c
		}
	}
	return "", strings.Join(names, ", ")
}

// usableName is a name the audit can show on one line, starting with a
// letter or digit: never one of the names in parentheses the console and
// the executor write ("(anonymous)", "(outbox)").
func usableName(s string) bool {
	if len(s) > 128 || !utf8.ValidString(s) || strings.TrimSpace(s) != s {
		return false
	}
	if first, _ := utf8.DecodeRuneInString(s); !unicode.IsLetter(first) && !unicode.IsDigit(first) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

// role is the highest role the roles claim maps to ("" for none), and
// the claim's values.
func (o *OIDC) role(claims map[string]any) (ops.Role, []string) {
	var values []string
	switch v := claims[o.cfg.RolesClaim].(type) {
	case string:
		values = []string{v}
	case []any:
		for _, x := range v {
			if s, ok := x.(string); ok {
				values = append(values, s)
			}
		}
	}
	best := -1
	for _, v := range values {
		if r, ok := o.cfg.Roles[v]; ok {
			best = max(best, slices.Index(ops.Roles(), r))
		}
	}
	if best < 0 {
		return "", values
	}
	return ops.Roles()[best], values
}

// claimValues shows the values of a claim, a few at most.
func claimValues(v []string) string {
	if len(v) == 0 {
		return "absent or empty"
	}
	shown := v
	if len(shown) > 10 {
		shown = shown[:10]
	}
	q := make([]string, len(shown))
	for i, x := range shown {
		q[i] = fmt.Sprintf("%q", oneLine(x, 64))
	}
	out := strings.Join(q, ", ")
	if len(v) > len(shown) {
		out += fmt.Sprintf(" and %d more", len(v)-len(shown))
	}
	return out
}
