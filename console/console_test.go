package console_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/console"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

// The role matrix: every route the console answers, for every role, with
// the status that role gets. Acting routes answer 303 (pages) or 200
// (API) when allowed; any refusal is 403. The test fails when a route is
// added without a row here.
var roleMatrix = []struct {
	method, pattern            string
	viewer, operator, approver int
}{
	{"GET", "/login", 200, 200, 200},
	{"POST", "/login", 303, 303, 303},
	{"GET", "/static/{file}", 200, 200, 200},
	{"POST", "/logout", 303, 303, 303},
	{"GET", "/{$}", 200, 200, 200},
	{"GET", "/dead-letters", 200, 200, 200},
	{"GET", "/dead-letters/{id}", 200, 200, 200},
	{"POST", "/dead-letters/{id}/retry", 403, 303, 403},
	{"POST", "/dead-letters/{id}/discard", 403, 303, 403},
	{"GET", "/audit", 200, 200, 200},
	{"GET", "/api/v1/openapi.json", 200, 200, 200},
	{"GET", "/api/v1/overview", 200, 200, 200},
	{"GET", "/api/v1/dead-letters", 200, 200, 200},
	{"GET", "/api/v1/dead-letters/{id}", 200, 200, 200},
	{"POST", "/api/v1/dead-letters/{id}/retry", 403, 200, 403},
	{"POST", "/api/v1/dead-letters/{id}/discard", 403, 200, 403},
	{"GET", "/api/v1/audit", 200, 200, 200},
	{"GET", "/pauses", 200, 200, 200},
	{"POST", "/pauses", 403, 303, 403},
	{"POST", "/pauses/{scope}/resume", 403, 303, 403},
	{"GET", "/held", 200, 200, 200},
	{"POST", "/held/{id}/release", 403, 303, 403},
	{"GET", "/api/v1/pauses", 200, 200, 200},
	{"POST", "/api/v1/pauses/{scope}/pause", 403, 200, 403},
	{"POST", "/api/v1/pauses/{scope}/resume", 403, 200, 403},
	{"GET", "/api/v1/held", 200, 200, 200},
	{"POST", "/api/v1/held/{id}/release", 403, 200, 403},
	{"POST", "/dead-letters/{id}/reveal", 403, 200, 403},
	{"POST", "/api/v1/dead-letters/{id}/reveal", 403, 200, 403},
	{"GET", "/failure-groups", 200, 200, 200},
	{"POST", "/failure-groups/{group}/retry", 403, 303, 403},
	{"POST", "/failure-groups/{group}/discard", 403, 303, 403},
	{"GET", "/api/v1/failure-groups", 200, 200, 200},
	{"POST", "/api/v1/failure-groups/{group}/retry", 403, 200, 403},
	{"POST", "/api/v1/failure-groups/{group}/discard", 403, 200, 403},
	{"GET", "/requests", 200, 200, 200},
	{"GET", "/requests/{id}", 200, 200, 200},
	{"POST", "/requests/{id}/approve", 403, 403, 303},
	{"POST", "/requests/{id}/reject", 403, 403, 303},
	{"POST", "/requests/{id}/cancel", 403, 303, 403},
	{"GET", "/replay", 200, 200, 200},
	{"POST", "/replay", 403, 303, 403},
	{"GET", "/dead-letters/{id}/repair", 200, 200, 200},
	{"POST", "/dead-letters/{id}/repair", 403, 303, 403},
	{"GET", "/api/v1/requests", 200, 200, 200},
	{"GET", "/api/v1/requests/{id}", 200, 200, 200},
	{"GET", "/api/v1/replay/preview", 200, 200, 200},
	{"POST", "/api/v1/requests/replay", 403, 201, 403},
	{"POST", "/api/v1/requests/repair", 403, 201, 403},
	{"POST", "/api/v1/requests/{id}/approve", 403, 403, 200},
	{"POST", "/api/v1/requests/{id}/reject", 403, 403, 200},
	{"POST", "/api/v1/requests/{id}/cancel", 403, 200, 403},
	{"GET", "/consumers", 200, 200, 200},
	{"GET", "/consumers/{consumer}/dead-letters/{id}", 200, 200, 200},
	{"POST", "/consumers/{consumer}/dead-letters/{id}/retry", 403, 303, 403},
	{"POST", "/consumers/{consumer}/dead-letters/{id}/discard", 403, 303, 403},
}

// allowed is who may call a state-changing route, by the role matrix: the
// operator, or else the approver.
func allowed(r *rig, method, pattern string) testUser {
	for _, m := range roleMatrix {
		if m.method == method && m.pattern == pattern && m.operator != 403 {
			return r.users[ops.Operator]
		}
	}
	return r.users[ops.Approver]
}

