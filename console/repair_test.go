package console_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
)

// The page of a repair request shows what the repair changes: a field
// dropped is marked removed, a changed sensitive value is listed masked.
func TestRepairPageShowsChanges(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	id := r.deadLetter() // {"orderId":42,"customer":{"email":"ada@example.com"}}, tenant t1
	code, body := r.api("POST", "/api/v1/requests/repair", r.users[ops.Operator].token, map[string]any{"event_id": id,
		"payload": map[string]any{"customer": map[string]any{"email": "eve@example.com"}}, "reason": "drop the order id"})
	var req outboxdriver.Request
	if code != http.StatusCreated || json.Unmarshal(body, &req) != nil {
		t.Fatalf("repair request: %d %s", code, body)
	}
	b := r.browser()
	b.login(r.users[ops.Approver])
	code, page := b.get("/requests/" + req.ID)
	p := string(page)
	if code != http.StatusOK || !strings.Contains(p, `id="repair-changes"`) {
		t.Fatalf("the repair's page: %d, no table of changes\n%s", code, p)
	}
	for _, want := range []string{
		`<tr class="change-removed"><td><span class="tag change-removed">removed</span></td>
    <td>payload <code>orderId</code></td><td><del><code>42</code></del></td><td></td></tr>`,
		`<td>payload <code>customer.email</code></td><td><del><code>&#34;***&#34;</code></del></td><td><ins><code>&#34;***&#34;</code></ins></td>`,
	} {
		if !strings.Contains(p, want) {
			t.Errorf("the repair's page does not show\n%s\nin\n%s", want, p)
		}
	}
	if strings.Contains(p, "eve@example.com") || strings.Contains(p, "ada@example.com") {
		t.Fatalf("the repair's page shows a masked value:\n%s", p)
	}
}
