package console

import (
	"bytes"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
)

// The views: each file under templates/ but the layout is one page, parsed
// once with the layout.
var viewNames = []string{"overview", "dead_letters", "dead_letter", "audit", "login", "error", "pauses", "held", "failure_groups",
	"requests", "request", "replay", "repair", "signed_in", "consumers", "consumer_dead_letter"}

func parseViews() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"when": func(t time.Time) string {
			if t.IsZero() {
				return ""
			}
			return t.UTC().Format("2006-01-02 15:04:05Z")
		},
		"ago": func(t time.Time) string {
			if t.IsZero() {
				return ""
			}
			return roundDuration(time.Since(t)) + " ago"
		},
		"dur":   roundDuration,
		"short": func(s string, n int) string { return oneLine(s, n) },
		"gist":  errorGist,
		"may":   func(a ops.Actor, p string) bool { return a.Role.May(ops.Permission(p)) },
		"now":   untilNow,
		"list":  func(xs ...string) []string { return xs },
	}
	out := map[string]*template.Template{}
	for _, v := range viewNames {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/"+v+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", v, err)
		}
		out[v] = t
	}
	return out, nil
}

// page is what every view gets.
type page struct {
	Title    string
	Nav      string
	Nonce    string
	CSRF     string
	Actor    ops.Actor
	SignedIn bool
	Dev      bool
	Flash    string
	Data     any
}

