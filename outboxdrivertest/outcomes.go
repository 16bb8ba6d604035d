package outboxdrivertest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
)

// testFinishOutcomes: published rows are deleted (RetentionDelete) or kept
// and counted (RetentionKeep); records in neither list are claimed again; a
// failure with RetryAfter is not claimable before it is due; a dead letter
// leaves the outbox.
func (s *suite) testFinishOutcomes(t *testing.T) {
	for _, c := range []struct {
		name      string
		retention outboxdriver.Retention
		published int64
	}{{"RetentionDelete", outboxdriver.RetentionDelete, 0}, {"RetentionKeep", outboxdriver.RetentionKeep, 1}} {
		t.Run(c.name, func(t *testing.T) {
			if s.h.Parallel {
				t.Parallel()
			}
			e := s.newEnv(t, partitions)
			e.write(ev("a", 0), ev("b", 0), ev("c", 0), ev("d", 0))
			src := e.source(outboxdriver.SourceConfig{Retention: c.retention})
			leases := e.leaseAll(src)
			b := e.open(src, leases, 10)
			r := b.Records()
			if len(r) != 4 {
				t.Fatalf("claimed %v, want a b c d", describe(r))
			}
			e.finish(b, outboxdriver.Outcome{
				Published: []string{r[0].ID},
				Failed: []outboxdriver.Failure{
					{ID: r[1].ID, Err: errors.New("broker busy"), RetryAfter: time.Hour},
					{ID: r[2].ID, Err: errors.New("too large\x00 for the broker"), DeadLetter: true},
				},
			})
			b.Release(e.ctx) // safe after Finish
			st := e.status()
			if st.Backlog != 2 || st.DeadLetters != 1 || st.Published != c.published {
				t.Fatalf("status %+v; want backlog 2 (b waiting, d untouched), 1 dead letter, %d published kept", st, c.published)
			}
			if got := e.claim(src, leases, 10); !sameIDs(ids(got), []string{r[3].ID}) {
				t.Fatalf("claim after finish = %v; want only d/0 (a published, b not due for an hour, c dead-lettered, d untouched)", describe(got))
			}
			dls, err := deadLetters(e.ctx, s.h.Store, e.table, 10)
			if err != nil {
				t.Fatalf("dead letters: %v", err)
			}
			if len(dls) != 1 || dls[0].ID != r[2].ID || dls[0].Attempts != 1 || !strings.Contains(dls[0].LastError, "too large") || dls[0].Held {
				t.Fatalf("dead letters %+v; want c/0 after 1 attempt, not held, its error recorded", dls)
			}
		})
	}
}

// testRetryAttempts: every failure increments Attempts, and the last error
// reaches the dead letter.
func (s *suite) testRetryAttempts(t *testing.T) {
	e := s.newEnv(t, partitions)
	x := ev("x", 0)
	e.write(x)
	src := e.source(outboxdriver.SourceConfig{})
	leases := e.leaseAll(src)
	for attempt := range 3 {
		var b outboxdriver.Batch
		await.Eventually(t, 20*time.Second, func() error {
			b = e.open(src, leases, 10)
			if len(b.Records()) > 0 {
				return nil
			}
			b.Release(e.ctx)
			return fmt.Errorf("x/0 not claimable again after failure %d with RetryAfter 100ms", attempt)
		})
		r := b.Records()
		if len(r) != 1 || r[0].ID != x.ID || r[0].Attempts != attempt {
			t.Fatalf("claim %d = %v with attempts %d; want x/0 with attempts %d", attempt, describe(r), r[0].Attempts, attempt)
		}
		f := outboxdriver.Failure{ID: x.ID, Err: fmt.Errorf("boom %d", attempt), RetryAfter: 100 * time.Millisecond}
		if attempt == 2 {
			f.DeadLetter = true
		}
		e.finish(b, outboxdriver.Outcome{Failed: []outboxdriver.Failure{f}})
	}
	dls, err := deadLetters(e.ctx, s.h.Store, e.table, 10)
	if err != nil {
		t.Fatalf("dead letters: %v", err)
	}
	if len(dls) != 1 || dls[0].Attempts != 3 || dls[0].LastError != "boom 2" {
		t.Fatalf("dead letters %+v; want x/0 after 3 attempts with last error %q", dls, "boom 2")
	}
}

