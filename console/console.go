package console

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outbox/internal/confval"
	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
)

//go:embed templates/*.html static/*
var assets embed.FS

//go:embed openapi.json
var openAPI []byte

// OpenAPI returns the OpenAPI document of the JSON API.
func OpenAPI() []byte { return append([]byte(nil), openAPI...) }

// Config configures a Server.
type Config struct {
	// Users may sign in with a password, and call the API with their
	// tokens. Without any, New refuses unless OIDC or Dev is set.
	// Server.SetUsers replaces them while the console runs.
	Users *Users
	// OIDC, when set, signs users in through an OpenID Connect provider
	// (NewOIDC); the sign-in page shows its button. Password sign-in stays
	// for the users of Users, if any; API tokens come from Users only.
	OIDC *OIDC
	// Dev runs the console for development: without users, every browser
	// is signed in as "dev" with the operator role; requests must name a
	// loopback host (localhost, 127.0.0.1, [::1]), which keeps other
	// sites' pages out through DNS rebinding. `outbox console --dev` also
	// listens on the loopback only. Dev with users or with OIDC is
	// refused: a console with accounts is not a development console.
	Dev bool
	// SecureCookies marks the cookies Secure, names the session cookie
	// with the __Host- prefix and sends Strict-Transport-Security. Set it
	// whenever browsers reach the console over HTTPS, directly or through
	// a proxy that terminates TLS.
	SecureCookies bool
	// LoginAttempts failed sign-ins (or bad API tokens) from one address,
	// or for one user name, within LoginWindow block that address or name
	// until the window has passed. Defaults: 5 within 15 minutes.
	LoginAttempts int
	LoginWindow   time.Duration
	// SessionIdle ends a session unused for this long (default 30
	// minutes); SessionMax ends any session this old (default 12 hours).
	SessionIdle, SessionMax time.Duration
	// PageSize is the default page of lists (default 50); ops caps it.
	PageSize int
	// Inbox, when set, is the inbox table whose consumers the Consumers
	// page shows (ops.NewInbox over the same Ops): a viewer sees a
	// consumer's figures and dead letters, an operator retries and
	// discards them, audited like the outbox's. Nil: the page says none is
	// configured.
	Inbox *ops.Inbox
	// Logger defaults to warnings and errors as text on standard error.
	Logger *slog.Logger
}

// Server is the console: an http.Handler.
type Server struct {
	ops    *ops.Ops
	cfg    Config
	dir    atomic.Pointer[directory]
	sess   *sessions
	fails  *limiter
	views  map[string]*template.Template
	static fs.FS
	cop    *http.CrossOriginProtection
	mux    *http.ServeMux
	routes []route
	log    *slog.Logger
	now    func() time.Time
	cookie string
}

// Route is a method and path pattern the Server answers.
type Route struct {
	Method, Pattern string
	// Public routes need no sign-in; API routes answer JSON.
	Public, API bool
	// Permission is what the route needs of a signed-in user's role
	// (none for a public route and for signing out). It is checked before
	// anything the request sends is read: a role without it gets 403 and
	// a denied audit row, whatever the input.
	Permission ops.Permission
}

type route struct {
	Route
	op string // what the route does, for a denied audit row
	h  func(*req)
}

// subject is what a request to rt is about, from its path alone: the
// request of /requests/{id}, else the event {id} names.
func (rt route) subject(r *http.Request) ops.Subject {
	id := r.PathValue("id")
	if id == "" {
		return ops.Subject{}
	}
	if strings.Contains(rt.Pattern, "/requests/{id}") {
		return ops.Subject{Request: id}
	}
	return ops.Subject{Event: id}
}

