package console_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
)

var (
	otto = ops.Actor{Name: "otto", Role: ops.Operator}
	anna = ops.Actor{Name: "anna", Role: ops.Approver}
)

// replayCopy is a re-enqueued event: its id, aggregate, n (from the
// payload) and replay headers.
type replayCopy struct {
	id, aggregate, replayID, replayOf string
	n                                 int
}

func (r *rig) replayCopies(t *testing.T) []replayCopy {
	t.Helper()
	var out []replayCopy
	for _, e := range r.fx.pending(t, r.tb) {
		var h map[string]string
		var p struct{ N int }
		if err := json.Unmarshal([]byte(e.headers), &h); err != nil {
			t.Fatalf("headers %s: %v", e.headers, err)
		}
		if h["outbox-replay-id"] == "" {
			continue
		}
		if err := json.Unmarshal([]byte(e.payload), &p); err != nil {
			t.Fatalf("payload %s: %v", e.payload, err)
		}
		out = append(out, replayCopy{e.id, e.aggregateID, h["outbox-replay-id"], h["outbox-replay-of"], p.N})
	}
	return out
}

// Replays on every database: approved by another user, carried out in
// batches with the original ids (which replace the kept rows) or new ids
// (with outbox-replay-of), each aggregate's copies in the original order;
// an execution stopped midway is taken over once its executor is quiet
// and finished exactly once; a stale executor's batch is refused.
func TestReplayOnEveryDB(t *testing.T) {
	t.Parallel()
	onEveryDB(t, nil, func(t *testing.T, r *rig) {
		var rows []testenv.PublishedRow
		for i := range 24 {
			rows = append(rows, testenv.PublishedRow{AggregateType: "order", AggregateID: fmt.Sprint("A", i%3), Type: "OrderPlaced",
				Payload: fmt.Sprintf(`{"n":%d}`, i+1), Ago: 10*time.Minute - time.Duration(i)*time.Second})
		}
		originals := r.fx.addPublished(t, r.tb, rows...)
		since := time.Now().Add(-time.Hour)

		// Original ids, all of it at once.
		pv, err := r.op.PreviewReplay(r.ctx, otto, ops.ReplayParams{Since: since, AggregateID: "A1"})
		if err != nil || pv.Count != 8 || len(pv.First) != 8 || pv.First[0].ID != originals[1] {
			t.Fatalf("preview: %+v, %v", pv, err)
		}
		req, err := r.op.RequestReplay(r.ctx, otto, ops.ReplayParams{Since: since, AggregateID: "A1"}, "billing lost A1")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.op.Approve(r.ctx, ops.Actor{Name: "otto", Role: ops.Approver}, req.ID, ""); !errors.As(err, new(*ops.SelfApprovalError)) {
			t.Fatalf("otto approving his own request: %v", err)
		}
		if _, err := r.op.Approve(r.ctx, anna, req.ID, "ok"); err != nil {
			t.Fatal(err)
		}
		e, err := r.op.NewExecutor(&ops.ExecutorConfig{BatchSize: 3})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.RunOnce(r.ctx); err != nil {
			t.Fatal(err)
		}
		got, err := r.op.Request(r.ctx, otto, req.ID)
		if err != nil || got.State != outboxdriver.StateDone || got.Done != 8 || got.Total == nil || *got.Total != 8 {
			t.Fatalf("after execution: %+v, %v", got, err)
		}
		copies := r.replayCopies(t)
		if len(copies) != 8 {
			t.Fatalf("%d copies, want 8", len(copies))
		}
		for i, c := range copies {
			if c.id != originals[1+3*i] || c.replayID != req.ID || c.replayOf != "" || c.aggregate != "A1" {
				t.Fatalf("copy %d: %+v; want original %s with outbox-replay-id %s", i, c, originals[1+3*i], req.ID)
			}
		}

		// New ids, stopped after two batches, then taken over.
		req, err = r.op.RequestReplay(r.ctx, otto, ops.ReplayParams{Since: since, AggregateType: "order", NewIDs: true}, "resend with new ids")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.op.Approve(r.ctx, anna, req.ID, ""); err != nil {
			t.Fatal(err)
		}
		ctx, crash := context.WithCancel(r.ctx)
		first, err := r.op.NewExecutor(&ops.ExecutorConfig{Name: "first", BatchSize: 4, AfterBatch: func(_ context.Context, _ ops.Request, done int64) {
			if done >= 8 {
				crash()
			}
		}})
		if err != nil {
			t.Fatal(err)
		}
		if err := first.Execute(ctx, req.ID); !errors.Is(err, context.Canceled) {
			t.Fatalf("the crashed execution: %v", err)
		}
		mid, err := r.op.Request(r.ctx, otto, req.ID)
		if err != nil || mid.State != outboxdriver.StateExecuting || mid.Done != 8 || len(r.replayCopies(t)) != 8+8 {
			t.Fatalf("after the crash: %+v (%v), %d copies", mid, err, len(r.replayCopies(t)))
		}
		second, err := r.op.NewExecutor(&ops.ExecutorConfig{Name: "second", BatchSize: 4, Stale: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		await.Eventually(t, 20*time.Second, func() error { // until the first executor's heartbeat goes stale
			if err := second.Execute(r.ctx, req.ID); err != nil {
				if !errors.Is(err, ops.ErrRequestState) {
					t.Fatalf("resume: %v", err)
				}
				return fmt.Errorf("resume: %w", err)
			}
			return nil
		})
		done, err := r.op.Request(r.ctx, otto, req.ID)
		if err != nil || done.State != outboxdriver.StateDone || done.Done != 16 || done.Epoch != 2 {
			t.Fatalf("after the resume: %+v, %v", done, err)
		}
		// 16 order events were still kept (8 of A1 were replaced by
		// their copies, which are not published).
		last := map[string]int{}
		seen := map[string]bool{}
		n := 0
		for _, c := range r.replayCopies(t) {
			if c.replayID != req.ID {
				continue
			}
			n++
			if c.replayOf == "" || c.replayOf == c.id || seen[c.replayOf] || c.n <= last[c.aggregate] {
				t.Fatalf("copy %+v: want a new id, outbox-replay-of once each, in order (last %d)", c, last[c.aggregate])
			}
			seen[c.replayOf], last[c.aggregate] = true, c.n
		}
		if n != 16 {
			t.Fatalf("%d copies of the second replay, want 16", n)
		}
		_, _, err = r.st.ReplayBatch(r.ctx, r.tb, outboxdriver.ReplayBatch{Request: req.ID, Executor: "first", Epoch: 1, Filter: outboxdriver.ReplayFilter{Since: since}, Limit: 4, NewIDs: true})
		if !errors.Is(err, outboxdriver.ErrRequestState) {
			t.Fatalf("a stale executor's batch: %v", err)
		}
		recs, err := r.st.FindAudit(r.ctx, r.tb, outboxdriver.AuditQuery{RequestID: req.ID, Action: "execute", Limit: 10})
		if err != nil || len(recs) != 2 || !strings.Contains(recs[0].Detail, "resumed by executor second (epoch 2) after 8 events") {
			t.Fatalf("execution audit: %+v, %v", recs, err)
		}
	})
}

// A repair on every database: proposed by an operator, approved by
// another user, carried out with the same id (back in the outbox with the
// new payload and headers), the before and after in the audit; the audit
// refuses updates and deletes but the prune's.
func TestRepairAndAuditGuardOnEveryDB(t *testing.T) {
	t.Parallel()
	onEveryDB(t, nil, func(t *testing.T, r *rig) {
		id := r.deadLetter()
		req, err := r.op.RequestRepair(r.ctx, otto, ops.RepairParams{EventID: id, Payload: json.RawMessage(`{"orderId":43,"customer":{"email":"***"}}`),
			Headers: map[string]string{"tenant": "t2"}}, "fix the order id")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.op.Approve(r.ctx, anna, req.ID, "looks right"); err != nil {
			t.Fatal(err)
		}
		e, err := r.op.NewExecutor(nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.RunOnce(r.ctx); err != nil {
			t.Fatal(err)
		}
		if got, err := r.op.Request(r.ctx, otto, req.ID); err != nil || got.State != outboxdriver.StateDone {
			t.Fatalf("repair request: %+v, %v", got, err)
		}
		var back *pendingEvent
		for _, p := range r.fx.pending(t, r.tb) {
			if p.id == id {
				back = &p
			}
		}
		if back == nil || !strings.Contains(back.payload, `43`) || !strings.Contains(back.payload, "ada@example.com") || !strings.Contains(back.headers, "t2") {
			t.Fatalf("the repaired event in the outbox: %+v; want the new payload (the masked email kept) and headers", back)
		}
		recs, err := r.st.FindAudit(r.ctx, r.tb, outboxdriver.AuditQuery{RequestID: req.ID, Action: "repair", Limit: 10})
		if err != nil || len(recs) != 1 || !strings.Contains(string(recs[0].Before), "42") || !strings.Contains(string(recs[0].After), "43") {
			t.Fatalf("repair audit: %+v, %v", recs, err)
		}

		// Append-only: the database refuses changes; the prune deletes and
		// says so.
		if n, err := r.op.PruneAudit(r.ctx, otto, time.Now().Add(time.Hour), "x"); err == nil {
			t.Fatalf("a prune of the future: %d rows, no error", n)
		}
		all := r.audit()
		cut := all[0].At.Add(time.Millisecond) // after the newest row, once that is past
		for time.Now().Before(cut) {
			time.Sleep(time.Millisecond)
		}
		before := len(all)
		n, err := r.op.PruneAudit(r.ctx, otto, cut, "kept long enough")
		if err != nil || n != int64(before) {
			t.Fatalf("prune: %d rows, %v; want %d", n, err, before)
		}
		if recs := r.audit(); len(recs) != 1 || recs[0].Action != "audit-prune" || recs[0].Reason != "kept long enough" {
			t.Fatalf("after the prune: %+v", recs)
		}
		r.fx.tamper(t, r.tb)
	})
}