// testFailureHoldsItsAggregateOnly (G3, G4): a failed event holds back the
// later events of its aggregate until it is published; other aggregates of
// the same partition keep flowing.
func (s *suite) testFailureHoldsItsAggregateOnly(t *testing.T) {
	e := s.newEnv(t, 1) // one partition: every aggregate shares it
	a0, a1, b0 := ev("a", 0), ev("a", 1), ev("b", 0)
	e.write(a0, a1, b0)
	src := e.source(outboxdriver.SourceConfig{})
	leases := e.leaseAll(src)
	b := e.open(src, leases, 10)
	if len(b.Records()) != 3 {
		t.Fatalf("claimed %v, want a/0 a/1 b/0", describe(b.Records()))
	}
	const retry = 2 * time.Second
	failedAt := time.Now()
	e.finish(b, outboxdriver.Outcome{
		Published: []string{b0.ID},
		Failed:    []outboxdriver.Failure{{ID: a0.ID, Err: errors.New("broker busy"), RetryAfter: retry}},
	})
	got := e.claim(src, leases, 10)
	if has(got, a1.ID) {
		t.Fatalf("claimed %v while a/0 waits for its retry: a/1 must wait behind it", describe(got))
	}
	if has(got, a0.ID) && time.Since(failedAt) < retry {
		t.Fatalf("claimed %v: a/0 is not due for %s", describe(got), retry)
	}
	if st := e.status(); st.Held != 1 {
		t.Fatalf("status held %d while a/0 waits; want 1", st.Held)
	}
	c0 := ev("c", 0)
	e.write(c0)
	got = e.claim(src, leases, 10)
	if !has(got, c0.ID) || has(got, a1.ID) {
		t.Fatalf("claimed %v; want c/0 (another aggregate in the same partition flows) and never a/1", describe(got))
	}
	// Once due, a/0 is claimed again, still ahead of a/1.
	await.Eventually(t, 20*time.Second, func() error {
		b = e.open(src, leases, 10)
		if has(b.Records(), a0.ID) {
			return nil
		}
		if has(b.Records(), a1.ID) {
			t.Fatalf("claimed %v: a/1 before a/0 was published", describe(b.Records()))
		}
		b.Release(e.ctx)
		return errors.New("a/0 not claimed again after its retry delay")
	})
	if has(b.Records(), a1.ID) {
		t.Fatalf("claimed %v: a/1 together with the retried a/0", describe(b.Records()))
	}
	e.finish(b, outboxdriver.Outcome{Published: ids(b.Records())})
	if got := e.publishAll(src, leases); !sameIDs(ids(got), []string{a1.ID}) {
		t.Fatalf("after a/0 was published the claims returned %v, want a/1", describe(got))
	}
	if st := e.status(); st.Held != 0 || st.Backlog != 0 {
		t.Fatalf("status %+v; want nothing held and no backlog", st)
	}
}