// New returns a console over o. It fails when there are no users, no
// OIDC and cfg.Dev is not set, and when cfg.Dev is set with users or
// OIDC.
func New(o *ops.Ops, cfg *Config) (*Server, error) {
	if o == nil {
		return nil, errors.New("console: no ops")
	}
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.LoginAttempts == 0 {
		c.LoginAttempts = 5
	}
	if c.LoginWindow == 0 {
		c.LoginWindow = 15 * time.Minute
	}
	if c.SessionIdle == 0 {
		c.SessionIdle = 30 * time.Minute
	}
	if c.SessionMax == 0 {
		c.SessionMax = 12 * time.Hour
	}
	if c.PageSize == 0 {
		c.PageSize = 50
	}
	if c.LoginAttempts < 1 || c.LoginWindow < 0 || c.SessionIdle < 0 || c.SessionMax < 0 || c.PageSize < 1 {
		return nil, errors.New("console: LoginAttempts, LoginWindow, SessionIdle, SessionMax and PageSize must be positive")
	}
	c.PageSize = min(c.PageSize, o.MaxPage())
	if c.Users != nil {
		if err := c.Users.check(); err != nil {
			return nil, fmt.Errorf("console: %w", err)
		}
	}
	dir := newDirectory(c.Users)
	switch {
	case c.Dev && !dir.empty():
		return nil, errors.New("console: dev mode signs everyone in without a password, so it does not take users: drop --dev, or the users")
	case c.Dev && c.OIDC != nil:
		return nil, errors.New("console: dev mode signs everyone in without a password, so it does not take OpenID Connect: drop --dev, or the OIDC flags")
	case dir.empty() && c.OIDC == nil && !c.Dev:
		return nil, errors.New("console: no users, so nobody could sign in: add one with `outbox console user add NAME --role viewer|operator|approver`, configure OpenID Connect, or run with --dev on the loopback")
	}
	s := &Server{ops: o, cfg: c, log: confval.Logger(c.Logger), now: time.Now, cop: http.NewCrossOriginProtection()}
	s.dir.Store(dir)
	s.sess = newSessions(func() time.Time { return s.now() }, c.SessionIdle, c.SessionMax)
	s.fails = newLimiter(func() time.Time { return s.now() }, c.LoginAttempts, c.LoginWindow)
	s.cookie = "outbox_session"
	if c.SecureCookies {
		s.cookie = "__Host-outbox_session"
	}
	var err error
	if s.views, err = parseViews(); err != nil {
		return nil, err
	}
	if s.static, err = fs.Sub(assets, "static"); err != nil {
		return nil, err
	}
	s.routes = s.routeTable()
	s.mux = http.NewServeMux()
	for _, rt := range s.routes {
		s.mux.HandleFunc(rt.Method+" "+rt.Pattern, s.wrap(rt))
	}
	s.mux.HandleFunc("/", s.wrap(route{Route: Route{Public: true}, h: func(q *req) {
		q.api = strings.HasPrefix(q.r.URL.Path, "/api/")
		q.fail(http.StatusNotFound, "no such page")
	}}))
	return s, nil
}

// SetUsers replaces the users: new sign-ins and API tokens are checked
// against u at once, and a session signed in with a password follows u at
// its next request (it ends when its user is gone, takes a changed role).
// A u that does not check is refused and the users stay as they were.
func (s *Server) SetUsers(u *Users) error {
	if u == nil {
		u = &Users{}
	}
	if err := u.check(); err != nil {
		return fmt.Errorf("console: %w", err)
	}
	dir := newDirectory(u)
	if s.cfg.Dev && !dir.empty() {
		return errors.New("console: dev mode does not take users")
	}
	s.dir.Store(dir)
	return nil
}

// directory is the users now.
func (s *Server) directory() *directory { return s.dir.Load() }

// Routes lists what the Server answers.
func (s *Server) Routes() []Route {
	out := make([]Route, len(s.routes))
	for i, r := range s.routes {
		out[i] = r.Route
	}
	return out
}

// ServeHTTP answers one request. Every response, the mux's own included,
// carries the security headers.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	nonce := randomString(18)
	s.headers(w, nonce)
	s.mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), nonceKey{}, nonce)))
}

type nonceKey struct{}

// routeMaker makes a route; a GET route needs the read permission.
type routeMaker func(method, pattern string, h func(*req)) route

// needs is r needing permission p to do op.
func needs(p ops.Permission, op string, r route) route {
	r.Permission, r.op = p, op
	return r
}

