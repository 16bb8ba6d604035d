package console_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
)

// The role is checked before the input: on every state-changing route, a
// role that may not do it gets 403 and a denied audit row naming the
// event or request of the path, whatever it sends (a body with an unknown
// field, a form with nothing but the CSRF token), and nothing changes.
func TestRoleCheckedBeforeInput(t *testing.T) {
	t.Parallel()
	onEveryDB(t, nil, func(t *testing.T, r *rig) {
		newest := func() outboxdriver.AuditRecord {
			if recs := r.audit(); len(recs) > 0 {
				return recs[0]
			}
			return outboxdriver.AuditRecord{}
		}
		// The two cases found by hand.
		id := r.deadLetter()
		viewer := r.users[ops.Viewer]
		code, body := r.api("POST", "/api/v1/dead-letters/"+id+"/retry", viewer.token, map[string]string{"reason": "x", "path": "a"})
		if a := newest(); code != http.StatusForbidden || a.Action != ops.ActionDenied || a.Actor != "vera" || a.EventID != id {
			t.Fatalf("a viewer's retry with an unknown field: %d %s, newest audit %+v; want 403 and a denied row naming the event", code, body, a)
		}
		b := r.browser()
		b.login(r.users[ops.Approver])
		if code, page := b.post("/pauses", nil, true); code != http.StatusForbidden || newest().Action != ops.ActionDenied || newest().Actor != "anna" {
			t.Fatalf("an approver's pause with only the CSRF token: %d, newest audit %+v\n%s", code, newest(), page)
		}

		// Every route: malformed input from each role the route refuses.
		browsers := map[ops.Role]*browser{}
		for _, rt := range r.srv.Routes() {
			if rt.Public || rt.Method == "GET" {
				continue
			}
			if rt.Permission == "" && rt.Pattern != "/logout" {
				t.Errorf("%s %s names no permission", rt.Method, rt.Pattern)
			}
			for _, role := range ops.Roles() {
				if rt.Permission == "" || role.May(rt.Permission) {
					continue
				}
				u := r.users[role]
				id, path, _, _ := r.target(rt.Method, rt.Pattern)
				before := r.state()
				if rt.API {
					code, body = r.api("POST", path, u.token, map[string]any{"colour": "red", "reason": strings.Repeat("x", 5000)})
				} else {
					if browsers[role] == nil {
						browsers[role] = r.browser()
						browsers[role].login(u)
					}
					code, body = browsers[role].post(path, url.Values{"kind": {"nonsense"}, "since": {"soon"}, "reason": {strings.Repeat("x", 5000)}}, true)
				}
				a := newest()
				if code != http.StatusForbidden || a.Action != ops.ActionDenied || a.Actor != u.name || a.Role != string(role) {
					t.Errorf("%s %s as %s with malformed input: %d %s, newest audit %+v; want 403 and a denied row", rt.Method, rt.Pattern, role, code, body, a)
					continue
				}
				wantEvent, wantRequest := "", ""
				switch {
				case strings.Contains(rt.Pattern, "/requests/{id}"):
					wantRequest = id
				case strings.HasPrefix(rt.Pattern, "/consumers/"):
					// A consumer's dead letter is a number, not an event id:
					// the denial is refused before it is read.
				case strings.Contains(rt.Pattern, "{id}"):
					wantEvent = id
				}
				if a.EventID != wantEvent || a.RequestID != wantRequest {
					t.Errorf("%s %s as %s: denied row %+v; want event %q, request %q", rt.Method, rt.Pattern, role, a, wantEvent, wantRequest)
				}
				if after := r.state(); after.backlog != before.backlog || after.dead != before.dead || after.pauses != before.pauses || after.requests != before.requests {
					t.Errorf("%s %s as %s was refused but changed %+v into %+v", rt.Method, rt.Pattern, role, before, after)
				}
			}
		}
	})
}

// A cross-origin state change is refused and audited as the user whose
// session or API token came with it, naming the event of the path.
func TestCrossOriginRefusalNamesTheUser(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	id := r.deadLetter()
	b := r.browser()
	b.login(r.users[ops.Operator])
	req, _ := http.NewRequestWithContext(r.ctx, "POST", r.url+"/dead-letters/"+id+"/retry", strings.NewReader(url.Values{"csrf": {b.csrf}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	if code, _ := r.do(b.c, req); code != http.StatusForbidden {
		t.Fatalf("cross-site POST with a session: %d, want 403", code)
	}
	if a := r.audit()[0]; a.Action != ops.ActionDenied || a.Actor != "otto" || a.Role != "operator" || a.EventID != id || !strings.Contains(a.Detail, "cross-origin") {
		t.Fatalf("cross-site POST with otto's session audited as %+v", a)
	}
	req, _ = http.NewRequestWithContext(r.ctx, "POST", r.url+"/api/v1/dead-letters/"+id+"/discard", nil)
	req.Header.Set("Authorization", "Bearer "+r.users[ops.Viewer].token)
	req.Header.Set("Origin", "https://attacker.example")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	if code, _ := r.do(http.DefaultClient, req); code != http.StatusForbidden {
		t.Fatalf("cross-site POST with a token: %d, want 403", code)
	}
	if a := r.audit()[0]; a.Action != ops.ActionDenied || a.Actor != "vera" || a.Role != "viewer" || a.EventID != id {
		t.Fatalf("cross-site POST with vera's token audited as %+v", a)
	}
	req, _ = http.NewRequestWithContext(r.ctx, "POST", r.url+"/dead-letters/"+id+"/retry", nil)
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	if code, _ := r.do(http.DefaultClient, req); code != http.StatusForbidden || r.audit()[0].Actor != "(anonymous)" {
		t.Fatalf("cross-site POST with nothing: %d, audited as %+v; want 403 by (anonymous)", code, r.audit()[0])
	}
	if _, err := r.st.DeadLetter(r.ctx, r.tb, id); err != nil {
		t.Fatalf("the dead letter after refused requests: %v", err)
	}
}
