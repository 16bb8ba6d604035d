package ops_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/contract"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
)

var (
	approverB = ops.Actor{Name: "bob", Role: ops.Approver}
	// anna as an operator: the same person who approves as anna.
	annaOperator = ops.Actor{Name: "anna", Role: ops.Operator}
)

// published adds n published events over three aggregates, interleaved,
// published between 10 and 5 minutes ago, and returns their ids in order.
func (r *rig) published(t *testing.T, n int) []string {
	t.Helper()
	var rows []testenv.PublishedRow
	for i := range n {
		rows = append(rows, testenv.PublishedRow{AggregateType: "order", AggregateID: fmt.Sprint("A", i%3), Type: "OrderPlaced",
			Payload: fmt.Sprintf(`{"n":%d}`, i), Ago: 10*time.Minute - time.Duration(i)*time.Second})
	}
	return testenv.AddPublished(t, r.pool, r.tb, rows...)
}

// copy is a replayed event waiting in the outbox.
type copyRow struct {
	id, aggregate, replayID, replayOf string
	n                                 int
}

// copies returns the pending events carrying outbox-replay-id, in the
// order the relay would claim them (seq).
func (r *rig) copies(t *testing.T) []copyRow {
	t.Helper()
	rows, err := r.pool.Query(r.ctx, `SELECT id::text, aggregateid, headers->>'outbox-replay-id', coalesce(headers->>'outbox-replay-of', ''), (payload->>'n')::int
FROM `+r.tb.Qualified("")+` WHERE published_at IS NULL AND headers ? 'outbox-replay-id' ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []copyRow
	for rows.Next() {
		var c copyRow
		if err := rows.Scan(&c.id, &c.aggregate, &c.replayID, &c.replayOf, &c.n); err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

// checkOrder fails unless copies hold each of want's events once, and
// each aggregate's in the original order.
func checkOrder(t *testing.T, copies []copyRow, want int) {
	t.Helper()
	if len(copies) != want {
		t.Fatalf("%d copies in the outbox, want %d", len(copies), want)
	}
	seen := map[int]bool{}
	last := map[string]int{}
	for _, c := range copies {
		if seen[c.n] {
			t.Fatalf("event %d re-enqueued twice", c.n)
		}
		seen[c.n] = true
		if prev, ok := last[c.aggregate]; ok && c.n < prev {
			t.Fatalf("aggregate %s: event %d after %d", c.aggregate, c.n, prev)
		}
		last[c.aggregate] = c.n
	}
}

func since() time.Time { return time.Now().Add(-time.Hour) }

func (r *rig) executor(t *testing.T, o *ops.Ops, cfg *ops.ExecutorConfig) *ops.Executor {
	t.Helper()
	e, err := o.NewExecutor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// The lifecycle of a replay: an operator requests it (with a preview); an
// operator cannot approve, nor can the requester as approver; another
// approver approves; the executor re-enqueues every selected event with
// its id, the replay header and in the original order per aggregate; each
// step is audited.
func TestReplayLifecycle(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	o := r.ops(t, nil)
	ids := r.published(t, 30)
	testenv.AddPublished(t, r.pool, r.tb, testenv.PublishedRow{AggregateType: "invoice", AggregateID: "I1", Type: "InvoiceIssued", Payload: `{"n":99}`, Ago: time.Minute})

	p := ops.ReplayParams{Since: since(), AggregateType: "order"}
	pv, err := o.PreviewReplay(r.ctx, viewer, p)
	if err != nil || pv.Count != 30 || len(pv.First) != ops.PreviewEvents || pv.First[0].ID != ids[0] {
		t.Fatalf("preview: %+v, %v", pv, err)
	}
	if _, err := o.RequestReplay(r.ctx, viewer, p, "consumer lost its data"); !errors.Is(err, ops.ErrDenied) {
		t.Fatalf("a viewer's request: %v, want ErrDenied", err)
	}
	if _, err := o.RequestReplay(r.ctx, annaOperator, p, ""); !isInput(err) {
		t.Fatalf("a request without a reason: %v, want an InputError", err)
	}
	req, err := o.RequestReplay(r.ctx, annaOperator, p, "consumer lost its data")
	if err != nil || req.State != outboxdriver.StatePending || req.Requester != "anna" || req.ExpiresAt.Sub(req.CreatedAt) < 59*time.Minute {
		t.Fatalf("request: %+v, %v", req, err)
	}
	if _, err := o.Approve(r.ctx, operator, req.ID, ""); !errors.Is(err, ops.ErrDenied) {
		t.Fatalf("an operator's approval: %v, want ErrDenied", err)
	}
	var self *ops.SelfApprovalError
	if _, err := o.Approve(r.ctx, approver, req.ID, "me"); !errors.As(err, &self) || !errors.Is(err, ops.ErrDenied) {
		t.Fatalf("anna approving her own request: %v, want a SelfApprovalError", err)
	}
	if _, err := o.Reject(r.ctx, approver, req.ID, "me"); !errors.As(err, &self) {
		t.Fatalf("anna rejecting her own request: %v, want a SelfApprovalError", err)
	}
	if got, _ := o.Request(r.ctx, viewer, req.ID); got.State != outboxdriver.StatePending {
		t.Fatalf("after refused approvals the request is %s", got.State)
	}
	if backlog, _ := r.backlog(t); backlog != 0 {
		t.Fatalf("backlog %d before approval", backlog)
	}
	if _, err := o.Approve(r.ctx, approverB, req.ID, "checked with the consumer team"); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Approve(r.ctx, approverB, req.ID, "again"); !errors.Is(err, ops.ErrRequestState) {
		t.Fatalf("a second approval: %v, want ErrRequestState", err)
	}
	if err := r.executor(t, o, &ops.ExecutorConfig{BatchSize: 7}).RunOnce(r.ctx); err != nil {
		t.Fatal(err)
	}
	got, err := o.Request(r.ctx, viewer, req.ID)
	if err != nil || got.State != outboxdriver.StateDone || got.Done != 30 || got.Total == nil || *got.Total != 30 {
		t.Fatalf("after execution: %+v, %v", got, err)
	}
	copies := r.copies(t)
	checkOrder(t, copies, 30)
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	for _, c := range copies {
		if !want[c.id] || c.replayID != req.ID || c.replayOf != "" {
			t.Fatalf("copy %+v: want an original id, outbox-replay-id %s and no outbox-replay-of", c, req.ID)
		}
	}
	recs, err := r.st.FindAudit(r.ctx, r.tb, outboxdriver.AuditQuery{RequestID: req.ID, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var trail []string
	for i := len(recs) - 1; i >= 0; i-- {
		trail = append(trail, recs[i].Action+":"+recs[i].Actor)
	}
	if strings.Join(trail, " ") != "request:anna denied:otto denied:anna denied:anna approve:bob execute:(outbox) finish:(outbox)" {
		t.Fatalf("audit of the request: %v", trail)
	}
}

func isInput(err error) bool {
	var in *ops.InputError
	return errors.As(err, &in)
}

// An execution stopped midway (its context ends: the console crashed)
// leaves the request executing with its cursor; exactly the batches done
// are applied; another executor takes it over once the first is quiet and
// finishes it without re-enqueuing anything twice; the stale executor's
// batches are refused.
func TestReplayResumesAfterCrash(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	o := r.ops(t, nil)
	r.published(t, 30)
	req, err := o.RequestReplay(r.ctx, operator, ops.ReplayParams{Since: since(), NewIDs: true}, "resend with new ids")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.Approve(r.ctx, approverB, req.ID, ""); err != nil {
		t.Fatal(err)
	}
	ctx, crash := context.WithCancel(r.ctx)
	first := r.executor(t, o, &ops.ExecutorConfig{Name: "first", BatchSize: 4, AfterBatch: func(_ context.Context, _ ops.Request, done int64) {
		if done >= 8 {
			crash()
		}
	}})
	if err := first.Execute(ctx, req.ID); !errors.Is(err, context.Canceled) {
		t.Fatalf("the crashed execution: %v, want context.Canceled", err)
	}
	mid, err := o.Request(r.ctx, viewer, req.ID)
	if err != nil || mid.State != outboxdriver.StateExecuting || mid.Done != 8 || mid.Executor != "first" {
		t.Fatalf("after the crash: %+v, %v", mid, err)
	}
	if n := len(r.copies(t)); n != 8 {
		t.Fatalf("%d copies after two batches, want 8", n)
	}
	second := r.executor(t, o, &ops.ExecutorConfig{Name: "second", BatchSize: 4, Stale: 100 * time.Millisecond})
	await.Eventually(t, 20*time.Second, func() error { // until the first executor's heartbeat goes stale
		if err := second.Execute(r.ctx, req.ID); err != nil {
			if !errors.Is(err, ops.ErrRequestState) {
				t.Fatalf("resume: %v", err)
			}
			return fmt.Errorf("resume: %w", err)
		}
		return nil
	})
	done, err := o.Request(r.ctx, viewer, req.ID)
	if err != nil || done.State != outboxdriver.StateDone || done.Done != 30 || done.Epoch != 2 {
		t.Fatalf("after the resume: %+v, %v", done, err)
	}
	copies := r.copies(t)
	checkOrder(t, copies, 30)
	for _, c := range copies {
		if c.replayOf == "" || c.replayOf == c.id {
			t.Fatalf("copy %+v: want a new id and outbox-replay-of", c)
		}
	}
	// The first executor, back from the dead, cannot apply a batch.
	_, _, err = r.st.ReplayBatch(r.ctx, r.tb, outboxdriver.ReplayBatch{Request: req.ID, Executor: "first", Epoch: 1, Filter: outboxdriver.ReplayFilter{Since: since()}, Limit: 4, NewIDs: true})
	if !errors.Is(err, outboxdriver.ErrRequestState) || len(r.copies(t)) != 30 {
		t.Fatalf("a stale executor's batch: %v, %d copies", err, len(r.copies(t)))
	}
	var actions []string
	recs, _ := r.st.FindAudit(r.ctx, r.tb, outboxdriver.AuditQuery{RequestID: req.ID, Action: "execute", Limit: 10})
	for _, a := range recs {
		actions = append(actions, a.Detail)
	}
	if len(actions) != 2 || !strings.Contains(actions[0], "resumed by executor second (epoch 2) after 8 events") {
		t.Fatalf("execution audit: %q", actions)
	}
}

// Cancelling an executing replay stops it after the current batch; what
// it re-enqueued stays, and the request says so.
func TestReplayCancel(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	o := r.ops(t, nil)
	r.published(t, 20)
	req, err := o.RequestReplay(r.ctx, operator, ops.ReplayParams{Since: since()}, "try")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.Cancel(r.ctx, approverB, req.ID, ""); !errors.Is(err, ops.ErrDenied) {
		t.Fatalf("an approver's cancel: %v, want ErrDenied (approvers reject)", err)
	}
	if _, err := o.Approve(r.ctx, approverB, req.ID, ""); err != nil {
		t.Fatal(err)
	}
	e := r.executor(t, o, &ops.ExecutorConfig{BatchSize: 5, AfterBatch: func(ctx context.Context, rq ops.Request, done int64) {
		if done == 5 {
			if _, err := o.Cancel(ctx, operator, rq.ID, "wrong window"); err != nil {
				t.Errorf("cancel: %v", err)
			}
		}
	}})
	if err := e.Execute(r.ctx, req.ID); !errors.Is(err, ops.ErrRequestState) {
		t.Fatalf("execution of a cancelled request: %v, want ErrRequestState", err)
	}
	got, _ := o.Request(r.ctx, viewer, req.ID)
	if got.State != outboxdriver.StateCancelled || got.Done != 5 || !strings.Contains(got.Error, "cancelled by otto: wrong window") {
		t.Fatalf("cancelled request: %+v", got)
	}
	if n := len(r.copies(t)); n != 5 {
		t.Fatalf("%d copies, want the 5 of the batch before the cancel", n)
	}
	if _, err := o.Cancel(r.ctx, operator, req.ID, ""); !errors.Is(err, ops.ErrRequestState) {
		t.Fatalf("cancelling a cancelled request: %v", err)
	}
}

// A request not approved and carried out in time expires: it can no
// longer be approved or executed, and the expiry is audited.
func TestRequestExpires(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	o := r.ops(t, &ops.Config{RequestTTL: 300 * time.Millisecond})
	r.published(t, 3)
	req, err := o.RequestReplay(r.ctx, operator, ops.ReplayParams{Since: since()}, "late")
	if err != nil {
		t.Fatal(err)
	}
	await.Eventually(t, 20*time.Second, func() error {
		got, err := o.Request(r.ctx, viewer, req.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != outboxdriver.StateExpired {
			return fmt.Errorf("request still %s after its expiry", got.State)
		}
		return nil
	})
	if _, err := o.Approve(r.ctx, approverB, req.ID, ""); !errors.Is(err, ops.ErrRequestState) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("approving an expired request: %v", err)
	}
	if err := r.executor(t, o, nil).Execute(r.ctx, req.ID); !errors.Is(err, ops.ErrRequestState) {
		t.Fatalf("executing an expired request: %v", err)
	}
	if backlog, _ := r.backlog(t); backlog != 0 {
		t.Fatalf("an expired request re-enqueued %d events", backlog)
	}
	recs, _ := r.st.FindAudit(r.ctx, r.tb, outboxdriver.AuditQuery{RequestID: req.ID, Action: "expire", Limit: 10})
	if len(recs) != 1 {
		t.Fatalf("expiry audited %d times", len(recs))
	}
}

// A replay needs kept published events; malformed selections are
// refused before anything is stored.
func TestReplayBadInput(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	o := r.ops(t, nil)
	if _, err := o.RequestReplay(r.ctx, operator, ops.ReplayParams{Since: since()}, "x"); !errors.Is(err, ops.ErrNoKeptRows) {
		t.Fatalf("replay without kept rows: %v, want ErrNoKeptRows", err)
	}
	r.published(t, 3)
	for name, p := range map[string]ops.ReplayParams{
		"no since":            {},
		"since after until":   {Since: time.Now().Add(-time.Minute), Until: time.Now().Add(-time.Hour)},
		"long aggregate type": {Since: since(), AggregateType: strings.Repeat("x", 300)},
		"nothing matches":     {Since: since(), Type: "Nope"},
		"unknown destination": {Since: since(), Destination: "outbox.event.nope"},
	} {
		if _, err := o.RequestReplay(r.ctx, operator, p, "x"); !isInput(err) {
			t.Errorf("%s: %v, want an InputError", name, err)
		}
	}
	pv, err := o.PreviewReplay(r.ctx, viewer, ops.ReplayParams{Since: since(), Destination: "outbox.event.order"})
	if err != nil || pv.Count != 3 {
		t.Fatalf("preview by destination: %+v, %v", pv, err)
	}
	if rs, _ := o.Requests(r.ctx, viewer, "", 10); len(rs) != 0 {
		t.Fatalf("bad requests stored: %+v", rs)
	}
	if _, err := o.Request(r.ctx, viewer, "0190a0a0-0000-7000-8000-000000000000"); !errors.Is(err, ops.ErrNoRequest) {
		t.Fatalf("unknown request: %v", err)
	}
	if _, err := o.Requests(r.ctx, viewer, "sleeping", 10); !isInput(err) {
		t.Fatalf("unknown state: %v", err)
	}
}

// A repair: an operator proposes a new payload (a masked value kept as
// *** keeps the stored one) and headers; once another person approves, the
// dead letter gets them and goes back into the outbox with its id; the
// audit keeps the before and after.
// A repair, with the sensitive path configured or named by a contract:
// the stored value comes back where the proposal kept the mask, and the
// audit's before and after are shown masked.
func TestRepair(t *testing.T) {
	t.Parallel()
	reg, err := contract.Load("../contract/testdata/orders")
	if err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]*ops.Config{
		"configured": {SensitivePaths: []string{"customer.email"}},
		"contract":   {Contracts: reg},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testRepair(t, cfg)
		})
	}
}

func testRepair(t *testing.T, cfg *ops.Config) {
	r := newRig(t)
	o := r.ops(t, cfg)
	id := testenv.AddDeadLetters(t, r.pool, r.tb, testenv.DeadLetterRow{AggregateType: "order", AggregateID: "42", Type: "OrderPlaced",
		Payload: `{"orderId":"42x","customer":{"email":"ada@example.com"}}`, Headers: `{"tenant":"t1"}`, LastError: "schema: orderId must be a number", Attempts: 1, Held: true})[0]
	for name, p := range map[string]ops.RepairParams{
		"not JSON":     {EventID: id, Payload: json.RawMessage(`{"orderId":`)},
		"not object":   {EventID: id, Payload: json.RawMessage(`[1]`)},
		"too big":      {EventID: id, Payload: json.RawMessage(`{"x":"` + strings.Repeat("a", 50<<10) + `"}`)},
		"nothing":      {EventID: id},
		"header id":    {EventID: id, Headers: map[string]string{"id": "x"}},
		"malformed id": {EventID: "nope", Headers: map[string]string{"a": "b"}},
	} {
		if _, err := o.RequestRepair(r.ctx, operator, p, "fix"); !isInput(err) {
			t.Errorf("%s: %v, want an InputError", name, err)
		}
	}
	if _, err := o.RequestRepair(r.ctx, operator, ops.RepairParams{EventID: "0190a0a0-0000-7000-8000-000000000000", Headers: map[string]string{"a": "b"}}, "fix"); !errors.Is(err, ops.ErrNotFound) {
		t.Fatalf("repair of an unknown dead letter: %v", err)
	}
	req, err := o.RequestRepair(r.ctx, operator, ops.RepairParams{EventID: id,
		Payload: json.RawMessage(`{"orderId": 42, "customer": {"email": "***"}}`), Headers: map[string]string{"tenant": "t1", "fixed": "yes"}}, "orderId as a number")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.st.DeadLetter(r.ctx, r.tb, id); err != nil {
		t.Fatalf("the dead letter before approval: %v", err)
	}
	if _, err := o.Approve(r.ctx, approverB, req.ID, "looks right"); err != nil {
		t.Fatal(err)
	}
	if err := r.executor(t, o, nil).RunOnce(r.ctx); err != nil {
		t.Fatal(err)
	}
	var payload, headers string
	if err := r.pool.QueryRow(r.ctx, `SELECT payload::text, headers::text FROM `+r.tb.Qualified("")+` WHERE id = $1 AND published_at IS NULL`, id).Scan(&payload, &headers); err != nil {
		t.Fatalf("the repaired event is not pending in the outbox: %v", err)
	}
	if payload != `{"orderId":42,"customer":{"email":"ada@example.com"}}` || headers != `{"fixed": "yes", "tenant": "t1"}` {
		t.Fatalf("repaired: payload %s headers %s", payload, headers)
	}
	got, _ := o.Request(r.ctx, viewer, req.ID)
	if got.State != outboxdriver.StateDone {
		t.Fatalf("repair request %+v", got)
	}
	recs, _ := r.st.FindAudit(r.ctx, r.tb, outboxdriver.AuditQuery{Action: "repair", EventID: id, Limit: 10})
	if len(recs) != 1 || !strings.Contains(string(recs[0].Before), `"42x"`) || !strings.Contains(string(recs[0].After), `"orderId": 42`) || recs[0].RequestID != req.ID {
		t.Fatalf("repair audit: %+v", recs)
	}
	// Shown through ops, the before and after are masked like any payload.
	shown, err := o.Audit(r.ctx, viewer, outboxdriver.AuditQuery{Action: "repair", Limit: 10})
	if err != nil || len(shown) != 1 || strings.Contains(string(shown[0].Before)+string(shown[0].After), "ada@") || !strings.Contains(string(shown[0].After), ops.Mask) {
		t.Fatalf("the audit's before and after as shown: %+v, %v", shown, err)
	}
	// A repair of a dead letter that went away meanwhile fails visibly.
	id2 := testenv.AddDeadLetters(t, r.pool, r.tb, testenv.DeadLetterRow{AggregateType: "order", AggregateID: "43", Type: "OrderPlaced", Payload: `{"a":1}`, LastError: "x", Attempts: 1})[0]
	req2, err := o.RequestRepair(r.ctx, operator, ops.RepairParams{EventID: id2, Payload: json.RawMessage(`{"a":2}`)}, "fix")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.Discard(r.ctx, operator, []string{id2}, "gone"); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Approve(r.ctx, approverB, req2.ID, ""); err != nil {
		t.Fatal(err)
	}
	if err := r.executor(t, o, nil).Execute(r.ctx, req2.ID); !errors.Is(err, ops.ErrNotFound) {
		t.Fatalf("repair of a discarded dead letter: %v", err)
	}
	if got, _ := o.Request(r.ctx, viewer, req2.ID); got.State != outboxdriver.StateFailed || !strings.Contains(got.Error, "discarded") {
		t.Fatalf("failed repair: %+v", got)
	}
}

// The audit is append-only: the database refuses UPDATE, DELETE and
// TRUNCATE; the prune command deletes old rows and records that it did.
func TestAuditAppendOnly(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	o := r.ops(t, nil)
	if err := o.Record(r.ctx, outboxdriver.AuditRecord{Actor: "x", Action: "login"}); err != nil {
		t.Fatal(err)
	}
	audit := r.tb.Qualified("_audit")
	for _, q := range []string{`UPDATE ` + audit + ` SET actor = 'mallory'`, `DELETE FROM ` + audit, `TRUNCATE ` + audit} {
		if _, err := r.pool.Exec(r.ctx, q); err == nil || !strings.Contains(err.Error(), "append-only") {
			t.Errorf("%s: %v, want a refusal", q, err)
		}
	}
	if _, err := o.PruneAudit(r.ctx, viewer, time.Now(), ""); !errors.Is(err, ops.ErrDenied) {
		t.Fatalf("a viewer's prune: %v", err)
	}
	if _, err := o.PruneAudit(r.ctx, operator, time.Now().Add(time.Hour), ""); !isInput(err) {
		t.Fatalf("prune before a future time: %v", err)
	}
	n, err := o.PruneAudit(r.ctx, operator, time.Now(), "retention 1 year")
	if err != nil || n != 2 { // the login and the viewer's refusal
		t.Fatalf("prune: %d, %v", n, err)
	}
	recs := r.audit(t)
	if len(recs) != 1 || recs[0].Action != "audit-prune" || recs[0].Actor != "otto" || recs[0].Reason != "retention 1 year" {
		t.Fatalf("after the prune: %+v", recs)
	}
}