func TestRoleMatrix(t *testing.T) {
	t.Parallel()
	onEveryDB(t, nil, func(t *testing.T, r *rig) {
		listed := map[string]bool{}
		for _, m := range roleMatrix {
			listed[m.method+" "+m.pattern] = true
		}
		for _, rt := range r.srv.Routes() {
			if !listed[rt.Method+" "+rt.Pattern] {
				t.Errorf("route %s %s has no row in the role matrix", rt.Method, rt.Pattern)
			}
			delete(listed, rt.Method+" "+rt.Pattern)
		}
		for k := range listed {
			t.Errorf("the role matrix lists %s, which the console does not answer", k)
		}
		for _, m := range roleMatrix {
			for _, role := range ops.Roles() {
				want := map[ops.Role]int{ops.Viewer: m.viewer, ops.Operator: m.operator, ops.Approver: m.approver}[role]
				u := r.users[role]
				id, path, form, _ := r.target(m.method, m.pattern)
				before := r.state()
				var got int
				switch {
				case m.pattern == "/login" && m.method == "POST":
					got = r.browser().signIn(u.name, u.password)
				case strings.HasPrefix(m.pattern, "/api/"):
					var body any
					if m.method == "POST" {
						body = r.body(m.pattern, id, "matrix")
					}
					got, _ = r.api(m.method, path, u.token, body)
				default:
					b := r.browser()
					b.login(u)
					if m.method == "POST" {
						form.Set("reason", "matrix")
						got, _ = b.post(path, form, true)
					} else {
						got, _ = b.get(path)
					}
				}
				if got != want {
					t.Errorf("%s %s as %s: %d, want %d", m.method, m.pattern, role, got, want)
				}
				if got == http.StatusForbidden {
					after := r.state()
					if after.backlog != before.backlog || after.dead != before.dead || after.held != before.held || after.pauses != before.pauses || after.requests != before.requests {
						t.Errorf("%s %s as %s was refused but changed %+v into %+v", m.method, m.pattern, role, before, after)
					}
					if last := r.audit()[0]; last.Action != ops.ActionDenied || last.Actor != u.name || last.Role != string(role) {
						t.Errorf("%s %s as %s was refused; newest audit row %+v, want a denied row for %s", m.method, m.pattern, role, last, u.name)
					}
				}
			}
		}
	})
}

