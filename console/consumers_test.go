package console_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/ops"
)

// hostile is a consumer's dead letter as a hostile producer could make it:
// markup in every field a page shows.
func (r *rig) hostileConsumerDeadLetter() (id, event string) {
	r.t.Helper()
	event = `<script id="pwned">alert(1)</script>`
	if err := r.inboxDL(inbox.DeadLetter{Consumer: "billing", EventID: event, AggregateType: `"><img id="pwned" src=x>`,
		AggregateID: "7", Type: `<b id="pwned">T</b>`, Destination: `</code><i id="pwned">`,
		Headers: map[string]string{`<h1 id="pwned">`: `</td><script id="pwned"></script>`},
		Payload: []byte(`{"note":"</pre><script id=\"pwned\"></script>","customer":{"email":"ann@example.com"}}`),
		Error:   `</pre><iframe id="pwned"></iframe>`}); err != nil {
		r.t.Fatal(err)
	}
	dls, err := r.ib.DeadLetters(r.ctx, ops.Actor{Name: "setup", Role: ops.Viewer}, "billing", 500)
	if err != nil || len(dls) == 0 {
		r.t.Fatalf("dead letters: %v, %v", dls, err)
	}
	return fmt.Sprint(dls[len(dls)-1].ID), event
}

// The consumers page shows a consumer's figures and dead letters to a
// viewer, every hostile field escaped and the sensitive paths masked, with
// no way to act; an operator retries (the dead letter is marked for
// retry) and discards (it is gone), each with the CSRF token and audited
// with the event id; without the token nothing changes.
func TestConsumersPage(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	id, event := r.hostileConsumerDeadLetter()
	page := "/consumers/billing/dead-letters/" + id

	viewer := r.browser()
	viewer.login(r.users[ops.Viewer])
	code, body := viewer.get("/consumers?consumer=billing")
	if code != http.StatusOK || !strings.Contains(string(body), `id="dead-letter-count">1 (0 marked for retry)`) ||
		!strings.Contains(string(body), `href="/consumers/billing/dead-letters/`+id+`"`) {
		t.Fatalf("consumers page for the viewer: %d\n%s", code, body)
	}
	code, detail := viewer.get(page)
	if code != http.StatusOK {
		t.Fatalf("dead letter page: %d\n%s", code, detail)
	}
	for name, b := range map[string][]byte{"list": body, "detail": detail} {
		if strings.Contains(string(b), `id="pwned"`) {
			t.Errorf("the %s page carries hostile markup unescaped:\n%s", name, b)
		}
	}
	for _, want := range []string{"&lt;script id=&#34;pwned&#34;&gt;alert(1)&lt;/script&gt;", "&lt;/pre&gt;&lt;iframe", `&#34;email&#34;: &#34;***&#34;`, `id="no-actions"`} {
		if !strings.Contains(string(detail), want) {
			t.Errorf("dead letter page lacks %q:\n%s", want, detail)
		}
	}
	if strings.Contains(string(detail), "ann@example.com") || strings.Contains(string(detail), `id="retry"`) {
		t.Errorf("the viewer's page shows the masked email or a retry form:\n%s", detail)
	}
	if code, _ := viewer.post(page+"/retry", url.Values{"reason": {"no"}}, true); code != http.StatusForbidden {
		t.Fatalf("retry by the viewer: %d, want 403", code)
	}

	operator := r.browser()
	operator.login(r.users[ops.Operator])
	if code, detail := operator.get(page); code != http.StatusOK || !strings.Contains(string(detail), `id="retry"`) {
		t.Fatalf("the operator's page has no retry form: %d\n%s", code, detail)
	}
	if code, _ := operator.post(page+"/retry", url.Values{"reason": {"no token"}}, false); code != http.StatusForbidden {
		t.Fatalf("retry without the CSRF token: %d, want 403", code)
	}
	st, err := r.ib.Status(r.ctx, ops.Actor{Name: "check", Role: ops.Viewer}, "billing")
	if err != nil || st.DeadLetters != 1 || st.RetryRequested != 0 {
		t.Fatalf("after refused retries: %+v, %v; want one dead letter, not marked", st, err)
	}
	mark := r.lastAuditID()
	if code, _ := operator.post(page+"/retry", url.Values{"reason": {"customer imported"}}, true); code != http.StatusSeeOther {
		t.Fatalf("retry by the operator: %d, want 303", code)
	}
	if st, err := r.ib.Status(r.ctx, ops.Actor{Name: "check", Role: ops.Viewer}, "billing"); err != nil || st.RetryRequested != 1 {
		t.Fatalf("after the retry: %+v, %v; want the dead letter marked for retry", st, err)
	}
	if code, _ := operator.post(page+"/discard", url.Values{"reason": {"never mind"}}, true); code != http.StatusSeeOther {
		t.Fatalf("discard by the operator: %d, want 303", code)
	}
	if code, _ := operator.get(page); code != http.StatusNotFound {
		t.Fatalf("the discarded dead letter's page: %d, want 404", code)
	}
	rows := r.auditSince(mark)
	if len(rows) != 2 {
		t.Fatalf("audit rows of the retry and discard: %+v", rows)
	}
	for i, want := range []string{ops.ActionInboxRetry, ops.ActionInboxDiscard} {
		a := rows[i]
		if a.Action != want || a.Actor != "otto" || a.Role != "operator" || a.EventID != "" || !strings.Contains(a.Detail, "dead letter "+id) {
			t.Errorf("audit row %d: %+v; want %s by otto naming dead letter %s (its event id %q is no UUID)", i, a, want, id, event)
		}
	}
	if rows[0].Reason != "customer imported" {
		t.Errorf("retry's reason %q", rows[0].Reason)
	}
}