func (q *req) render(status int, view, title string, data any) {
	p := page{Title: title, Nav: view, Nonce: q.nonce, Actor: q.actor, SignedIn: q.actor.Name != "", Dev: q.s.cfg.Dev, Data: data}
	if q.sess != nil {
		p.CSRF = q.sess.csrf
	}
	p.Flash = map[string]string{"retried": "The dead letter is back in the outbox.", "discarded": "The dead letter was discarded.",
		"paused": "Paused: every relay stops claiming it within one poll interval.", "resumed": "Resumed: the paused events flow again.",
		"released":        "Released: the aggregate's later events flow on.",
		"group-retried":   "The group's dead letters are back in the outbox: " + q.r.URL.Query().Get("n") + ".",
		"group-discarded": "The group's dead letters were discarded: " + q.r.URL.Query().Get("n") + ".",
		"requested":       "Requested. Another person with the approver role must approve it before it expires.",
		"approved":        "Approved: it is being carried out.", "rejected": "Rejected.", "cancelled": "Cancelled.",
		"consumer-retried":   "Marked for retry: a running consumer hands it to its handler again within its retry poll.",
		"consumer-discarded": "The consumer's dead letter was discarded."}[q.r.URL.Query().Get("done")]
	var b bytes.Buffer
	if err := q.s.views[view].Execute(&b, p); err != nil {
		q.s.log.Error("console: render", "view", view, "err", err)
		http.Error(q.w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	q.w.Header().Set("Content-Type", "text/html; charset=utf-8")
	q.w.WriteHeader(status)
	_, _ = q.w.Write(b.Bytes())
}

// overview is what the overview shows.
type overview struct {
	Status  outboxdriver.Status
	Relays  []relayRow
	Insight ops.Insight
	Chart   chart
}

type relayRow struct {
	Name       string
	Partitions []int
	// Registered is the relay's entry in the registry, when it has one.
	Registered *outboxdriver.RelayStatus
}

func newOverview(st outboxdriver.Status) overview {
	byOwner := map[string][]int{}
	for _, p := range st.Partitions {
		if p.Owner != "" {
			byOwner[p.Owner] = append(byOwner[p.Owner], p.Partition)
		}
	}
	ov := overview{Status: st}
	for name, parts := range byOwner {
		ov.Relays = append(ov.Relays, relayRow{Name: name, Partitions: parts})
	}
	sort.Slice(ov.Relays, func(i, j int) bool { return ov.Relays[i].Name < ov.Relays[j].Name })
	return ov
}

func (s *Server) overviewPage(q *req) {
	st, err := s.ops.Overview(q.ctx(), q.actor)
	if err != nil {
		q.failErr(err)
		return
	}
	in, err := s.ops.Insight(q.ctx(), q.actor, chartWindow)
	if err != nil {
		q.failErr(err)
		return
	}
	q.render(http.StatusOK, "overview", "Overview", newOverview(st).with(in, time.Now()))
}

// deadLettersView is what the list of dead letters shows.
type deadLettersView struct {
	Filter url.Values
	Page   outboxdriver.DeadLetterPage
	Next   string
}

func (s *Server) deadLettersPage(q *req) {
	dq, err := s.deadLetterQuery(q.r.URL.Query())
	if err != nil {
		q.failErr(err)
		return
	}
	pg, err := s.ops.DeadLetters(q.ctx(), q.actor, dq)
	if err != nil {
		q.failErr(err)
		return
	}
	v := deadLettersView{Filter: q.r.URL.Query(), Page: pg}
	if pg.Next != nil {
		next := q.r.URL.Query()
		next.Set("after", pg.Next.String())
		next.Del("done")
		v.Next = "/dead-letters?" + next.Encode()
	}
	q.render(http.StatusOK, "dead_letters", "Dead letters", v)
}

func (s *Server) deadLetterPage(q *req) {
	v, err := s.ops.DeadLetter(q.ctx(), q.actor, q.r.PathValue("id"))
	if err != nil {
		q.failErr(err)
		return
	}
	q.render(http.StatusOK, "dead_letter", "Dead letter "+v.ID, v)
}

// actPage retries or discards one dead letter from a form and goes back to
// the list.
func (s *Server) actPage(action string) func(*req) {
	return func(q *req) {
		do := s.ops.Retry
		if action == "discard" {
			do = s.ops.Discard
		}
		id := q.r.PathValue("id")
		done, err := do(q.ctx(), q.actor, []string{id}, q.formValue("reason"))
		if err == nil && len(done) == 0 {
			err = fmt.Errorf("dead letter %s: %w", id, outboxdriver.ErrNotFound)
		}
		if err != nil {
			q.failErr(err)
			return
		}
		http.Redirect(q.w, q.r, "/dead-letters?done="+map[string]string{"retry": "retried", "discard": "discarded"}[action], http.StatusSeeOther)
	}
}

// auditView is what the audit page shows.
type auditView struct {
	Filter  url.Values
	Records []outboxdriver.AuditRecord
	Next    string
}

func (s *Server) auditPage(q *req) {
	aq, err := s.auditQuery(q.r.URL.Query())
	if err != nil {
		q.failErr(err)
		return
	}
	recs, err := s.ops.Audit(q.ctx(), q.actor, aq)
	if err != nil {
		q.failErr(err)
		return
	}
	v := auditView{Filter: q.r.URL.Query(), Records: recs}
	if len(recs) == aq.Limit {
		next := q.r.URL.Query()
		next.Set("before", strconv.FormatInt(recs[len(recs)-1].ID, 10))
		v.Next = "/audit?" + next.Encode()
	}
	q.render(http.StatusOK, "audit", "Audit", v)
}

// loginView is what the sign-in page shows.
type loginView struct {
	Token, Next, Name, Error string
	NoUsers                  bool
	// Password: the users file has users, so the password form shows.
	Password bool
	// OIDC is the issuer's host when sign-in through it is on.
	OIDC string
}

const loginCookie = "outbox_login"

func (s *Server) loginPage(q *req) {
	s.renderLogin(q, http.StatusOK, loginView{Next: safeNext(q.r.URL.Query().Get("next"))})
}

// renderLogin shows the sign-in form with a fresh form token, kept in a
// cookie too: a sign-in must come from this form.
func (s *Server) renderLogin(q *req, status int, v loginView) {
	v.Token = randomString(24)
	dir := s.directory()
	v.NoUsers = s.cfg.Dev && dir.empty()
	v.Password = !dir.empty() || s.cfg.OIDC == nil
	if s.cfg.OIDC != nil {
		v.OIDC = s.cfg.OIDC.host
	}
	http.SetCookie(q.w, &http.Cookie{Name: loginCookie, Value: v.Token, Path: "/login", HttpOnly: true, Secure: s.cfg.SecureCookies,
		SameSite: http.SameSiteStrictMode, MaxAge: 3600})
	q.render(status, "login", "Sign in", v)
}

func (s *Server) login(q *req) {
	r := q.r
	ip := clientIP(r)
	name := strings.TrimSpace(q.formValue("name"))
	password := q.formValue("password")
	next := safeNext(q.formValue("next"))
	v := loginView{Next: next, Name: name}
	c, err := r.Cookie(loginCookie)
	if err != nil || !sameToken(q.formValue("token"), c.Value) {
		s.ops.Refused(q.ctx(), ops.Actor{Name: oneLine(name, 64)}, "sign in", "the sign-in form's token is missing or wrong (from "+ip+")", ops.Subject{})
		v.Error = "The sign-in form expired. Please try again."
		s.renderLogin(q, http.StatusForbidden, v)
		return
	}
	if wait := s.fails.blockedFor("ip:"+ip, "user:"+name); wait > 0 {
		retryAfter(q.w, wait)
		v.Error = "Too many failed sign-ins from your address or for this name. Try again in " + waitText(wait) + "."
		s.renderLogin(q, http.StatusTooManyRequests, v)
		return
	}
	u := s.directory().login(name, password)
	if u == nil {
		detail := "wrong name or password (from " + ip + ")"
		if s.fails.fail("ip:"+ip, "user:"+name) {
			detail += "; further sign-ins from this address or for this name are blocked for " + roundDuration(s.fails.blockedFor("ip:"+ip, "user:"+name))
		}
		s.record(q, ops.Actor{Name: oneLine(name, 64)}, ops.ActionLoginFailed, detail)
		v.Error = "Wrong name or password."
		s.renderLogin(q, http.StatusUnauthorized, v)
		return
	}
	s.fails.reset("user:" + name)
	x := s.sess.start(u.Actor(), true)
	s.setSession(q.w, x)
	http.SetCookie(q.w, &http.Cookie{Name: loginCookie, Path: "/login", MaxAge: -1})
	s.record(q, u.Actor(), ops.ActionLogin, "from "+ip)
	http.Redirect(q.w, r, next, http.StatusSeeOther)
}

func (s *Server) logout(q *req) {
	if q.sess != nil {
		s.sess.delete(q.sess.id)
	}
	http.SetCookie(q.w, &http.Cookie{Name: s.cookie, Path: "/", MaxAge: -1, HttpOnly: true, Secure: s.cfg.SecureCookies, SameSite: http.SameSiteStrictMode})
	s.record(q, q.actor, ops.ActionLogout, "from "+clientIP(q.r))
	http.Redirect(q.w, q.r, "/login", http.StatusSeeOther)
}

// record audits a sign-in or sign-out; a failure to is logged.
func (s *Server) record(q *req, a ops.Actor, action, detail string) {
	err := s.ops.Record(q.ctx(), outboxdriver.AuditRecord{Actor: a.Name, Action: action, Detail: detail, Role: string(a.Role)})
	if err != nil {
		s.log.Error("console: audit row not written", "action", action, "actor", a.Name, "err", err)
	}
}

// safeNext keeps a redirect after sign-in on this site.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/\\") || strings.ContainsAny(next, "\r\n") {
		return "/"
	}
	return next
}

