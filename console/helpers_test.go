package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/crypto/bcrypt"

	"github.com/outboxkit/outbox/console"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/inboxpgx"
	"github.com/outboxkit/outbox/inbox/inboxsql"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
)

// A user of the test console: name, role, password and API token.
type testUser struct {
	name, password, token string
	role                  ops.Role
}

// rig is a console over a fresh table on one of the test databases
// (PostgreSQL, MariaDB, SQLite), served on the loopback, with one user per
// role.
type rig struct {
	t   *testing.T
	ctx context.Context
	db  string // postgres, mysql or sqlite
	// pool is PostgreSQL's (nil on the others).
	pool  *pgxpool.Pool
	fx    fixtures
	tb    outboxdriver.Table
	st    consoleStore
	srv   *console.Server
	op    *ops.Ops
	url   string
	users map[ops.Role]testUser
	// accounts is the users file's content (nil without users).
	accounts *console.Users
	// inboxDL records a dead letter of dl.Consumer in the rig's inbox
	// table (the Consumers page's, migrated beside the outbox).
	inboxDL func(dl inbox.DeadLetter) error
	ib      *ops.Inbox
}

type rigOptions struct {
	cfg     console.Config
	users   bool                         // false: no users (dev mode tests)
	migrate *outboxdriver.MigrateOptions // how the table is made (nil: the defaults)
	// oidc, when set, is the console's OpenID Connect provider, made for
	// the console's URL.
	oidc func(consoleURL string) *console.OIDC
	// localhost: the console's URL names localhost rather than 127.0.0.1
	// (another site than a provider on 127.0.0.1).
	localhost bool
}

// newRig is a rig on PostgreSQL.
func newRig(t *testing.T, o *rigOptions) *rig { return newRigOn(t, "postgres", o) }

// newRigOn is a rig on database db.
func newRigOn(t *testing.T, db string, o *rigOptions) *rig {
	t.Helper()
	if o == nil {
		o = &rigOptions{users: true}
	}
	ctx := testenv.Context(t, 2*time.Minute)
	st, tb, fx, pool := openDB(t, ctx, db)
	if _, err := st.Migrate(ctx, tb, o.migrate); err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, ctx: ctx, db: db, pool: pool, fx: fx, tb: tb, st: st, users: map[ops.Role]testUser{}}
	cfg := o.cfg
	if o.users {
		u := &console.Users{Cost: bcrypt.MinCost}
		for _, x := range []testUser{{name: "vera", role: ops.Viewer}, {name: "otto", role: ops.Operator}, {name: "anna", role: ops.Approver}} {
			x.password = "password-of-" + x.name
			tok, err := u.Add(x.name, x.role, x.password)
			if err != nil {
				t.Fatal(err)
			}
			x.token = tok
			r.users[x.role] = x
		}
		cfg.Users, r.accounts = u, u
	}
	op, err := ops.New(st, tb, &ops.Config{SensitivePaths: []string{"customer.email"}})
	if err != nil {
		t.Fatal(err)
	}
	r.op = op
	if cfg.Inbox == nil {
		cfg.Inbox = r.migrateInbox(op)
	}
	// The listener first: an OIDC redirect URL names the console's port.
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) { r.srv.ServeHTTP(w, req) }))
	t.Cleanup(hs.Close)
	r.url = "http://" + hs.Listener.Addr().String()
	if o.localhost {
		r.url = "http://localhost:" + strconv.Itoa(hs.Listener.Addr().(*net.TCPAddr).Port)
	}
	if o.oidc != nil {
		cfg.OIDC = o.oidc(r.url)
	}
	r.srv, err = console.New(op, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs.Start()
	return r
}

