package outboxdrivertest

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
)

// testDelayedClaimKeepsOrder: an event that is not due yet (DeliverAt, or
// a deliver_at or next_attempt_at column set with plain SQL) is not
// claimed, and neither is any later event of its aggregate; other
// aggregates' events are. Once due it is claimed first, before the
// aggregate's later events, and not before its time.
func (s *suite) testDelayedClaimKeepsOrder(t *testing.T) {
	e := s.newEnv(t, partitions)
	src := e.source(outboxdriver.SourceConfig{})
	leases := e.leaseAll(src)

	// Through the Writer: DeliverAt.
	due := time.Now().Add(1500 * time.Millisecond)
	a1 := ev("delayed-a", 0)
	a1.DeliverAt = due
	a2, b1 := ev("delayed-a", 1), ev("other-b", 0)
	e.write(a1)
	e.write(a2, b1)
	got := e.publishAll(src, leases)
	if !sameIDs(ids(got), eventIDs(b1)) {
		t.Fatalf("claim before %s = %v; want only %s (the delayed event and its aggregate's later one wait)", due.Format(time.StampMicro), describe(got), b1.ID)
	}
	if st := e.status(); st.Delayed != 1 || st.Backlog != 2 {
		t.Fatalf("status while the delayed event waits: %d delayed, backlog %d; want 1 delayed in a backlog of 2", st.Delayed, st.Backlog)
	}
	if time.Now().After(due) {
		t.Fatalf("the claim ended after the delayed event was due: the machine was too slow for this case's 1.5s delay")
	}
	var recs []outboxdriver.Record
	await.Eventually(t, 10*time.Second, func() error {
		if recs = e.claim(src, leases, 100); len(recs) == 0 {
			return errors.New("the delayed event was never claimed")
		}
		return nil
	})
	if now := time.Now(); now.Before(due) {
		t.Fatalf("the delayed event was claimed at %s, before its time %s", now.Format(time.StampMicro), due.Format(time.StampMicro))
	}
	if !sameIDs(ids(recs), eventIDs(a1, a2)) {
		t.Fatalf("claim once due = %v; want %s then %s", describe(recs), a1.ID, a2.ID)
	}
	e.publishAll(src, leases)

	// With plain SQL, on a row already in the table: whatever a writer or
	// an operator puts into either column, the aggregate's order holds.
	for _, col := range []string{"deliver_at", "next_attempt_at"} {
		c1, c2, d1 := ev("held-"+col, 0), ev("held-"+col, 1), ev("free-"+col, 0)
		e.write(c1, c2, d1)
		if err := s.h.ExecDelay(e.ctx, e.table, c1.ID, col, time.Hour); err != nil {
			t.Fatalf("%s: set %s of %s: %v", s.h.Name, col, c1.ID, err)
		}
		if got := e.publishAll(src, leases); !sameIDs(ids(got), eventIDs(d1)) {
			t.Fatalf("with %s of the aggregate's first event an hour ahead, claims = %v; want only %s", col, describe(got), d1.ID)
		}
		if err := s.h.ExecDelay(e.ctx, e.table, c1.ID, col, -time.Second); err != nil {
			t.Fatalf("%s: set %s of %s: %v", s.h.Name, col, c1.ID, err)
		}
		if got := e.publishAll(src, leases); !sameIDs(ids(got), eventIDs(c1, c2)) {
			t.Fatalf("with %s of the aggregate's first event past, claims = %v; want %s then %s", col, describe(got), c1.ID, c2.ID)
		}
	}
	if st := e.status(); st.Backlog != 0 || st.Delayed != 0 {
		t.Fatalf("backlog %d, %d delayed after every event was published", st.Backlog, st.Delayed)
	}
}

// delayedBatch is how many delayed events testDelayedRelay makes due at
// the same moment.
const delayedBatch = 1000