// deadLetterQuery reads the filters of a list of dead letters; an unknown
// parameter or a malformed value is an *ops.InputError.
func (s *Server) deadLetterQuery(v url.Values) (outboxdriver.DeadLetterQuery, error) {
	q := outboxdriver.DeadLetterQuery{Limit: s.cfg.PageSize}
	if err := known(v, "aggregatetype", "aggregateid", "type", "destination", "error", "since", "until", "after", "limit", "done"); err != nil {
		return q, err
	}
	q.AggregateType, q.AggregateID, q.Type, q.ErrorContains = v.Get("aggregatetype"), v.Get("aggregateid"), v.Get("type"), v.Get("error")
	q.Destination = v.Get("destination")
	var err error
	if q.Since, err = parseTime("since", v.Get("since")); err != nil {
		return q, err
	}
	if q.Until, err = parseTime("until", v.Get("until")); err != nil {
		return q, err
	}
	if a := v.Get("after"); a != "" {
		c, err := outboxdriver.ParseDeadLetterCursor(a)
		if err != nil {
			return q, &ops.InputError{Field: "after", Reason: err.Error()}
		}
		q.After = &c
	}
	if q.Limit, err = parseLimit(v.Get("limit"), q.Limit); err != nil {
		return q, err
	}
	return q, nil
}

