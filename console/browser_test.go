package console_test

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
)

// EnvChromium names the Chromium the browser test runs (default
// chromium, found on the PATH); EnvScreenshots a directory for its screenshots
// (docs/console to refresh the documentation's).
const (
	EnvChromium    = "OUTBOX_TEST_CHROMIUM"
	EnvScreenshots = "OUTBOX_CONSOLE_SCREENSHOTS"
)

func chromium(t *testing.T) string {
	t.Helper()
	path := os.Getenv(EnvChromium)
	if path == "" {
		path = "chromium"
	}
	exe, err := exec.LookPath(path)
	if err != nil {
		t.Fatalf("no Chromium %q (set %s to use another): install it with: apt-get update && apt-get install -y chromium", path, EnvChromium)
	}
	return exe
}

// A real browser: a viewer signs in, sees the overview and a dead letter
// but no way to retry it, and a retry posted from that page is refused; a
// POST without the CSRF token is refused; an operator signs in and
// retries the dead letter, which goes back into the outbox, audited.
// Screenshots of each view are taken for the documentation.
func TestBrowser(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	r.scenery()
	target := r.deadLetter()
	c := newChrome(t, r)
	do, shot, signIn, eval, post := c.do, c.shot, c.signIn, c.eval, c.post

	// The viewer.
	viewer := r.users[ops.Viewer]
	do("viewer signs in", signIn(viewer))
	if who := eval("who", `document.querySelector("#user").textContent + " " + document.querySelector("#role").textContent`); who != "vera viewer" {
		t.Fatalf("signed in as %q, want vera viewer", who)
	}
	do("viewer opens the dead letter", chromedp.Navigate(r.url+"/dead-letters/"+target), chromedp.WaitVisible(chromedp.ID("no-actions")),
		shot("dead-letter-viewer.png"))
	if forms := eval("forms", `String(document.querySelectorAll("#retry, #discard").length)`); forms != "0" {
		t.Fatalf("the viewer's page of a dead letter has %s retry or discard forms", forms)
	}
	if code := post("/dead-letters/"+target+"/retry", true); code != "403" {
		t.Fatalf("retry posted by the viewer: %s, want 403", code)
	}
	if code := post("/dead-letters/"+target+"/retry", false); code != "403" {
		t.Fatalf("retry posted by the viewer without the CSRF token: %s, want 403", code)
	}
	if _, err := r.st.DeadLetter(r.ctx, r.tb, target); err != nil {
		t.Fatalf("the dead letter after the viewer's attempts: %v", err)
	}
	do("viewer signs out", chromedp.Click(chromedp.CSS(`form[action="/logout"] button`)), chromedp.WaitVisible(chromedp.ID("login")))

	// The operator.
	operator := r.users[ops.Operator]
	do("operator signs in", signIn(operator), shot("overview.png"),
		chromedp.Navigate(r.url+"/dead-letters"), chromedp.WaitVisible(chromedp.ID("dead-letters")), shot("dead-letters.png"),
		chromedp.Navigate(r.url+"/dead-letters/"+target), chromedp.WaitVisible(chromedp.ID("retry")))
	if code := post("/dead-letters/"+target+"/retry", false); code != "403" {
		t.Fatalf("the operator's retry without the CSRF token: %s, want 403", code)
	}
	do("operator retries",
		chromedp.SendKeys(chromedp.CSS(`#retry input[name=reason]`), "broker fixed"),
		shot("dead-letter.png"),
		chromedp.Click(chromedp.CSS(`#retry button`)),
		chromedp.WaitVisible(chromedp.ID("flash")),
		chromedp.Navigate(r.url+"/audit"), chromedp.WaitVisible(chromedp.ID("audit")), shot("audit.png"),
	)
	if _, err := r.st.DeadLetter(r.ctx, r.tb, target); err == nil {
		t.Fatal("the dead letter is still there after the operator's retry")
	}
	var back bool
	if err := r.pool.QueryRow(r.ctx, `SELECT EXISTS (SELECT 1 FROM `+r.tb.Qualified("")+` WHERE id = $1 AND published_at IS NULL)`, target).Scan(&back); err != nil || !back {
		t.Fatalf("the retried event is not pending in the outbox (%v)", err)
	}
	recs, err := r.st.FindAudit(r.ctx, r.tb, outboxdriver.AuditQuery{EventID: target, Limit: 10})
	if err != nil || len(recs) != 1 || recs[0].Action != "retry" || recs[0].Actor != "otto" || recs[0].Role != "operator" || recs[0].Reason != "broker fixed" {
		t.Fatalf("audit of the retried event: %+v, %v", recs, err)
	}
	var denied int
	for _, a := range r.audit() {
		if a.Action == ops.ActionDenied && (a.Actor == "vera" || a.Actor == "otto") && strings.Contains(a.Detail, "retry") {
			denied++
		}
	}
	if denied != 3 {
		t.Fatalf("%d refused retries audited, want 3 (the viewer's, and two without a CSRF token)", denied)
	}
}

// scenery gives the screenshots something to show: pending events, a few
// dead letters of different kinds, and relays holding partitions.
func (r *rig) scenery() {
	r.t.Helper()
	var rows []outboxdriver.Row
	for i := range 40 {
		rows = append(rows, outboxdriver.Row{ID: uuid.Must(uuid.NewV7()).String(), AggregateType: "order", AggregateID: fmt.Sprint(i % 7),
			Type: "OrderPlaced", Payload: []byte(fmt.Sprintf(`{"orderId":%d}`, i))})
	}
	if err := r.st.Insert(r.ctx, r.tb, rows); err != nil {
		r.t.Fatal(err)
	}
	testenv.AddDeadLetters(r.t, r.pool, r.tb,
		testenv.DeadLetterRow{AggregateType: "invoice", AggregateID: "INV-2024-0042", Type: "InvoiceIssued", Payload: `{"total":"99.50"}`,
			LastError: "permanent: schema registry rejected the payload: field total must be a number", Attempts: 1},
		testenv.DeadLetterRow{AggregateType: "customer", AggregateID: "c-981", Type: "CustomerMoved", Payload: `{"city":"Bonn"}`,
			LastError: "webhook https://crm.example/hooks answered 410 Gone", Attempts: 8, Held: true},
	)
	if _, err := r.pool.Exec(r.ctx, `UPDATE `+r.tb.Qualified("_leases")+` SET owner = CASE WHEN partition % 2 = 0 THEN 'relay-a-7f3c' ELSE 'relay-b-19d2' END,
		epoch = 3, expires_at = now() + interval '25 seconds' WHERE partition < 12`); err != nil {
		r.t.Fatal(err)
	}
}
