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
	// The event's audit: the retry, after the three refused attempts (each
	// naming the event).
	recs, err := r.st.FindAudit(r.ctx, r.tb, outboxdriver.AuditQuery{EventID: target, Limit: 10})
	if err != nil || len(recs) != 4 || recs[0].Action != "retry" || recs[0].Actor != "otto" || recs[0].Role != "operator" || recs[0].Reason != "broker fixed" {
		t.Fatalf("audit of the retried event: %+v, %v", recs, err)
	}
	for _, a := range recs[1:] {
		if a.Action != ops.ActionDenied {
			t.Fatalf("audit of the retried event: %+v; want the retry and three refusals", recs)
		}
	}
	r.browserControl(t, do, shot)

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

// browserControl: the operator pauses an aggregate type and resumes it,
// releases a held aggregate, and looks at the failure groups.
func (r *rig) browserControl(t *testing.T, do func(string, ...chromedp.Action[chromedp.Void]), shot func(string) chromedp.Action[chromedp.Void]) {
	t.Helper()
	do("operator pauses invoice",
		chromedp.Navigate(r.url+"/pauses"), chromedp.WaitVisible(chromedp.ID("no-pauses")),
		chromedp.SendKeys(chromedp.CSS(`#pause input[name=value]`), "invoice"),
		chromedp.SendKeys(chromedp.CSS(`#pause input[name=reason]`), "schema registry migration"),
		chromedp.Click(chromedp.CSS(`#pause button`)),
		chromedp.WaitVisible(chromedp.ID("flash")), chromedp.WaitVisible(chromedp.ID("pauses")), shot("pauses.png"))
	st, err := r.st.Status(r.ctx, r.tb)
	if err != nil || len(st.Pauses) != 1 || st.Pauses[0].String() != "aggregatetype=invoice" || st.Pauses[0].Actor != "otto" || st.Pauses[0].Reason != "schema registry migration" {
		t.Fatalf("pauses after the operator paused invoice: %+v, %v", st.Pauses, err)
	}
	do("operator resumes invoice",
		chromedp.SendKeys(chromedp.CSS(`#pauses form.resume input[name=reason]`), "migration done"),
		chromedp.Click(chromedp.CSS(`#pauses form.resume button`)),
		chromedp.WaitVisible(chromedp.ID("flash")), chromedp.WaitVisible(chromedp.ID("no-pauses")))
	if ps, err := r.st.ListPauses(r.ctx, r.tb); err != nil || len(ps) != 0 {
		t.Fatalf("pauses after resume: %+v, %v", ps, err)
	}

	hs, err := r.st.HeldAggregates(r.ctx, r.tb, 100)
	if err != nil {
		t.Fatal(err)
	}
	var holder string
	for _, h := range hs {
		if h.AggregateID == "c-981" {
			holder = h.EventID
		}
	}
	if holder == "" {
		t.Fatalf("customer/c-981 is not held: %+v", hs)
	}
	form := `form[action="/held/` + holder + `/release"]`
	do("operator releases customer/c-981",
		chromedp.Navigate(r.url+"/held"), chromedp.WaitVisible(chromedp.CSS(form)),
		chromedp.SendKeys(chromedp.CSS(form+` input[name=reason]`), "CRM retired the hook"),
		shot("held.png"),
		chromedp.Click(chromedp.CSS(form+` button`)),
		chromedp.WaitVisible(chromedp.ID("flash")))
	if d, err := r.st.DeadLetter(r.ctx, r.tb, holder); err != nil || d.Held {
		t.Fatalf("the dead letter behind customer/c-981 after release: held=%v, %v (want kept, holding nothing)", d.Held, err)
	}
	recs, err := r.st.FindAudit(r.ctx, r.tb, outboxdriver.AuditQuery{Actor: "otto", Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range recs[:3] {
		got = append(got, a.Action+":"+a.Reason)
	}
	if strings.Join(got, ",") != "release:CRM retired the hook,resume:migration done,pause:schema registry migration" {
		t.Fatalf("newest audit rows of otto: %v", got)
	}
	do("operator looks at the failure groups",
		chromedp.Navigate(r.url+"/failure-groups"), chromedp.WaitVisible(chromedp.ID("groups")), shot("failure-groups.png"))
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
	// An hour of samples for the chart: a burst the relays work off.
	if _, err := r.pool.Exec(r.ctx, `INSERT INTO `+r.tb.Qualified("_samples")+` (at, backlog, oldest_age, dead_letters, last_seq)
SELECT now() - (60 - i) * interval '1 minute', greatest(0, 4000 - abs(i - 25) * 160)::bigint + 40, 2, 2, i * 900
FROM generate_series(0, 59) AS i`); err != nil {
		r.t.Fatal(err)
	}
	if _, err := r.pool.Exec(r.ctx, `INSERT INTO `+r.tb.Qualified("_relays")+` (relay, expires_at) VALUES ('relay-a-7f3c', now() + interval '25 seconds'), ('relay-b-19d2', now() + interval '25 seconds')`); err != nil {
		r.t.Fatal(err)
	}
}