// migrateInbox migrates an inbox table "inbox" beside the outbox table and
// returns the operations on it.
func (r *rig) migrateInbox(op *ops.Ops) *ops.Inbox {
	r.t.Helper()
	it := outboxdriver.Table{Schema: r.tb.Schema, Name: "inbox"}
	var adm inbox.Admin
	switch r.db {
	case "postgres":
		if _, err := inboxpgx.Migrate(r.ctx, r.pool, it); err != nil {
			r.t.Fatal(err)
		}
		drv := inboxpgx.New(r.pool)
		adm, r.inboxDL = drv, func(dl inbox.DeadLetter) error { return drv.RecordDeadLetter(r.ctx, it, dl) }
	default:
		dialect := inboxsql.SQLite
		if r.db == "mysql" {
			dialect = inboxsql.MySQL
		}
		sdb := r.fx.(sqlFixtures).db
		if _, err := inboxsql.Migrate(r.ctx, sdb, dialect, it); err != nil {
			r.t.Fatal(err)
		}
		drv, err := inboxsql.New(sdb, dialect)
		if err != nil {
			r.t.Fatal(err)
		}
		adm, r.inboxDL = drv, func(dl inbox.DeadLetter) error { return drv.RecordDeadLetter(r.ctx, it, dl) }
	}
	x, err := ops.NewInbox(op, adm, it)
	if err != nil {
		r.t.Fatal(err)
	}
	r.ib = x
	return x
}

// consumerDeadLetter records a dead letter of consumer billing with a fresh
// event id and returns its number and the event id.
func (r *rig) consumerDeadLetter() (id, event string) {
	r.t.Helper()
	event = uuid.NewString()
	if err := r.inboxDL(inbox.DeadLetter{Consumer: "billing", EventID: event, AggregateType: "order", AggregateID: "7",
		Headers: map[string]string{"id": event}, Payload: []byte(`{"customer":{"email":"ann@example.com"}}`), Error: "unknown customer"}); err != nil {
		r.t.Fatal(err)
	}
	dls, err := r.ib.DeadLetters(r.ctx, ops.Actor{Name: "setup", Role: ops.Viewer}, "billing", 500)
	if err != nil {
		r.t.Fatal(err)
	}
	for _, dl := range dls {
		if dl.EventID == event {
			return fmt.Sprint(dl.ID), event
		}
	}
	r.t.Fatalf("dead letter of event %s not found", event)
	return "", ""
}

// deadLetter adds one dead letter and returns its id.
func (r *rig) deadLetter() string {
	r.t.Helper()
	return r.fx.addDeadLetters(r.t, r.tb, testenv.DeadLetterRow{
		AggregateType: "order", AggregateID: testenv.Hex(r.t), Type: "OrderPlaced",
		Payload: `{"orderId":42,"customer":{"email":"ada@example.com"}}`, Headers: `{"tenant":"t1"}`,
		LastError: "broker refused: 400 Bad Request", Attempts: 3, Held: true,
	})[0]
}

// state is what a refused or malformed request must leave as it was.
type state struct {
	backlog, dead, held int64
	audit, pauses       int
	requests            string // every request's id and state
}

func (r *rig) state() state {
	r.t.Helper()
	st, err := r.st.Status(r.ctx, r.tb)
	if err != nil {
		r.t.Fatal(err)
	}
	return state{st.Backlog, st.DeadLetters, st.Held, len(r.audit()), len(st.Pauses), r.fx.requestStates(r.t, r.tb)}
}

// request adds a pending replay request by a (default otto, operator)
// of one published event kept for it, and returns its id.
func (r *rig) request(a ...ops.Actor) string {
	r.t.Helper()
	by := ops.Actor{Name: "otto", Role: ops.Operator}
	if len(a) > 0 {
		by = a[0]
	}
	agg := r.keep()
	req, err := r.op.RequestReplay(r.ctx, by, ops.ReplayParams{Since: time.Now().Add(-time.Hour), AggregateID: agg}, "fixture")
	if err != nil {
		r.t.Fatal(err)
	}
	return req.ID
}

// keep adds one published event, kept, of a new aggregate, and returns
// the aggregate's id.
func (r *rig) keep() string {
	r.t.Helper()
	agg := testenv.Hex(r.t)
	r.fx.addPublished(r.t, r.tb, testenv.PublishedRow{AggregateType: "order", AggregateID: agg, Type: "OrderPlaced", Payload: `{"n":1}`, Ago: time.Minute})
	return agg
}