// The OpenAPI document the console serves describes exactly its API
// routes, and names the permission each needs as the role matrix does.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	doc := r.openAPIOperations()
	routes := map[string]bool{}
	for _, rt := range r.srv.Routes() {
		if rt.API {
			routes[rt.Method+" "+rt.Pattern] = true
			if !strings.HasPrefix(rt.Pattern, "/api/v1/") {
				t.Errorf("API route %s outside /api/v1/", rt.Pattern)
			}
		} else if strings.HasPrefix(rt.Pattern, "/api/") {
			t.Errorf("page route %s under /api/", rt.Pattern)
		}
	}
	var missing, extra []string
	for op := range routes {
		if _, ok := doc[op]; !ok {
			missing = append(missing, op)
		}
	}
	for op := range doc {
		if !routes[op] {
			extra = append(extra, op)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if missing != nil || extra != nil {
		t.Fatalf("OpenAPI document and routes differ: routes not in the document %v; document operations with no route %v", missing, extra)
	}
	for _, m := range roleMatrix {
		perm, ok := doc[m.method+" "+m.pattern]
		if !ok {
			continue
		}
		want := "read"
		switch {
		case m.viewer == 403 && m.approver == 403:
			want = "act"
		case m.viewer == 403 && m.operator == 403:
			want = "approve"
		case m.pattern == "/api/v1/openapi.json":
			want = "none"
		}
		if perm != want {
			t.Errorf("%s %s: x-outbox-permission %q, the role matrix says %q", m.method, m.pattern, perm, want)
		}
	}
	if !json.Valid(console.OpenAPI()) {
		t.Fatal("OpenAPI() is not JSON")
	}
}

// Every state-changing operation of the API (walked from the OpenAPI
// document) leaves audit rows: the action with actor, role and reason
// when allowed, a denied row when refused. So do the pages' actions and
// sign-in and sign-out.
func TestAuditForEveryStateChange(t *testing.T) {
	t.Parallel()
	onEveryDB(t, nil, func(t *testing.T, r *rig) {
		var posts []string
		for op := range r.openAPIOperations() {
			if strings.HasPrefix(op, "POST ") {
				posts = append(posts, strings.TrimPrefix(op, "POST "))
			}
		}
		if len(posts) < 2 {
			t.Fatalf("the OpenAPI document has %d POST operations; want retry and discard at least", len(posts))
		}
		viewer := r.users[ops.Viewer]
		for _, p := range posts {
			u := allowed(r, "POST", p)
			id, path, _, event := r.target("POST", p)
			mark := r.lastAuditID()
			if code, body := r.api("POST", path, viewer.token, r.body(p, id, "no")); code != 403 {
				t.Fatalf("POST %s as viewer: %d %s", p, code, body)
			}
			if code, body := r.api("POST", path, u.token, r.body(p, id, "audit walk")); code != 200 && code != 201 {
				t.Fatalf("POST %s as %s: %d %s", p, u.name, code, body)
			}
			rows := r.auditSince(mark)
			if len(rows) != 2 {
				t.Fatalf("POST %s left %d audit rows, want 2: %+v", p, len(rows), rows)
			}
			if d := rows[0]; d.Action != ops.ActionDenied || d.Actor != "vera" || d.Role != "viewer" {
				t.Errorf("POST %s refused to vera: audit %+v", p, d)
			}
			if a := rows[1]; a.Action != auditAction(p) || a.Actor != u.name || a.Role != string(u.role) || !aboutSubject(a, p, id, event) || a.Reason != "audit walk" {
				t.Errorf("POST %s by %s: audit %+v; want %s of %s by %s (%s), reason \"audit walk\"", p, u.name, a, auditAction(p), id, u.name, u.role)
			}
		}

		// The pages: every POST route but the sign-in (below), by whom the
		// role matrix allows.
		browsers := map[string]*browser{}
		for _, rt := range r.srv.Routes() {
			if rt.Method != "POST" || rt.API || rt.Pattern == "/login" || rt.Pattern == "/logout" {
				continue
			}
			u := allowed(r, "POST", rt.Pattern)
			b := browsers[u.name]
			if b == nil {
				b = r.browser()
				b.login(u)
				browsers[u.name] = b
			}
			id, path, form, event := r.target("POST", rt.Pattern)
			mark := r.lastAuditID()
			form.Set("reason", "from the page")
			// An action redirects (303); a reveal shows its result (200).
			want := http.StatusSeeOther
			if strings.HasSuffix(rt.Pattern, "/reveal") {
				want = http.StatusOK
			}
			if code, body := b.post(path, form, true); code != want {
				t.Fatalf("POST %s: %d, want %d: %s", rt.Pattern, code, want, body)
			}
			rows := r.auditSince(mark)
			if len(rows) != 1 || rows[0].Action != auditAction(rt.Pattern) || !aboutSubject(rows[0], rt.Pattern, id, event) || rows[0].Actor != u.name || rows[0].Role != string(u.role) || rows[0].Reason != "from the page" {
				t.Errorf("POST %s: audit %+v", rt.Pattern, rows)
			}
		}
		operator := r.users[ops.Operator]
		b := browsers[operator.name]
		mark := r.lastAuditID()
		if code, _ := b.post("/logout", nil, true); code != 303 {
			t.Fatalf("sign-out: %d", code)
		}
		b.signIn("otto", "wrong password!")
		b.signIn("otto", operator.password)
		rows := r.auditSince(mark)
		var got []string
		for _, x := range rows {
			got = append(got, x.Action+":"+x.Actor+":"+x.Role)
		}
		if strings.Join(got, " ") != "logout:otto:operator login-failed:otto: login:otto:operator" {
			t.Fatalf("sign-out, failed and good sign-in audited as %v", got)
		}
	})
}

// auditAction is the action a POST route leaves in the audit.
func auditAction(pattern string) string {
	action := pattern[strings.LastIndex(pattern, "/")+1:]
	if strings.HasPrefix(pattern, "/consumers/") {
		return "inbox-" + action // ops.ActionInboxRetry, ops.ActionInboxDiscard
	}
	switch action {
	case "replay", "repair":
		return "request" // a replay or repair is requested
	case "pauses":
		return ops.ActionPause // the pauses page's form pauses
	}
	return action
}

// aboutSubject reports whether audit row a names what a route acted on:
// the request, or else the event target found (none for a pause).
func aboutSubject(a outboxdriver.AuditRecord, pattern, id, event string) bool {
	switch {
	case strings.Contains(pattern, "/requests/{id}"):
		return a.RequestID == id
	case strings.HasSuffix(pattern, "/requests/replay"), pattern == "/replay":
		return a.RequestID != "" && a.EventID == ""
	case strings.HasSuffix(pattern, "/repair"):
		return a.RequestID != "" && a.EventID == id
	}
	return a.EventID == event && a.RequestID == ""
}

// A state change from a signed-in browser needs the session's CSRF token
// and must come from the console's own origin; a refusal changes nothing
// and is audited.
func TestCSRF(t *testing.T) {
	t.Parallel()
	onEveryDB(t, nil, func(t *testing.T, r *rig) {
		id := r.deadLetter()
		b := r.browser()
		b.login(r.users[ops.Operator])
		before := r.state()
		paths := []string{"/dead-letters/" + id + "/retry", "/dead-letters/" + id + "/discard", "/logout",
			"/requests/" + r.request() + "/cancel", "/replay", "/dead-letters/" + id + "/repair"}
		before = r.state()
		for _, p := range paths {
			if code, _ := b.post(p, url.Values{"reason": {"no token"}}, false); code != 403 {
				t.Errorf("POST %s without a CSRF token: %d, want 403", p, code)
			}
			if code, _ := b.post(p, url.Values{"csrf": {"forged"}}, false); code != 403 {
				t.Errorf("POST %s with a wrong CSRF token: %d, want 403", p, code)
			}
		}
		// The API with a session cookie needs the token in X-CSRF-Token.
		req, _ := http.NewRequestWithContext(r.ctx, "POST", r.url+"/api/v1/dead-letters/"+id+"/retry", nil)
		if code, _ := r.do(b.c, req); code != 403 {
			t.Errorf("API POST with the session cookie and no CSRF header: %d, want 403", code)
		}
		// A cross-site request is refused even with the right token.
		req, _ = http.NewRequestWithContext(r.ctx, "POST", r.url+"/dead-letters/"+id+"/retry", strings.NewReader(url.Values{"csrf": {b.csrf}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", "cross-site")
		if code, _ := r.do(b.c, req); code != 403 {
			t.Errorf("cross-site POST: %d, want 403", code)
		}
		after := r.state()
		refused := 2*len(paths) + 2
		if after.dead != before.dead || after.backlog != before.backlog || after.requests != before.requests || after.audit != before.audit+refused {
			t.Fatalf("refused requests changed %+v into %+v; want only %d more audit rows", before, after, refused)
		}
		for _, a := range r.audit()[:refused] {
			if a.Action != ops.ActionDenied {
				t.Errorf("refusal audited as %+v", a)
			}
		}
		// With the token, from the same origin, it works.
		req, _ = http.NewRequestWithContext(r.ctx, "POST", r.url+"/api/v1/dead-letters/"+id+"/retry", nil)
		req.Header.Set("X-CSRF-Token", b.csrf)
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		if code, body := r.do(b.c, req); code != 200 {
			t.Fatalf("API POST with the session and its CSRF header: %d %s", code, body)
		}
		// The sign-in form needs its own token.
		code, _ := r.browser().post("/login", url.Values{"name": {"otto"}, "password": {r.users[ops.Operator].password}}, false)
		if code != 403 {
			t.Fatalf("sign-in without the form token: %d, want 403", code)
		}
	})
}

// Malformed filters, oversized pages, unknown and malformed ids, bad
// bodies and bad tokens get a 4xx and change nothing (a bad token is
// audited).
func TestBadInput(t *testing.T) {
	t.Parallel()
	onEveryDB(t, nil, func(t *testing.T, r *rig) {
		id := r.deadLetter()
		op := r.users[ops.Operator].token
		unknown := "0190a0a0-0000-7000-8000-000000000000"
		cases := []struct {
			method, path string
			body         any
			want         int
		}{
			{"GET", "/api/v1/dead-letters?limit=100000", nil, 400},
			{"GET", "/api/v1/dead-letters?limit=0", nil, 400},
			{"GET", "/api/v1/dead-letters?limit=ten", nil, 400},
			{"GET", "/api/v1/dead-letters?since=yesterday", nil, 400},
			{"GET", "/api/v1/dead-letters?since=2030-01-02&until=2020-01-01", nil, 400},
			{"GET", "/api/v1/dead-letters?after=abc", nil, 400},
			{"GET", "/api/v1/dead-letters?colour=red", nil, 400},
			{"GET", "/api/v1/dead-letters?type=a&type=b", nil, 400},
			{"GET", "/api/v1/dead-letters?error=" + strings.Repeat("x", 300), nil, 400},
			{"GET", "/api/v1/audit?before=-1", nil, 400},
			{"GET", "/api/v1/audit?event_id=nope", nil, 400},
			{"GET", "/api/v1/audit?limit=501", nil, 400},
			{"GET", "/api/v1/dead-letters/" + unknown, nil, 404},
			{"GET", "/api/v1/dead-letters/not-a-uuid", nil, 400},
			{"POST", "/api/v1/dead-letters/" + unknown + "/retry", nil, 404},
			{"POST", "/api/v1/dead-letters/" + unknown + "/discard", nil, 404},
			{"POST", "/api/v1/dead-letters/1%27%20OR%201=1/retry", nil, 400},
			{"POST", "/api/v1/dead-letters/" + id + "/retry", map[string]any{"reason": 7}, 400},
			{"POST", "/api/v1/dead-letters/" + id + "/retry", map[string]any{"why": "x"}, 400},
			{"POST", "/api/v1/dead-letters/" + id + "/discard", map[string]any{"reason": strings.Repeat("r", 1001)}, 400},
			{"POST", "/api/v1/dead-letters/" + id + "/discard", map[string]any{"reason": strings.Repeat("r", 70000)}, 400},
			{"POST", "/api/v1/pauses/everything/pause", map[string]any{"reason": "x"}, 400},
			{"POST", "/api/v1/pauses/aggregatetype=/pause", map[string]any{"reason": "x"}, 400},
			{"POST", "/api/v1/pauses/all/pause", nil, 400}, // no reason
			{"POST", "/api/v1/pauses/all/pause", map[string]any{"reason": " "}, 400},
			{"POST", "/api/v1/pauses/aggregatetype=order/resume", nil, 404},
			{"GET", "/api/v1/pauses?x=1", nil, 400},
			{"GET", "/api/v1/held?limit=501", nil, 400},
			{"POST", "/api/v1/held/" + unknown + "/release", map[string]any{"reason": "x"}, 404},
			{"POST", "/api/v1/held/not-a-uuid/release", map[string]any{"reason": "x"}, 400},
			{"POST", "/api/v1/held/" + id + "/release", nil, 400}, // no reason
			{"GET", "/api/v1/failure-groups?limit=0", nil, 400},
			{"POST", "/api/v1/failure-groups/zz/retry", nil, 400},
			{"POST", "/api/v1/failure-groups/" + strings.Repeat("0", 32) + "/discard", nil, 404},
			{"GET", "/api/v1/nothing", nil, 404},
			{"DELETE", "/api/v1/audit", nil, 404},
		}
		before := r.state()
		for _, c := range cases {
			code, body := r.api(c.method, c.path, op, c.body)
			if code != c.want {
				t.Errorf("%s %s: %d %s; want %d", c.method, c.path, code, body, c.want)
			}
			var e struct {
				Error struct{ Message string } `json:"error"`
			}
			if json.Unmarshal(body, &e) != nil || e.Error.Message == "" {
				t.Errorf("%s %s: body %s; want a JSON error with a message", c.method, c.path, body)
			}
		}
		if after := r.state(); after != before {
			t.Fatalf("bad input changed %+v into %+v", before, after)
		}
		// A bad token is refused and audited; it changes nothing else.
		if code, _ := r.api("POST", "/api/v1/dead-letters/"+id+"/retry", "obx_forged", nil); code != 401 {
			t.Fatalf("a forged token: %d, want 401", code)
		}
		if code, _ := r.api("GET", "/api/v1/overview", "", nil); code != 401 {
			t.Fatalf("no token: %d, want 401", code)
		}
		after := r.state()
		if after.dead != before.dead || after.audit != before.audit+1 || r.audit()[0].Action != ops.ActionDenied {
			t.Fatalf("a forged token changed %+v into %+v (newest audit %+v); want one denied row more", before, after, r.audit()[0])
		}
		badRequests(t, r, id)
		// A page with a bad filter says so.
		b := r.browser()
		b.login(r.users[ops.Viewer])
		if code, page := b.get("/dead-letters?since=soon"); code != 400 || !strings.Contains(string(page), "since") {
			t.Fatalf("page with a bad filter: %d\n%s", code, page)
		}
	})
}

// badRequests: the requests' bad input gets a clear 4xx and changes
// nothing but, for a refusal, a denied row.
func badRequests(t *testing.T, r *rig, deadLetter string) {
	t.Helper()
	op, ap := r.users[ops.Operator].token, r.users[ops.Approver].token
	unknown := "0190a0a0-0000-7000-8000-000000000000"
	since := time.Now().Add(-time.Hour).Format(time.RFC3339)
	// No published event is kept yet: a replay says what it needs.
	code, body := r.api("POST", "/api/v1/requests/replay", op, map[string]any{"since": since, "reason": "x"})
	if code != 409 || !strings.Contains(string(body), "--retention keep") {
		t.Fatalf("a replay without kept rows: %d %s; want 409 naming --retention keep", code, body)
	}
	if code, body := r.api("GET", "/api/v1/replay/preview?since="+url.QueryEscape(since), op, nil); code != 409 {
		t.Fatalf("a preview without kept rows: %d %s", code, body)
	}
	mine := r.request(ops.Actor{Name: "anna", Role: ops.Operator}) // anna requested it, as an operator then
	expired := r.request()
	r.fx.expire(t, r.tb, expired)
	// The next call that reads requests marks it expired (and audits it).
	if code, body := r.api("GET", "/api/v1/requests/"+expired, op, nil); code != 200 || !strings.Contains(string(body), `"state": "expired"`) {
		t.Fatalf("a request past its expiry: %d %s", code, body)
	}
	cases := []struct {
		method, path, token string
		body                any
		want                int
		says                string
	}{
		{"GET", "/api/v1/requests?state=sleeping", op, nil, 400, "state"},
		{"GET", "/api/v1/requests?limit=501", op, nil, 400, "limit"},
		{"GET", "/api/v1/requests/not-a-uuid", op, nil, 400, "request id"},
		{"GET", "/api/v1/requests/" + unknown, op, nil, 404, "no such request"},
		{"GET", "/api/v1/replay/preview", op, nil, 400, "since"},
		{"GET", "/api/v1/replay/preview?since=" + url.QueryEscape(since) + "&ids=both", op, nil, 400, "ids"},
		{"POST", "/api/v1/requests/replay", op, map[string]any{"since": "yesterday", "reason": "x"}, 400, "body"},
		{"POST", "/api/v1/requests/replay", op, map[string]any{"reason": "x"}, 400, "since"},
		{"POST", "/api/v1/requests/replay", op, map[string]any{"since": since}, 400, "reason"},
		{"POST", "/api/v1/requests/replay", op, map[string]any{"since": since, "type": "Nope", "reason": "x"}, 400, "nothing to replay"},
		{"POST", "/api/v1/requests/replay", op, map[string]any{"since": since, "colour": "red", "reason": "x"}, 400, "body"},
		{"POST", "/api/v1/requests/repair", op, map[string]any{"event_id": deadLetter, "payload": "a string", "reason": "x"}, 400, "object"},
		{"POST", "/api/v1/requests/repair", op, map[string]any{"event_id": unknown, "headers": map[string]string{"a": "b"}, "reason": "x"}, 404, "no such"},
		{"POST", "/api/v1/requests/" + unknown + "/approve", ap, nil, 404, "no such request"},
		{"POST", "/api/v1/requests/not-a-uuid/cancel", op, nil, 400, "request id"},
		{"POST", "/api/v1/requests/" + mine + "/approve", ap, nil, 403, "two-person"},
		{"POST", "/api/v1/requests/" + mine + "/reject", ap, nil, 403, "two-person"},
		{"POST", "/api/v1/requests/" + mine + "/approve", op, nil, 403, "may not approve"},
		{"POST", "/api/v1/requests/" + expired + "/approve", ap, nil, 409, "expired"},
		{"POST", "/api/v1/requests/" + expired + "/cancel", op, nil, 409, "expired"},
	}
	before := r.state()
	for _, c := range cases {
		code, body := r.api(c.method, c.path, c.token, c.body)
		var e struct {
			Error struct{ Message string } `json:"error"`
		}
		if code != c.want || json.Unmarshal(body, &e) != nil || !strings.Contains(e.Error.Message, c.says) {
			t.Errorf("%s %s: %d %s; want %d saying %q", c.method, c.path, code, body, c.want, c.says)
		}
	}
	after := r.state()
	if after.backlog != before.backlog || after.dead != before.dead || after.requests != before.requests {
		t.Fatalf("bad requests changed %+v into %+v", before, after)
	}
}

// Failed sign-ins are audited and rate-limited: after five for one
// address, the sixth is refused even with the right password, and nothing
// about it reaches the password check.
func TestLoginRateLimit(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	u := r.users[ops.Viewer]
	b := r.browser()
	for i := range 5 {
		if code := b.signIn(u.name, fmt.Sprintf("wrong-%d-password", i)); code != http.StatusUnauthorized {
			t.Fatalf("wrong password %d: %d, want 401", i, code)
		}
	}
	if code := b.signIn(u.name, u.password); code != http.StatusTooManyRequests {
		t.Fatalf("sign-in after 5 failures: %d, want 429", code)
	}
	if code := r.browser().signIn(r.users[ops.Operator].name, r.users[ops.Operator].password); code != http.StatusTooManyRequests {
		t.Fatalf("another user from the same address: %d, want 429", code)
	}
	var failed, blockedNote int
	for _, a := range r.audit() {
		if a.Action == ops.ActionLoginFailed && a.Actor == "vera" {
			failed++
			if strings.Contains(a.Detail, "blocked") {
				blockedNote++
			}
		}
		if a.Action == ops.ActionLogin {
			t.Fatalf("a sign-in got through: %+v", a)
		}
	}
	if failed != 5 || blockedNote != 1 {
		t.Fatalf("%d failed sign-ins audited (%d saying blocked); want 5 (1)", failed, blockedNote)
	}
}

// The session cookie is HttpOnly, SameSite=Strict and on /, Secure with
// the __Host- prefix when the console is served over HTTPS; signing out
// ends the session.
func TestSessionCookie(t *testing.T) {
	t.Parallel()
	for _, secure := range []bool{false, true} {
		r := newRig(t, &rigOptions{users: true, cfg: console.Config{SecureCookies: secure}})
		b := r.browser()
		// By hand: a cookie jar keeps Secure cookies for https only.
		form, err := http.Get(r.url + "/login")
		if err != nil {
			t.Fatal(err)
		}
		m := tokenField.FindStringSubmatch(readAll(t, form))
		var loginCookie *http.Cookie
		for _, x := range form.Cookies() {
			if x.Name == "outbox_login" {
				loginCookie = x
			}
		}
		if m == nil || loginCookie == nil || !loginCookie.HttpOnly || loginCookie.Secure != secure || loginCookie.SameSite != http.SameSiteStrictMode {
			t.Fatalf("secure=%v: sign-in form token %v, cookie %+v", secure, m, loginCookie)
		}
		req, _ := http.NewRequestWithContext(r.ctx, "POST", r.url+"/login", strings.NewReader(url.Values{"token": {m[1]}, "name": {"vera"}, "password": {r.users[ops.Viewer].password}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.AddCookie(&http.Cookie{Name: loginCookie.Name, Value: loginCookie.Value})
		resp, err := b.c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("secure=%v: sign-in %d", secure, resp.StatusCode)
		}
		var c *http.Cookie
		for _, x := range resp.Cookies() {
			if strings.HasSuffix(x.Name, "outbox_session") {
				c = x
			}
		}
		if c == nil {
			t.Fatalf("secure=%v: no session cookie in %v", secure, resp.Header["Set-Cookie"])
		}
		wantName := map[bool]string{false: "outbox_session", true: "__Host-outbox_session"}[secure]
		if c.Name != wantName || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/" || c.Secure != secure || c.Domain != "" {
			t.Fatalf("secure=%v: cookie %+v", secure, c)
		}
		if got := resp.Header.Get("Strict-Transport-Security") != ""; got != secure {
			t.Fatalf("secure=%v: HSTS sent %v", secure, got)
		}
		if secure {
			continue // the cookie jar keeps Secure cookies for https only
		}
		b.login(r.users[ops.Viewer])
		if code, _ := b.post("/logout", nil, true); code != 303 {
			t.Fatalf("sign-out: %d", code)
		}
		if code, _ := b.get("/"); code != http.StatusSeeOther {
			t.Fatalf("overview after sign-out: %d, want a redirect to the sign-in", code)
		}
	}
}

// The Content-Security-Policy is a header with a fresh nonce per response
// and default-src 'none'; pages load their script and style with that
// nonce and have no inline script, event handler or style attribute.
func TestCSPHeader(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	csp := regexp.MustCompile(`^default-src 'none'; script-src 'nonce-([A-Za-z0-9_-]{24})'; style-src 'nonce-([A-Za-z0-9_-]{24})'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'$`)
	b := r.browser()
	b.login(r.users[ops.Operator])
	id := r.deadLetter()
	seen := map[string]bool{}
	for _, path := range []string{"/login", "/", "/dead-letters", "/dead-letters/" + id, "/audit", "/nothing-here", "/api/v1/overview"} {
		req, _ := http.NewRequestWithContext(r.ctx, "GET", r.url+path, nil)
		resp, err := b.c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var page strings.Builder
		_, _ = fmt.Fprint(&page, readAll(t, resp))
		h := resp.Header
		m := csp.FindStringSubmatch(h.Get("Content-Security-Policy"))
		if m == nil || m[1] != m[2] {
			t.Fatalf("%s: Content-Security-Policy %q", path, h.Get("Content-Security-Policy"))
		}
		if seen[m[1]] {
			t.Fatalf("%s: nonce %s used twice", path, m[1])
		}
		seen[m[1]] = true
		for k, v := range map[string]string{"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"} {
			if h.Get(k) != v {
				t.Errorf("%s: %s %q, want %q", path, k, h.Get(k), v)
			}
		}
		if !strings.HasPrefix(h.Get("Content-Type"), "text/html") {
			continue
		}
		p := page.String()
		for _, tag := range regexp.MustCompile(`<(script|link)[^>]*>`).FindAllString(p, -1) {
			if !strings.Contains(tag, `nonce="`+m[1]+`"`) || !strings.Contains(tag, `src="/static/`) && !strings.Contains(tag, `href="/static/`) {
				t.Errorf("%s: %s without this response's nonce or not from /static/", path, tag)
			}
		}
		if regexp.MustCompile(`<script[^>]*>[^<]`).MatchString(p) || regexp.MustCompile(`(?i)\son[a-z]+=|\sstyle=|javascript:`).MatchString(p) {
			t.Errorf("%s: inline script, event handler or style attribute in\n%s", path, p)
		}
	}
}

// Fail closed: without users the console does not start unless in dev
// mode; a Store that cannot serve it is refused; dev mode answers only
// requests that name a loopback host.
func TestFailClosed(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	o, err := ops.New(outboxpgx.New(pool), tb, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []*console.Config{nil, {}, {Users: &console.Users{}}} {
		if _, err := console.New(o, cfg); err == nil || !strings.Contains(err.Error(), "no users") {
			t.Fatalf("New(%+v) = %v; want a refusal for want of users", cfg, err)
		}
	}
	bad := &console.Users{Users: []console.User{{Name: "x", Role: "root", PasswordHash: "nope"}}}
	if _, err := console.New(o, &console.Config{Users: bad}); err == nil {
		t.Fatal("New accepted a user with an unknown role and no hash")
	}
	for _, addr := range []string{"127.0.0.1:8080", "localhost:1", "[::1]:80"} {
		if !console.LoopbackAddr(addr) {
			t.Errorf("LoopbackAddr(%q) = false", addr)
		}
	}
	for _, addr := range []string{":8080", "0.0.0.0:8080", "10.0.0.1:80", "example.com:80", "[::]:80"} {
		if console.LoopbackAddr(addr) {
			t.Errorf("LoopbackAddr(%q) = true", addr)
		}
	}

	r := newRig(t, &rigOptions{cfg: console.Config{Dev: true}})
	b := r.browser()
	code, page := b.get("/")
	if code != 200 || !strings.Contains(string(page), "Dev mode") || !strings.Contains(string(page), `id="user">dev<`) {
		t.Fatalf("dev mode overview: %d\n%s", code, page)
	}
	req, _ := http.NewRequestWithContext(r.ctx, "GET", r.url+"/", nil)
	req.Host = "attacker.example:8080"
	if code, _ := r.do(http.DefaultClient, req); code != http.StatusMisdirectedRequest {
		t.Fatalf("dev mode, Host attacker.example: %d, want 421", code)
	}
	if code, _ := r.api("GET", "/api/v1/overview", "", nil); code != 401 {
		t.Fatalf("dev mode API without a token: %d, want 401", code)
	}
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return b.String()
}

// The dead letters' destination filter follows the relays' routing on
// every database: it lists the dead letters routed there, page by page,
// and nothing for a destination nothing is routed to.
func TestDeadLettersFilteredByDestination(t *testing.T) {
	t.Parallel()
	onEveryDB(t, nil, func(t *testing.T, r *rig) {
		var rows []testenv.DeadLetterRow
		for i := range 6 {
			agg := "order"
			if i%2 == 1 {
				agg = "payment"
			}
			rows = append(rows, testenv.DeadLetterRow{AggregateType: agg, AggregateID: testenv.Hex(t), Type: "Failed", LastError: "x"})
		}
		ids := r.fx.addDeadLetters(t, r.tb, rows...)
		viewer := r.users[ops.Viewer].token
		list := func(dest string) []string {
			t.Helper()
			var got []string
			path := "/api/v1/dead-letters?limit=2&destination=" + url.QueryEscape(dest)
			for pages := 0; ; pages++ {
				if pages > len(ids) {
					t.Fatal("more pages than dead letters")
				}
				code, body := r.api("GET", path, viewer, nil)
				if code != 200 {
					t.Fatalf("GET %s: %d %s", path, code, body)
				}
				var page struct {
					DeadLetters []struct {
						ID string `json:"id"`
					} `json:"dead_letters"`
					Next string `json:"next"`
				}
				if err := json.Unmarshal(body, &page); err != nil {
					t.Fatalf("GET %s: %v in %s", path, err, body)
				}
				for _, d := range page.DeadLetters {
					got = append(got, d.ID)
				}
				if page.Next == "" {
					return got
				}
				path = "/api/v1/dead-letters?limit=2&destination=" + url.QueryEscape(dest) + "&after=" + url.QueryEscape(page.Next)
			}
		}
		if got, want := strings.Join(list("outbox.event.payment"), ","), strings.Join([]string{ids[1], ids[3], ids[5]}, ","); got != want {
			t.Errorf("destination outbox.event.payment: listed %s; want %s", got, want)
		}
		if got := list("outbox.event.nope"); len(got) != 0 {
			t.Errorf("destination outbox.event.nope: listed %v; want none", got)
		}
	})
}