func (s *Server) routeTable() []route {
	var html, api routeMaker
	html = func(method, pattern string, h func(*req)) route {
		r := route{Route: Route{Method: method, Pattern: pattern}, h: h}
		if method == http.MethodGet {
			r.Permission, r.op = ops.Read, "view "+pattern
		}
		return r
	}
	api = func(method, pattern string, h func(*req)) route {
		r := html(method, pattern, h)
		r.API = true
		return r
	}
	public := func(r route) route { r.Public, r.Permission, r.op = true, "", ""; return r }
	return append([]route{
		public(html("GET", "/login", s.loginPage)),
		public(html("POST", "/login", s.login)),
		public(html("GET", "/static/{file}", s.staticFile)),
		html("POST", "/logout", s.logout),
		html("GET", "/{$}", s.overviewPage),
		html("GET", "/dead-letters", s.deadLettersPage),
		html("GET", "/dead-letters/{id}", s.deadLetterPage),
		needs(ops.Act, opRetry, html("POST", "/dead-letters/{id}/retry", s.actPage("retry"))),
		needs(ops.Act, opDiscard, html("POST", "/dead-letters/{id}/discard", s.actPage("discard"))),
		html("GET", "/audit", s.auditPage),
		public(api("GET", "/api/v1/openapi.json", s.openAPI)),
		api("GET", "/api/v1/overview", s.overviewAPI),
		api("GET", "/api/v1/dead-letters", s.deadLettersAPI),
		api("GET", "/api/v1/dead-letters/{id}", s.deadLetterAPI),
		needs(ops.Act, opRetry, api("POST", "/api/v1/dead-letters/{id}/retry", s.actAPI("retry"))),
		needs(ops.Act, opDiscard, api("POST", "/api/v1/dead-letters/{id}/discard", s.actAPI("discard"))),
		api("GET", "/api/v1/audit", s.auditAPI),
		// Pauses and held aggregates (control.go).
		html("GET", "/pauses", s.pausesPage),
		needs(ops.Act, "pause", html("POST", "/pauses", s.pausePage)),
		needs(ops.Act, "resume", html("POST", "/pauses/{scope}/resume", s.resumePage)),
		html("GET", "/held", s.heldPage),
		needs(ops.Act, opRelease, html("POST", "/held/{id}/release", s.releasePage)),
		api("GET", "/api/v1/pauses", s.pausesAPI),
		needs(ops.Act, "pause", api("POST", "/api/v1/pauses/{scope}/pause", s.pauseAPI(true))),
		needs(ops.Act, "resume", api("POST", "/api/v1/pauses/{scope}/resume", s.pauseAPI(false))),
		api("GET", "/api/v1/held", s.heldAPI),
		needs(ops.Act, opRelease, api("POST", "/api/v1/held/{id}/release", s.releaseAPI)),
		needs(ops.Act, opReveal, html("POST", "/dead-letters/{id}/reveal", s.revealPage)),
		needs(ops.Act, opReveal, api("POST", "/api/v1/dead-letters/{id}/reveal", s.revealAPI)),
		html("GET", "/failure-groups", s.failureGroupsPage),
		needs(ops.Act, opGroupRetry, html("POST", "/failure-groups/{group}/retry", s.groupActPage("retry"))),
		needs(ops.Act, opGroupDiscard, html("POST", "/failure-groups/{group}/discard", s.groupActPage("discard"))),
		api("GET", "/api/v1/failure-groups", s.failureGroupsAPI),
		needs(ops.Act, opGroupRetry, api("POST", "/api/v1/failure-groups/{group}/retry", s.groupActAPI("retry"))),
		needs(ops.Act, opGroupDiscard, api("POST", "/api/v1/failure-groups/{group}/discard", s.groupActAPI("discard"))),
	}, append(append(s.requestRoutes(html, api), s.oidcRoutes(html, public)...), s.consumerRoutes(html)...)...)
}

// What the routes do, as a denied audit row says it (the words of ops).
const (
	opRetry        = "retry dead letters"
	opDiscard      = "discard dead letters"
	opRelease      = "release a held aggregate"
	opReveal       = "reveal a masked payload field"
	opGroupRetry   = "retry a failure group"
	opGroupDiscard = "discard a failure group"
)

// req is one request being answered.
type req struct {
	s     *Server
	w     http.ResponseWriter
	r     *http.Request
	api   bool
	nonce string
	sess  *session // nil for an API token
	actor ops.Actor
}

func (q *req) ctx() context.Context { return q.r.Context() }

// maxBody bounds what a request may send.
const maxBody = 64 << 10

func (s *Server) wrap(rt route) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		nonce, _ := r.Context().Value(nonceKey{}).(string)
		if nonce == "" { // called without ServeHTTP
			nonce = randomString(18)
			s.headers(w, nonce)
		}
		q := &req{s: s, w: w, r: r, api: rt.API, nonce: nonce}
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		if s.cfg.Dev && !loopbackHost(r.Host) {
			q.fail(http.StatusMisdirectedRequest, "in dev mode the console answers only requests to localhost, 127.0.0.1 or [::1]")
			return
		}
		what := r.Method + " " + r.URL.Path
		if !safeMethod(r.Method) {
			if err := s.cop.Check(r); err != nil {
				s.ops.Refused(q.ctx(), s.claimant(r), what, "cross-origin request from "+clientIP(r), rt.subject(r))
				q.fail(http.StatusForbidden, "cross-origin request refused")
				return
			}
		}
		if !rt.Public {
			if !s.authenticate(q) {
				return
			}
			if !safeMethod(r.Method) && q.sess != nil {
				tok := r.Header.Get("X-CSRF-Token")
				if tok == "" && !rt.API {
					tok = r.PostFormValue("csrf")
				}
				if !sameToken(tok, q.sess.csrf) {
					s.ops.Refused(q.ctx(), q.actor, what, "missing or wrong CSRF token", rt.subject(r))
					q.fail(http.StatusForbidden, "missing or wrong CSRF token: reload the page and try again")
					return
				}
			}
			// The role first: a role that may not do it learns nothing
			// from the errors of its input.
			if rt.Permission != "" {
				if err := s.ops.Allow(q.ctx(), q.actor, rt.op, rt.Permission, rt.subject(r)); err != nil {
					q.failErr(err)
					return
				}
			}
		}
		rt.h(q)
	}
}