// subject is what a route acts on: a pending request for the routes of
// requests, else a dead letter.
func (r *rig) subject(pattern string) string {
	if strings.Contains(pattern, "/requests/{id}") {
		return r.request()
	}
	return r.deadLetter()
}

// body is what an API call of pattern sends about id, with reason.
func (r *rig) body(pattern, id, reason string) map[string]any {
	switch pattern {
	case "/api/v1/requests/replay":
		r.keep()
		return map[string]any{"since": time.Now().Add(-time.Hour).Format(time.RFC3339), "reason": reason}
	case "/api/v1/requests/repair":
		return map[string]any{"event_id": id, "headers": map[string]string{"fixed": "yes"}, "reason": reason}
	}
	return map[string]any{"reason": reason}
}

// form is what a page's form of pattern posts, with reason.
func (r *rig) form(pattern, reason string) url.Values {
	switch pattern {
	case "/replay":
		r.keep()
		return url.Values{"since": {time.Now().Add(-time.Hour).UTC().Format("2006-01-02T15:04")}, "reason": {reason}}
	case "/dead-letters/{id}/repair":
		return url.Values{"change_headers": {"on"}, "headers": {"fixed: yes"}, "reason": {reason}}
	}
	return url.Values{"reason": {reason}}
}

// audit returns the newest audit rows, newest first.
func (r *rig) audit() []outboxdriver.AuditRecord {
	r.t.Helper()
	recs, err := r.st.FindAudit(r.ctx, r.tb, outboxdriver.AuditQuery{Limit: 1000})
	if err != nil {
		r.t.Fatal(err)
	}
	return recs
}

// auditSince returns the rows newer than the id given, oldest first.
func (r *rig) auditSince(id int64) []outboxdriver.AuditRecord {
	var out []outboxdriver.AuditRecord
	recs := r.audit()
	for i := len(recs) - 1; i >= 0; i-- {
		if recs[i].ID > id {
			out = append(out, recs[i])
		}
	}
	return out
}

func (r *rig) lastAuditID() int64 {
	if recs := r.audit(); len(recs) > 0 {
		return recs[0].ID
	}
	return 0
}

// api sends an API request with the token (none when "").
func (r *rig) api(method, path, token string, body any) (int, []byte) {
	r.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			r.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(r.ctx, method, r.url+path, rd)
	if err != nil {
		r.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return r.do(http.DefaultClient, req)
}

func (r *rig) do(c *http.Client, req *http.Request) (int, []byte) {
	r.t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		r.t.Fatal(err)
	}
	return resp.StatusCode, b
}

// browser is a signed-in (or not) browser: cookies, no redirects followed.
type browser struct {
	r    *rig
	c    *http.Client
	csrf string
}