// testDeadLetters: dead letters with and without Hold, RetryDeadLetters
// and DiscardDeadLetters (by id and all), and the audit of both, whose
// actions are named "retry" and "discard".
func (s *suite) testDeadLetters(t *testing.T) {
	e := s.newEnv(t, 1) // one partition: held and flowing aggregates share it
	st := s.h.Store
	a0, a1, a2 := ev("a", 0), ev("a", 1), ev("a", 2)
	x0, x1 := ev("x", 0), ev("x", 1)
	y0, y1 := ev("y", 0), ev("y", 1)
	b0 := ev("b", 0)
	e.write(a0, a1, x0, b0, y0)
	e.write(a2, x1, y1)
	src := e.source(outboxdriver.SourceConfig{})
	leases := e.leaseAll(src)
	bt := e.open(src, leases, 100)
	if len(bt.Records()) != 8 {
		t.Fatalf("claimed %v, want all 8", describe(bt.Records()))
	}
	e.finish(bt, outboxdriver.Outcome{
		Published: []string{b0.ID},
		Failed: []outboxdriver.Failure{
			{ID: a0.ID, Err: errors.New("poison a"), DeadLetter: true, Hold: true},
			{ID: x0.ID, Err: errors.New("poison x"), DeadLetter: true, Hold: true},
			{ID: y0.ID, Err: errors.New("poison y"), DeadLetter: true},
		},
	})
	dls, err := deadLetters(e.ctx, st, e.table, 100)
	if err != nil {
		t.Fatalf("dead letters: %v", err)
	}
	byID := map[string]outboxdriver.DeadLetter{}
	for _, d := range dls {
		byID[d.ID] = d
	}
	for _, w := range []struct {
		id, agg, err string
		held         bool
	}{{a0.ID, "a", "poison a", true}, {x0.ID, "x", "poison x", true}, {y0.ID, "y", "poison y", false}} {
		d, ok := byID[w.id]
		if !ok || d.AggregateType != "order" || d.AggregateID != w.agg || d.Type != "Placed" ||
			d.Attempts != 1 || d.LastError != w.err || d.Held != w.held || d.DeadLetteredAt.IsZero() {
			t.Fatalf("dead letter of %s/0 = %+v; want order/%s Placed, 1 attempt, error %q, held %v, a time", w.agg, d, w.agg, w.err, w.held)
		}
	}
	if len(dls) != 3 {
		t.Fatalf("%d dead letters, want 3: %+v", len(dls), dls)
	}
	if one, err := deadLetters(e.ctx, st, e.table, 1); err != nil || len(one) != 1 {
		t.Fatalf("FindDeadLetters limit 1 listed %d (err %v)", len(one), err)
	}
	if status := e.status(); status.DeadLetters != 3 || status.Held != 2 || status.Backlog != 4 {
		t.Fatalf("status %+v; want 3 dead letters, 2 held aggregates (a, x), backlog 4", status)
	}
	// Hold keeps a/1, a/2 and x/1 back; without Hold y/1 flows; so does a
	// new aggregate.
	b1 := ev("b", 1)
	e.write(b1)
	if got := e.publishAll(src, leases); !sameIDs(ids(got), []string{y1.ID, b1.ID}) {
		t.Fatalf("claimable with a/0 and x/0 held, y/0 not: %v; want y/1 b/1", describe(got))
	}

	// Retry a/0: it comes back first, and a/1 a/2 follow only once it is
	// published.
	moved, err := st.RetryDeadLetters(e.ctx, e.table, []string{a0.ID}, outboxdriver.Acting{Name: "alice"})
	if err != nil || !sameIDs(moved, []string{a0.ID}) {
		t.Fatalf("RetryDeadLetters(a/0) = %v (err %v); want [a/0]", moved, err)
	}
	if none, err := st.RetryDeadLetters(e.ctx, e.table, []string{newID()}, outboxdriver.Acting{Name: "alice"}); err != nil || len(none) != 0 {
		t.Fatalf("RetryDeadLetters of an unknown id = %v (err %v); want nothing", none, err)
	}
	b := e.open(src, leases, 100)
	if !sameIDs(ids(b.Records()), []string{a0.ID}) {
		t.Fatalf("claim after retrying a/0 = %v; want a/0 alone (a/1, a/2 wait until it is published)", describe(b.Records()))
	}
	e.finish(b, outboxdriver.Outcome{Published: ids(b.Records())})
	if got := e.publishAll(src, leases); !sameIDs(ids(got), []string{a1.ID, a2.ID}) {
		t.Fatalf("after a/0 was published: %v; want a/1 a/2 in order", describe(got))
	}

	// Discard all (x/0 and y/0): x/1 is released.
	gone, err := st.DiscardDeadLetters(e.ctx, e.table, nil, outboxdriver.Acting{Name: "bob"})
	if err != nil || !sameSet(gone, []string{x0.ID, y0.ID}) {
		t.Fatalf("DiscardDeadLetters(nil) = %v (err %v); want x/0 and y/0", gone, err)
	}
	if got := e.publishAll(src, leases); !sameIDs(ids(got), []string{x1.ID}) {
		t.Fatalf("after discarding x/0: %v; want x/1", describe(got))
	}
	if status := e.status(); status.DeadLetters != 0 || status.Held != 0 || status.Backlog != 0 {
		t.Fatalf("status %+v; want no dead letters, nothing held, no backlog", status)
	}

	// Retry all: dead-letter two events and move both back with nil ids.
	p0, q0 := ev("p", 0), ev("q", 0)
	e.write(p0, q0)
	b = e.open(src, leases, 10)
	if !sameIDs(ids(b.Records()), []string{p0.ID, q0.ID}) {
		t.Fatalf("claimed %v, want p/0 q/0", describe(b.Records()))
	}
	e.finish(b, outboxdriver.Outcome{Failed: []outboxdriver.Failure{
		{ID: p0.ID, Err: errors.New("poison p"), DeadLetter: true, Hold: true},
		{ID: q0.ID, Err: errors.New("poison q"), DeadLetter: true},
	}})
	moved, err = st.RetryDeadLetters(e.ctx, e.table, nil, outboxdriver.Acting{Name: "carol"})
	if err != nil || !sameSet(moved, []string{p0.ID, q0.ID}) {
		t.Fatalf("RetryDeadLetters(nil) = %v (err %v); want p/0 and q/0", moved, err)
	}
	if got := e.publishAll(src, leases); !sameIDs(ids(got), []string{p0.ID, q0.ID}) {
		t.Fatalf("after retrying all: %v; want p/0 q/0 in their original order", describe(got))
	}

	// The audit lists every action, newest first, with its actor.
	audit, err := st.FindAudit(e.ctx, e.table, outboxdriver.AuditQuery{Limit: 100})
	if err != nil {
		t.Fatalf("audit: %v", err)
	}
	type act struct{ actor, action, id string }
	var got []act
	for _, a := range audit {
		if a.At.IsZero() {
			t.Fatalf("audit entry %+v without a time", a)
		}
		got = append(got, act{a.Actor, a.Action, a.EventID})
	}
	want := []act{{"carol", "retry", p0.ID}, {"carol", "retry", q0.ID}, {"bob", "discard", x0.ID}, {"bob", "discard", y0.ID}, {"alice", "retry", a0.ID}}
	if len(got) != len(want) || !samePair(got[:2], want[:2]) || !samePair(got[2:4], want[2:4]) || got[4] != want[4] {
		t.Fatalf("audit %+v; want, newest first, %+v (actions named retry and discard)", got, want)
	}
	if one, err := st.FindAudit(e.ctx, e.table, outboxdriver.AuditQuery{Limit: 1}); err != nil || len(one) != 1 {
		t.Fatalf("Audit limit 1 listed %d (err %v)", len(one), err)
	}
}