// auditQuery reads the filters of the audit list.
func (s *Server) auditQuery(v url.Values) (outboxdriver.AuditQuery, error) {
	q := outboxdriver.AuditQuery{Limit: s.cfg.PageSize}
	if err := known(v, "actor", "action", "event_id", "request_id", "since", "until", "before", "limit"); err != nil {
		return q, err
	}
	q.Actor, q.Action, q.EventID, q.RequestID = v.Get("actor"), v.Get("action"), v.Get("event_id"), v.Get("request_id")
	var err error
	if q.Since, err = parseTime("since", v.Get("since")); err != nil {
		return q, err
	}
	if q.Until, err = parseTime("until", v.Get("until")); err != nil {
		return q, err
	}
	if b := v.Get("before"); b != "" {
		n, err := strconv.ParseInt(b, 10, 64)
		if err != nil || n < 1 {
			return q, &ops.InputError{Field: "before", Reason: "want the id of an audit row"}
		}
		q.Before = n
	}
	q.Limit, err = parseLimit(v.Get("limit"), q.Limit)
	return q, err
}

// known refuses parameters not in names, and parameters given twice.
func known(v url.Values, names ...string) error {
	for k, vs := range v {
		ok := false
		for _, n := range names {
			ok = ok || k == n
		}
		if !ok {
			return &ops.InputError{Field: oneLine(k, 40), Reason: "unknown parameter; use " + strings.Join(names, ", ")}
		}
		if len(vs) > 1 {
			return &ops.InputError{Field: k, Reason: "given more than once"}
		}
	}
	return nil
}

func parseLimit(s string, def int) (int, error) {
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, &ops.InputError{Field: "limit", Reason: "want a whole number"}
	}
	return n, nil // ops checks the range
}

// parseTime reads a time filter (ops.ParseTime).
func parseTime(field, s string) (time.Time, error) { return ops.ParseTime(field, s) }

func roundDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}

// errorGist is what a list shows of a last error: all of it up to
// gistHead+gistTail characters, else its start and its end with the
// middle left out, each cut at a space. The end is the larger part: an
// error wrapped in Go reads from the outermost operation to its cause
// ("publish to exchange ...: message returned as unroutable (312
// NO_ROUTE): ..."), so the cause and what follows it are near the end.
func errorGist(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	r := []rune(s)
	if len(r) <= gistHead+gistTail {
		return s
	}
	head, tail := string(r[:gistHead]), string(r[len(r)-gistTail:])
	if i := strings.LastIndexByte(head, ' '); i > gistHead/2 {
		head = head[:i]
	}
	if i := strings.IndexByte(tail, ' '); i >= 0 && i < gistTail/4 {
		tail = tail[i+1:]
	}
	return head + " … " + tail
}

// The parts of a long error errorGist keeps, in characters.
const gistHead, gistTail = 60, 140

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		for n > 0 && s[n]&0xC0 == 0x80 {
			n--
		}
		s = s[:n] + "…"
	}
	return s
}