// claimant is who a request says it comes from, for the audit of a
// refusal that happens before it is authenticated: the user of its
// session or API token, or "(anonymous)". It neither starts nor refreshes
// a session.
func (s *Server) claimant(r *http.Request) ops.Actor {
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		if u := s.directory().token(strings.TrimSpace(tok)); u != nil {
			return u.Actor()
		}
	}
	if c, err := r.Cookie(s.cookie); err == nil {
		if x := s.sess.peek(c.Value); x != nil {
			return x.actor
		}
	}
	return ops.Actor{Name: "(anonymous)"}
}

// authenticate finds who sends q: an API token, a session cookie, or (dev
// mode without users) a new dev session. It answers the request itself
// and returns false when nobody is signed in.
func (s *Server) authenticate(q *req) bool {
	r := q.r
	ip := clientIP(r)
	if h := r.Header.Get("Authorization"); h != "" {
		if wait := s.fails.blockedFor("ip:" + ip); wait > 0 {
			q.tooMany(wait, "too many failed attempts from your address")
			return false
		}
		tok, ok := strings.CutPrefix(h, "Bearer ")
		var u *User
		if ok {
			u = s.directory().token(strings.TrimSpace(tok))
		}
		if u == nil {
			why := "unknown API token from " + ip
			if s.fails.fail("ip:" + ip) {
				why += "; this address is blocked for " + roundDuration(s.fails.blockedFor("ip:"+ip))
			}
			s.ops.Refused(q.ctx(), ops.Actor{Name: "(bad token)"}, r.Method+" "+r.URL.Path, why, ops.Subject{})
			q.w.Header().Set("WWW-Authenticate", `Bearer realm="outbox"`)
			q.fail(http.StatusUnauthorized, "unknown API token")
			return false
		}
		q.actor = u.Actor()
		return true
	}
	if c, err := r.Cookie(s.cookie); err == nil {
		if x := s.sess.get(c.Value); x != nil && s.current(x) {
			q.sess, q.actor = x, x.actor
			return true
		}
	}
	if s.cfg.Dev && s.directory().empty() && r.Method == http.MethodGet && !q.api {
		x := s.sess.create(ops.Actor{Name: "dev", Role: ops.Operator})
		s.setSession(q.w, x)
		q.sess, q.actor = x, x.actor
		return true
	}
	if q.api {
		q.w.Header().Set("WWW-Authenticate", `Bearer realm="outbox"`)
		q.fail(http.StatusUnauthorized, "sign in: send Authorization: Bearer <token>")
		return false
	}
	if r.Method == http.MethodGet {
		http.Redirect(q.w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
		return false
	}
	q.fail(http.StatusUnauthorized, "your session ended: sign in again")
	return false
}

// current brings a session signed in with a password up to date with the
// users file: false (and the session ends) when its user is gone; a
// changed role is taken.
func (s *Server) current(x *session) bool {
	if !x.password {
		return true
	}
	u := s.directory().byName[x.actor.Name]
	if u == nil {
		s.sess.delete(x.id)
		s.log.Info("console: session ended: its user is no longer in the users file", "user", x.actor.Name)
		return false
	}
	if u.Role != x.actor.Role {
		s.sess.setRole(x.id, u.Role)
		x.actor.Role = u.Role
	}
	return true
}

func (s *Server) setSession(w http.ResponseWriter, x *session) {
	http.SetCookie(w, &http.Cookie{Name: s.cookie, Value: x.id, Path: "/", HttpOnly: true, Secure: s.cfg.SecureCookies,
		SameSite: http.SameSiteStrictMode, MaxAge: int(s.cfg.SessionMax.Seconds())})
}

// CSP returns the Content-Security-Policy of a response with nonce.
func CSP(nonce string) string {
	return "default-src 'none'; script-src 'nonce-" + nonce + "'; style-src 'nonce-" + nonce + "'; img-src 'self'; " +
		"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
}

func (s *Server) headers(w http.ResponseWriter, nonce string) {
	h := w.Header()
	h.Set("Content-Security-Policy", CSP(nonce))
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Permissions-Policy", "camera=(), microphone=(), geolocation=(), payment=(), usb=()")
	h.Set("Cache-Control", "no-store")
	if s.cfg.SecureCookies {
		h.Set("Strict-Transport-Security", "max-age=63072000")
	}
}

func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// clientIP is the address the request came from (a proxy's, behind one).
func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// loopbackHost reports whether a Host header names the loopback.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// LoopbackAddr reports whether a listen address (host:port) is on the
// loopback only.
func LoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return false
	}
	return loopbackHost(host)
}