// samePair reports whether a and b hold the same two elements, in any
// order.
func samePair[T comparable](a, b []T) bool {
	return len(a) == 2 && len(b) == 2 && (a[0] == b[0] && a[1] == b[1] || a[0] == b[1] && a[1] == b[0])
}

// testCleanup: Cleanup deletes only published rows kept longer than
// olderThan, at most limit per call, and only in the leased partitions.
func (s *suite) testCleanup(t *testing.T) {
	e := s.newEnv(t, partitions)
	for n := range 7 {
		e.write(ev(fmt.Sprint("agg-", n), 0))
	}
	src := e.source(outboxdriver.SourceConfig{Retention: outboxdriver.RetentionKeep})
	leases := e.leaseAll(src)
	b := e.open(src, leases, 5)
	if len(b.Records()) != 5 {
		t.Fatalf("claimed %d, want 5", len(b.Records()))
	}
	e.finish(b, outboxdriver.Outcome{Published: ids(b.Records())})
	if n, err := src.Cleanup(e.ctx, leases, time.Hour, 100); err != nil || n != 0 {
		t.Fatalf("Cleanup of rows published less than an hour ago deleted %d (err %v); want 0", n, err)
	}
	if n, err := src.Cleanup(e.ctx, nil, 0, 100); err != nil || n != 0 {
		t.Fatalf("Cleanup without leases deleted %d (err %v); want 0", n, err)
	}
	// With olderThan 0 every published row becomes eligible as soon as the
	// database clock moves past its publication; poll until all are gone.
	var calls []int
	total := 0
	await.Eventually(t, 20*time.Second, func() error {
		n, err := src.Cleanup(e.ctx, leases, 0, 3)
		if err != nil {
			t.Fatalf("cleanup: %v", err)
		}
		if n > 3 {
			t.Fatalf("Cleanup with limit 3 deleted %d", n)
		}
		if n > 0 || total > 0 {
			calls = append(calls, n)
		}
		if total += n; total < 5 {
			return fmt.Errorf("cleanup deleted %d of the 5 published rows (calls %v)", total, calls)
		}
		return nil
	})
	if total != 5 || calls[0] != 3 {
		t.Fatalf("cleanup calls deleted %v; want 3 then 2 (limit 3, 5 published rows)", calls)
	}
	if n, err := src.Cleanup(e.ctx, leases, 0, 3); err != nil || n != 0 {
		t.Fatalf("cleanup after every published row was gone deleted %d (err %v)", n, err)
	}
	if st := e.status(); st.Published != 0 || st.Backlog != 2 {
		t.Fatalf("after cleanup: %d published rows kept, backlog %d; want 0 and 2 (unpublished rows stay)", st.Published, st.Backlog)
	}
}