// testDelayedRelay: undelayed events of some aggregates are published
// while aggregates whose first event is due only in an hour wait, which
// the relay never publishes. Then a thousand delayed events due at one
// moment, each followed by an undelayed event of its aggregate: none of
// their aggregates' events is published before their time, the first of
// them within one poll interval of it, each aggregate in order, and a
// relay restarted while they wait loses none.
func (s *suite) testDelayedRelay(t *testing.T) {
	e := s.newEnv(t, partitions)
	p := e.pipeline()
	var far, others []outbox.Event
	for i := range 10 {
		agg := fmt.Sprintf("far-%d", i)
		first, next := ev(agg, 0), ev(agg, 1)
		first.DeliverAt = time.Now().Add(time.Hour)
		far = append(far, first, next)
	}
	e.write(far...)
	for i := range 20 {
		o := ev(fmt.Sprintf("now-%d", i), 0)
		e.write(o)
		others = append(others, o)
	}
	r := p.start("delayed-1")
	p.rec.waitDistinct(t, len(others), 30*time.Second)

	// Long enough for a slow database under the race detector to take
	// the writes, and the relay's restart, before it.
	due := time.Now().Add(6 * time.Second)
	var delayed []outbox.Event
	for i := range delayedBatch / 100 {
		var tx []outbox.Event
		for k := range 100 {
			agg := fmt.Sprintf("late-%d", i*100+k)
			first, next := ev(agg, 0), ev(agg, 1)
			first.DeliverAt = due
			tx = append(tx, first, next)
			delayed = append(delayed, first, next)
		}
		e.write(tx...)
	}
	r.stop() // the delayed events wait in the table through a restart
	p.start("delayed-2")
	p.rec.waitDistinct(t, len(others)+len(delayed), 60*time.Second)

	first, last := time.Time{}, time.Time{}
	next := map[string]int{}
	for _, m := range p.rec.deliveries() {
		var b body
		if err := json.Unmarshal(m.Value, &b); err != nil {
			t.Fatalf("message %s: payload %q: %v", m.ID, m.Value, err)
		}
		if strings.HasPrefix(b.Agg, "far-") {
			t.Fatalf("event %d of %s was published at %s, though its aggregate's first event is due only in an hour", b.N, b.Agg, m.At.Format(time.StampMicro))
		}
		if !strings.HasPrefix(b.Agg, "late-") {
			continue
		}
		if m.At.Before(due) {
			t.Fatalf("event %d of %s was published at %s, before its aggregate's first event was due (%s)", b.N, b.Agg, m.At.Format(time.StampMicro), due.Format(time.StampMicro))
		}
		if b.N > next[b.Agg] {
			t.Fatalf("event %d of %s was published before event %d", b.N, b.Agg, next[b.Agg])
		}
		next[b.Agg] = max(next[b.Agg], b.N+1)
		if first.IsZero() {
			first = m.At
		}
		last = m.At
	}
	// Soon after it is due, not at some later, unrelated moment: within the
	// poll interval, with ten seconds to spare for a loaded machine (a
	// relay starved of CPU loses its leases and takes them back).
	if late := first.Sub(due); late > relayPoll+10*time.Second {
		t.Fatalf("the first delayed event was published %s after it was due; want within the poll interval (%s) and ten seconds", late, relayPoll)
	}
	t.Logf("%d delayed events (and as many behind them) due at once: first published %s after, the last %s after",
		delayedBatch, first.Sub(due).Round(time.Millisecond), last.Sub(due).Round(time.Millisecond))
}

// testClaimBeforeDeliverAt: a Source of this build on a table migrated
// only to the version before deliver_at (an upgrade whose relays rolled
// before the migration ran) claims as before; once the migration adds
// the column, it honours it within a few seconds, without a restart.
func (s *suite) testClaimBeforeDeliverAt(t *testing.T) {
	e := s.newEnv(t, partitions)
	if _, err := s.h.Store.MigrateDown(e.ctx, e.table, s.h.DeliverAtVersion-1); err != nil {
		t.Fatalf("%s: migrate down to %d: %v", s.h.Name, s.h.DeliverAtVersion-1, err)
	}
	src := e.source(outboxdriver.SourceConfig{})
	leases := e.leaseAll(src)
	id := newID()
	if err := s.h.ExecInsert(e.ctx, e.table, id, "order", "old-schema", "Placed", `{}`); err != nil {
		t.Fatalf("%s: insert: %v", s.h.Name, err)
	}
	if got := e.claim(src, leases, 10); !sameIDs(ids(got), []string{id}) {
		t.Fatalf("claim on a table at version %d = %v; want %s", s.h.DeliverAtVersion-1, describe(got), id)
	}
	// The relay registered on a table too old to record its version, so
	// it counts as older than the migrations with a relays floor: that it
	// is of this build is the operator's word (outbox migrate --force).
	if _, err := s.h.Store.Migrate(e.ctx, e.table, &outboxdriver.MigrateOptions{IgnoreRelaysBehind: true}); err != nil {
		t.Fatalf("%s: migrate: %v", s.h.Name, err)
	}
	if err := s.h.ExecDelay(e.ctx, e.table, id, "deliver_at", time.Hour); err != nil {
		t.Fatalf("%s: set deliver_at: %v", s.h.Name, err)
	}
	await.Eventually(t, 20*time.Second, func() error {
		if recs := e.claim(src, leases, 10); len(recs) != 0 {
			return fmt.Errorf("the claim still takes an event delayed by an hour after the migration added deliver_at: %v", describe(recs))
		}
		return nil
	})
}