func (r *rig) browser() *browser {
	jar, err := cookiejar.New(nil)
	if err != nil {
		r.t.Fatal(err)
	}
	return &browser{r: r, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

var (
	csrfField  = regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	tokenField = regexp.MustCompile(`name="token" value="([^"]+)"`)
)

// login signs in as u and keeps the session's CSRF token.
func (b *browser) login(u testUser) {
	b.r.t.Helper()
	if code := b.signIn(u.name, u.password); code != http.StatusSeeOther {
		b.r.t.Fatalf("sign-in of %s answered %d, want 303", u.name, code)
	}
	code, page := b.get("/")
	m := csrfField.FindSubmatch(page)
	if code != http.StatusOK || m == nil {
		b.r.t.Fatalf("overview after sign-in: %d, no CSRF token in\n%s", code, page)
	}
	b.csrf = string(m[1])
}

// signIn posts the sign-in form (fetched first for its token).
func (b *browser) signIn(name, password string) int {
	b.r.t.Helper()
	_, page := b.get("/login")
	m := tokenField.FindSubmatch(page)
	if m == nil {
		b.r.t.Fatalf("no form token on the sign-in page:\n%s", page)
	}
	code, _ := b.post("/login", url.Values{"token": {string(m[1])}, "name": {name}, "password": {password}}, false)
	return code
}

func (b *browser) get(path string) (int, []byte) {
	b.r.t.Helper()
	req, err := http.NewRequestWithContext(b.r.ctx, "GET", b.r.url+path, nil)
	if err != nil {
		b.r.t.Fatal(err)
	}
	return b.r.do(b.c, req)
}

// post sends a form, with the session's CSRF token when withCSRF.
func (b *browser) post(path string, form url.Values, withCSRF bool) (int, []byte) {
	b.r.t.Helper()
	if form == nil {
		form = url.Values{}
	}
	if withCSRF {
		form.Set("csrf", b.csrf)
	}
	req, err := http.NewRequestWithContext(b.r.ctx, "POST", b.r.url+path, strings.NewReader(form.Encode()))
	if err != nil {
		b.r.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return b.r.do(b.c, req)
}

// openAPIOperations reads the served OpenAPI document: "METHOD path" ->
// the operation's x-outbox-permission.
func (r *rig) openAPIOperations() map[string]string {
	r.t.Helper()
	code, body := r.api("GET", "/api/v1/openapi.json", "", nil)
	if code != http.StatusOK {
		r.t.Fatalf("openapi.json: %d", code)
	}
	var doc struct {
		Paths map[string]map[string]struct {
			Permission string `json:"x-outbox-permission"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		r.t.Fatalf("openapi.json: %v", err)
	}
	ops := map[string]string{}
	for path, methods := range doc.Paths {
		for m, op := range methods {
			ops[strings.ToUpper(m)+" "+path] = op.Permission
		}
	}
	return ops
}

// target prepares what a request to a route needs: its subject (a
// pending request for the routes of requests, else a fresh dead letter
// that holds its aggregate; for {group}, the only one of its failure
// group), and a fresh scope (for {scope}, and for the pause form), paused
// already when the route resumes it. It returns the subject's id, the
// path, the form fields a page sends besides the reason, and the event id
// the action's audit row names.
func (r *rig) target(method, pattern string) (id, path string, form url.Values, event string) {
	r.t.Helper()
	id = r.subject(pattern)
	typ := "t-" + id[len(id)-12:]
	scope := outboxdriver.PauseScope{Kind: outboxdriver.PauseAggregateType, Value: typ}
	if method == "POST" && strings.HasSuffix(pattern, "/resume") {
		if _, err := r.st.SetPause(r.ctx, r.tb, scope, outboxdriver.Acting{Name: "setup", Role: "operator", Reason: "to resume"}); err != nil {
			r.t.Fatal(err)
		}
	}
	path = strings.ReplaceAll(fill(pattern, id), "{scope}", url.PathEscape(scope.String()))
	if strings.Contains(pattern, "{group}") {
		id = r.fx.addDeadLetters(r.t, r.tb, testenv.DeadLetterRow{AggregateType: "order", AggregateID: typ, Type: "Type" + typ,
			Payload: `{}`, LastError: "refused", Attempts: 1})[0]
		event = id
		gs, err := r.st.FailureGroups(r.ctx, r.tb, 1000)
		if err != nil {
			r.t.Fatal(err)
		}
		for _, g := range gs {
			if g.Example == id && g.Count == 1 {
				path = strings.ReplaceAll(path, "{group}", g.Key)
			}
		}
	}
	form = r.form(pattern, "")
	form.Del("reason")
	if method == "POST" && pattern == "/pauses" {
		form.Set("kind", string(scope.Kind))
		form.Set("value", scope.Value)
	}
	if strings.Contains(pattern, "{id}") {
		event = id
	}
	if strings.Contains(pattern, "{consumer}") {
		id, event = r.consumerDeadLetter()
		path = strings.ReplaceAll(strings.ReplaceAll(pattern, "{consumer}", "billing"), "{id}", id)
	}
	return id, path, form, event
}

// fill puts an id into a route pattern.
func fill(pattern, id string) string {
	p := strings.ReplaceAll(pattern, "{id}", id)
	p = strings.ReplaceAll(p, "{file}", "console.css")
	if p == "/api/v1/replay/preview" {
		p += "?since=" + url.QueryEscape(time.Now().Add(-time.Hour).Format(time.RFC3339))
	}
	return strings.ReplaceAll(p, "{$}", "")
}