// testWait: Wait returns once d has passed when nothing happens, and
// promptly when ctx is cancelled. Wake-ups are not required: a driver may
// only poll. SetIdle must not fail.
func (s *suite) testWait(t *testing.T) {
	e := s.newEnv(t, partitions)
	src := e.source(outboxdriver.SourceConfig{})
	const slack = 30 * time.Second
	returns := func(what string, ctx context.Context, d, limit time.Duration) error {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- src.Wait(ctx, d) }()
		select {
		case err := <-done:
			return err
		case <-time.After(limit):
			t.Fatalf("%s: Wait(%s) has not returned after %s", what, d, limit)
			return nil
		}
	}
	for i := range 3 {
		if err := returns("idle", e.ctx, 50*time.Millisecond, 50*time.Millisecond+slack); err != nil {
			t.Fatalf("Wait %d: %v", i, err)
		}
	}
	if err := src.SetIdle(e.ctx, time.Minute); err != nil {
		t.Fatalf("SetIdle(1m): %v", err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	time.AfterFunc(50*time.Millisecond, cancel)
	if err := returns("cancelled", ctx, time.Hour, slack); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait cancelled = %v; want nil or context.Canceled", err)
	}
	if err := src.SetIdle(e.ctx, 0); err != nil {
		t.Fatalf("SetIdle(0): %v", err)
	}
	if src.RelayName() == "" {
		t.Fatal("RelayName is empty")
	}
}

// deadLetters lists up to limit dead letters of t, oldest first.
func deadLetters(ctx context.Context, st outboxdriver.Store, t outboxdriver.Table, limit int) ([]outboxdriver.DeadLetter, error) {
	p, err := st.FindDeadLetters(ctx, t, outboxdriver.DeadLetterQuery{Limit: limit})
	return p.DeadLetters, err
}
