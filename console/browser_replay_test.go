package console_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/relayd"
	"github.com/outboxkit/outbox/route"
	"github.com/outboxkit/outbox/sink/natssink"
)

// A real browser and a real relay (relayd, retention keep) to NATS
// JetStream: operator A previews and requests a replay, and proposes a
// repair; A's approval is refused; approver B approves the replay; the
// console's executor carries it out and the relay publishes the copies to
// JetStream in per-aggregate order with outbox-replay-id and
// outbox-replay-of. Screenshots of the request views are taken for the
// documentation.
func TestBrowserReplay(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	_, js := testenv.JetStream(t)
	stream, prefix := testenv.Stream(t, js)
	router, err := route.New(&route.Config{Replacement: prefix + ".event.${routedByValue}"})
	if err != nil {
		t.Fatal(err)
	}
	snk, err := natssink.DialStream(r.ctx, testenv.NATSURL(), &natssink.Config{Stream: prefix, NoCreateStream: true})
	if err != nil {
		t.Fatal(err)
	}
	rl, err := relayd.Open(r.ctx, testenv.DatabaseURL(), snk, &relayd.Options{
		Schema: r.tb.Schema, Table: r.tb.Name, Retention: outboxdriver.RetentionKeep,
		Relay: relay.Config{Router: router, PollInterval: 50 * time.Millisecond, LeaseTTL: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := rl.Start(r.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rl.Stop(testenv.Context(t, 30*time.Second)) })
	exec, err := r.op.NewExecutor(&ops.ExecutorConfig{Name: "console-a", BatchSize: 5, Poll: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := exec.Start(r.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = exec.Stop(testenv.Context(t, 30*time.Second)) })

	// Twelve orders over three aggregates and three invoices, published
	// and kept.
	var rows []outboxdriver.Row
	for i := range 15 {
		typ, agg := "order", fmt.Sprint("A", i%3)
		if i >= 12 {
			typ, agg = "invoice", "I1"
		}
		rows = append(rows, outboxdriver.Row{ID: uuid.Must(uuid.NewV7()).String(), AggregateType: typ, AggregateID: agg,
			Type: "Placed", Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))})
	}
	if err := r.st.Insert(r.ctx, r.tb, rows); err != nil {
		t.Fatal(err)
	}
	testenv.WaitStreamMsgs(t, stream, 15, 30*time.Second)
	waitKept(t, r, 15)
	deadLetter := r.deadLetter()

	c := newChrome(t, r)
	operator, approver := r.users[ops.Operator], r.users[ops.Approver]
	since := time.Now().Add(-time.Hour).UTC().Format("2006-01-02T15:04")
	c.do("operator previews a replay", c.signIn(operator),
		chromedp.Navigate(r.url+"/replay"), chromedp.WaitVisible(chromedp.ID("replay-filter")),
		chromedp.SendKeys(chromedp.CSS(`#replay-filter input[name=since]`), since),
		chromedp.SendKeys(chromedp.CSS(`#replay-filter input[name=aggregatetype]`), "order"),
		chromedp.SetValue(chromedp.CSS(`#replay-filter select[name=ids]`), "new"),
		chromedp.Submit(chromedp.ID("replay-filter")),
		chromedp.WaitVisible(chromedp.ID("preview-count")))
	if n := c.eval("preview", `document.querySelector("#preview-count").textContent`); !strings.HasPrefix(n, "12 event(s)") {
		t.Fatalf("preview says %q, want 12 events", n)
	}
	c.do("operator requests the replay",
		chromedp.SendKeys(chromedp.CSS(`#request-replay input[name=reason]`), "billing lost its read model; rebuild from orders"),
		c.shot("replay.png"),
		chromedp.Click(chromedp.CSS(`#request-replay button`)),
		chromedp.WaitVisible(chromedp.ID("state")), c.shot("request.png"))
	id := strings.TrimPrefix(c.eval("location", `location.pathname`), "/requests/")
	if _, err := uuid.Parse(id); err != nil {
		t.Fatalf("after the request the browser is at %q", id)
	}
	if n := c.eval("approve form", `String(document.querySelectorAll("#approve").length)`); n != "0" {
		t.Fatal("the requester's page offers to approve")
	}
	if code := c.post("/requests/"+id+"/approve", true); code != "403" {
		t.Fatalf("the requester's approval: %s, want 403", code)
	}
	c.do("operator proposes a repair",
		chromedp.Navigate(r.url+"/dead-letters/"+deadLetter), chromedp.WaitVisible(chromedp.ID("repair-link")),
		chromedp.Navigate(r.url+"/dead-letters/"+deadLetter+"/repair"), chromedp.WaitVisible(chromedp.ID("repair")),
		chromedp.SetValue(chromedp.CSS(`#repair textarea[name=payload]`), `{"orderId": 42, "customer": {"email": "***"}, "currency": "EUR"}`),
		chromedp.SendKeys(chromedp.CSS(`#repair input[name=reason]`), "currency was missing"),
		c.shot("repair.png"),
		chromedp.Submit(chromedp.ID("repair")),
		chromedp.WaitVisible(chromedp.ID("repair-after")), c.shot("repair-request.png"),
		chromedp.Click(chromedp.CSS(`form[action="/logout"] button`)), chromedp.WaitVisible(chromedp.ID("login")))

	c.do("approver approves", c.signIn(approver),
		chromedp.Navigate(r.url+"/requests"), chromedp.WaitVisible(chromedp.ID("requests")), c.shot("requests.png"),
		chromedp.Navigate(r.url+"/requests/"+id), chromedp.WaitVisible(chromedp.ID("approve")),
		chromedp.SendKeys(chromedp.CSS(`#approve input[name=reason]`), "checked with billing"),
		chromedp.Click(chromedp.CSS(`#approve button`)), chromedp.WaitVisible(chromedp.ID("flash")))
	await.Eventually(t, 60*time.Second, func() error {
		c.do("reload", chromedp.Navigate(r.url+"/requests/"+id), chromedp.WaitVisible(chromedp.ID("state")))
		state := c.eval("state", `document.querySelector("#state").textContent`)
		if state == outboxdriver.StateDone {
			return nil
		}
		if state != outboxdriver.StateApproved && state != outboxdriver.StateExecuting {
			t.Fatalf("the approved replay is %s", state)
		}
		return fmt.Errorf("the approved replay is %s", state)
	})
	c.do("the audit of the request", c.shot("request-done.png"),
		chromedp.Navigate(r.url+"/audit?request_id="+id), chromedp.WaitVisible(chromedp.ID("audit")), c.shot("audit-request.png"))

	// The copies reach JetStream after the originals, in order per
	// aggregate, marked as replays.
	testenv.WaitStreamMsgs(t, stream, 27, 60*time.Second)
	msgs := testenv.StreamMessages(t, stream)
	originals := map[string]int{}
	for _, m := range msgs[:15] {
		var p struct{ N int }
		_ = json.Unmarshal(m.Data, &p)
		originals[m.Header.Get("id")] = p.N
	}
	last := map[string]int{}
	seen := map[int]bool{}
	for _, m := range msgs[15:] {
		var p struct{ N int }
		if err := json.Unmarshal(m.Data, &p); err != nil {
			t.Fatal(err)
		}
		of := m.Header.Get("outbox-replay-of")
		if m.Header.Get("outbox-replay-id") != id || of == "" || of == m.Header.Get("id") || originals[of] != p.N || m.Subject != prefix+".event.order" {
			t.Fatalf("replayed message %s %v %s: want outbox-replay-id %s and outbox-replay-of the original of n=%d", m.Subject, m.Header, m.Data, id, p.N)
		}
		agg := fmt.Sprint("A", p.N%3)
		if prev, ok := last[agg]; (ok && p.N < prev) || seen[p.N] {
			t.Fatalf("aggregate %s: event %d after %d (or twice)", agg, p.N, prev)
		}
		last[agg], seen[p.N] = p.N, true
	}
	if len(seen) != 12 {
		t.Fatalf("%d distinct orders replayed, want 12", len(seen))
	}
}

// waitKept waits until n published events are kept in the table.
func waitKept(t *testing.T, r *rig, n int) {
	t.Helper()
	await.Eventually(t, 30*time.Second, func() error {
		var kept int
		if err := r.pool.QueryRow(r.ctx, `SELECT count(*) FROM `+r.tb.Qualified("")+` WHERE published_at IS NOT NULL`).Scan(&kept); err != nil {
			t.Fatal(err)
		}
		if kept < n {
			return fmt.Errorf("%d published events kept, want %d", kept, n)
		}
		return nil
	})
}