// fail answers q with status and a message: a page, or JSON for the API.
func (q *req) fail(status int, msg string) {
	if q.api {
		q.json(status, map[string]any{"error": map[string]any{"status": status, "message": msg}})
		return
	}
	q.render(status, "error", "Error", struct {
		Status  int
		Text    string
		Message string
	}{status, http.StatusText(status), msg})
}

// tooMany answers a client blocked for wait after too many failed
// sign-ins: 429 with Retry-After, saying how long (msg says why).
func (q *req) tooMany(wait time.Duration, msg string) {
	secs := retryAfter(q.w, wait)
	msg += ": try again in " + waitText(wait)
	if q.api {
		q.json(http.StatusTooManyRequests, map[string]any{"error": map[string]any{"status": http.StatusTooManyRequests, "message": msg, "retry_after_seconds": secs}})
		return
	}
	q.fail(http.StatusTooManyRequests, msg)
}

// retryAfter sets the Retry-After header of a client blocked for wait and
// returns its seconds (rounded up).
func retryAfter(w http.ResponseWriter, wait time.Duration) int64 {
	secs := int64((wait + time.Second - 1) / time.Second)
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	return secs
}

// waitText says how long wait is, rounded up: "14 minutes", "40 seconds".
func waitText(wait time.Duration) string {
	unit, n := "second", int64((wait+time.Second-1)/time.Second)
	if wait > time.Minute {
		unit, n = "minute", int64((wait+time.Minute-1)/time.Minute)
	}
	if n != 1 {
		unit += "s"
	}
	return strconv.FormatInt(n, 10) + " " + unit
}

// failErr answers q with the status err calls for.
func (q *req) failErr(err error) {
	var denied *ops.DeniedError
	var input *ops.InputError
	if q.requestErr(err) {
		return
	}
	switch {
	case errors.As(err, &denied):
		q.fail(http.StatusForbidden, fmt.Sprintf("your role (%s) may not %s", denied.Actor.Role, denied.Operation))
	case errors.As(err, &input):
		q.fail(http.StatusBadRequest, input.Error())
	case errors.Is(err, outboxdriver.ErrNotFound):
		q.fail(http.StatusNotFound, notFoundText(err))
	case errors.Is(err, outboxdriver.ErrNotMigrated):
		q.fail(http.StatusServiceUnavailable, "the outbox table does not exist: run `outbox migrate`")
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		q.fail(http.StatusServiceUnavailable, "the database did not answer in time")
	default:
		q.s.log.Error("console: request failed", "method", q.r.Method, "path", q.r.URL.Path, "err", err)
		q.fail(http.StatusServiceUnavailable, "the database could not answer; the console's log says why")
	}
}

func (q *req) json(status int, v any) {
	q.w.Header().Set("Content-Type", "application/json; charset=utf-8")
	q.w.WriteHeader(status)
	enc := json.NewEncoder(q.w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		q.s.log.Debug("console: write response", "err", err)
	}
}

// formValue reads a form field of a POST (bounded by maxBody).
func (q *req) formValue(name string) string { return q.r.PostFormValue(name) }

func (s *Server) staticFile(q *req) {
	name := q.r.PathValue("file")
	b, err := fs.ReadFile(s.static, name)
	if err != nil || strings.Contains(name, "/") {
		q.fail(http.StatusNotFound, "no such file")
		return
	}
	ct := map[string]string{".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}[path.Ext(name)]
	if ct == "" {
		ct = "application/octet-stream"
	}
	q.w.Header().Set("Content-Type", ct)
	q.w.Header().Set("Cache-Control", "private, max-age=300")
	_, _ = q.w.Write(b)
}

func (s *Server) openAPI(q *req) {
	q.w.Header().Set("Content-Type", "application/json; charset=utf-8")
	_, _ = q.w.Write(openAPI)
}
