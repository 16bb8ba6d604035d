package cdc

import (
	"slices"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

func qev(agg, id string) *event {
	return &event{ID: id, AggregateType: "order", AggregateID: agg, Type: "T"}
}

func qids(evs []*event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.ID
	}
	return out
}

// The queue hands out events in commit order, never an event whose
// aggregate has an earlier one in flight or waiting for a retry, and its
// mark moves only past transactions done together with all before them.
func TestQueueOrderAndMark(t *testing.T) {
	q := newQueue()
	now := time.Now()
	t1 := &txn{end: 100, events: []*event{qev("a", "a1"), qev("b", "b1")}}
	t2 := &txn{end: 200, events: []*event{qev("a", "a2"), qev("c", "c1")}}
	t3 := &txn{end: 300}
	q.push(t1)
	q.push(t2)
	q.push(t3)
	if got := qids(q.claim(3, now, nil)); !slices.Equal(got, []string{"a1", "b1", "a2"}) {
		t.Fatalf("first claim = %v", got)
	}
	// a1, b1, a2 are in flight: only c1 is claimable.
	if got := qids(q.claim(10, now, nil)); !slices.Equal(got, []string{"c1"}) {
		t.Fatalf("second claim = %v, want [c1]", got)
	}
	a1, b1, a2, c1 := t1.events[0], t1.events[1], t2.events[0], t2.events[1]
	if m := q.markIf([]*event{a1, b1}); m != 100 {
		t.Fatalf("markIf(t1 done) = %v, want 100", m)
	}
	if m := q.markIf([]*event{a2, c1}); m != 0 {
		t.Fatalf("markIf(t2 done, t1 not) = %v, want 0", m)
	}
	// a1 fails and waits for a retry: a2 must not overtake it.
	q.done(b1)
	q.retry(a1, now.Add(time.Hour))
	q.release(a2)
	q.done(c1)
	if q.advance() {
		t.Fatal("mark moved while t1 is not done")
	}
	if got := qids(q.claim(10, now, nil)); len(got) != 0 {
		t.Fatalf("claim while a1 waits = %v, want none", got)
	}
	if got := qids(q.claim(10, now.Add(2*time.Hour), nil)); !slices.Equal(got, []string{"a1", "a2"}) {
		t.Fatalf("claim once a1 is due = %v, want [a1 a2]", got)
	}
	if a1.attempts != 1 {
		t.Fatalf("a1 attempts = %d, want 1", a1.attempts)
	}
	q.done(a1)
	if !q.advance() || q.mark != 100 {
		t.Fatalf("mark = %v, want 100", q.mark)
	}
	q.done(a2)
	if !q.advance() || q.mark != 300 || q.pending != 0 || len(q.txns) != 0 {
		t.Fatalf("mark = %v pending = %d txns = %d, want 300, 0, 0", q.mark, q.pending, len(q.txns))
	}
}

// An aggregate held behind a dead letter lets only that dead letter
// through (back from the dead-letter table, same id); other aggregates
// flow on.
func TestQueueHeldAggregate(t *testing.T) {
	q := newQueue()
	now := time.Now()
	q.held[aggKey{"order", "a"}] = "dead"
	q.push(&txn{end: 10, events: []*event{qev("a", "a2"), qev("b", "b1")}})
	q.push(&txn{end: 20, events: []*event{qev("a", "dead")}})
	got := q.claim(10, now, nil)
	if !slices.Equal(qids(got), []string{"b1", "dead"}) {
		t.Fatalf("claim = %v, want [b1 dead]", qids(got))
	}
	for _, e := range got {
		q.done(e)
	}
	delete(q.held, aggKey{"order", "a"})
	if got := qids(q.claim(10, now, nil)); !slices.Equal(got, []string{"a2"}) {
		t.Fatalf("claim after release = %v, want [a2]", got)
	}
}

// Rows drained from the table have no LSN: they never move the mark.
func TestQueueDrainedRowsHaveNoLSN(t *testing.T) {
	q := newQueue()
	q.push(&txn{events: []*event{qev("a", "r1")}})
	e := q.claim(1, time.Now(), nil)[0]
	q.done(e)
	if q.advance() || q.mark != pglogrepl.LSN(0) {
		t.Fatalf("mark = %v after a drained row, want 0", q.mark)
	}
}

// A claim of some partitions (one lane's) takes only the events of the
// aggregates in them, in commit order; another lane's claim takes the
// rest meanwhile, and neither takes an aggregate the other has in flight.
func TestQueueClaimsByPartition(t *testing.T) {
	q := newQueue()
	now := time.Now()
	// Two aggregates in different partitions.
	a := "a"
	b := "b"
	for i := 0; partitionOf(aggKey{"order", a}) == partitionOf(aggKey{"order", b}); i++ {
		b = "b" + string(rune('0'+i))
	}
	pa, pb := partitionOf(aggKey{"order", a}), partitionOf(aggKey{"order", b})
	q.push(&txn{end: 100, events: []*event{qev(a, "a1"), qev(b, "b1")}})
	q.push(&txn{end: 200, events: []*event{qev(b, "b2"), qev(a, "a2")}})
	var laneA, laneB [numPartitions]bool
	laneA[pa], laneB[pb] = true, true
	got := q.claim(10, now, &laneA)
	if !slices.Equal(qids(got), []string{"a1", "a2"}) || got[0].record().Partition != pa {
		t.Fatalf("claim of partition %d = %v (partition %d), want [a1 a2] of it", pa, qids(got), got[0].record().Partition)
	}
	if got := qids(q.claim(10, now, &laneB)); !slices.Equal(got, []string{"b1", "b2"}) {
		t.Fatalf("claim of partition %d = %v, want [b1 b2]", pb, got)
	}
	if got := qids(q.claim(10, now, nil)); len(got) != 0 {
		t.Fatalf("claim of every partition while both lanes' batches are in flight = %v, want none", got)
	}
}

// A delayed event is never claimed before its time; it is parked with the
// events of its aggregate after it, but only once the earlier events of
// its aggregate are done: one waiting for a retry keeps it in memory, so
// that it cannot be released ahead of that one.
func TestQueueParksDelayedEventsBehindEarlierOnes(t *testing.T) {
	q := newQueue()
	now := time.Now()
	a1, a2, a3, b1 := qev("a", "a1"), qev("a", "a2"), qev("a", "a3"), qev("b", "b1")
	a2.deliverAt = now.Add(time.Minute)
	q.push(&txn{end: 100, events: []*event{a1}})
	q.push(&txn{end: 200, events: []*event{a2, b1}})
	q.push(&txn{end: 300, events: []*event{a3}})

	if got := qids(q.claim(10, now, nil)); !slices.Equal(got, []string{"a1", "b1"}) {
		t.Fatalf("claim = %v, want a1 and b1, not the delayed a2 nor a3 behind it", got)
	}
	// a1 is in flight, then waits for a retry: nothing of a is parked.
	if got := qids(q.parkable(nil, now)); len(got) != 0 {
		t.Fatalf("parkable while a1 is in flight = %v", got)
	}
	q.retry(a1, now.Add(time.Second))
	if got := qids(q.parkable(nil, now)); len(got) != 0 {
		t.Fatalf("parkable while a1 waits for a retry = %v", got)
	}
	if got := qids(q.claim(10, now.Add(2*time.Second), nil)); !slices.Equal(got, []string{"a1"}) {
		t.Fatalf("claim after the retry's wait = %v, want a1 only", got)
	}
	q.done(a1)
	if got := qids(q.parkable(nil, now)); !slices.Equal(got, []string{"a2", "a3"}) {
		t.Fatalf("parkable once a1 is done = %v, want a2 then a3", got)
	}
	// Had it stayed in memory, it would be claimed once due.
	q.release(a2)
	q.release(a3)
	if got := qids(q.claim(10, now, nil)); len(got) != 0 {
		t.Fatalf("claim before a2 is due = %v", got)
	}
	if got := qids(q.claim(10, now.Add(2*time.Minute), nil)); !slices.Equal(got, []string{"a2", "a3"}) {
		t.Fatalf("claim once a2 is due = %v, want a2 then a3", got)
	}
}

// delayedAfter sees a delayed event for as long as its transaction is in
// the queue, and looks at no event once none is: the count of
// transactions holding one follows push, advance and reset.
func TestQueueDelayedAfterFollowsTheQueue(t *testing.T) {
	q := newQueue()
	now := time.Now()
	a1, b1 := qev("a", "a1"), qev("b", "b1")
	a1.deliverAt = now.Add(time.Minute)
	q.push(&txn{end: 100, events: []*event{qev("c", "c1")}})
	if q.delayedAfter(now) || q.delayedTxns != 0 {
		t.Fatalf("delayedAfter with no delayed event = true (%d transactions counted)", q.delayedTxns)
	}
	q.push(&txn{end: 200, events: []*event{b1, a1}})
	if !q.delayedAfter(now) || q.delayedTxns != 1 {
		t.Fatalf("delayedAfter with a1 delayed = false (%d transactions counted)", q.delayedTxns)
	}
	if q.delayedAfter(now.Add(2 * time.Minute)) {
		t.Fatal("delayedAfter past a1's time = true")
	}
	for _, e := range q.claim(10, now, nil) {
		q.done(e)
	}
	q.done(a1) // published once due (or parked): its transaction is done
	if q.delayedAfter(now) || q.delayedTxns != 1 {
		t.Fatalf("once a1 is done, before its transaction leaves the queue: delayedAfter true or %d transactions counted, want false and 1", q.delayedTxns)
	}
	q.advance()
	if q.delayedTxns != 0 || q.delayedAfter(now) {
		t.Fatalf("after the delayed event's transaction is done: %d transactions counted", q.delayedTxns)
	}
	q.push(&txn{end: 300, events: []*event{func() *event { e := qev("a", "a2"); e.deliverAt = now.Add(time.Hour); return e }()}})
	q.reset()
	if q.delayedTxns != 0 || q.delayedAfter(now) {
		t.Fatalf("after reset: %d transactions counted", q.delayedTxns)
	}
}

// nextDue names the earliest delayed parked event still to come, and
// never one due already, which would wake a waiter at once, again and
// again.
func TestQueueNextDue(t *testing.T) {
	q := newQueue()
	now := time.Now()
	if at := q.nextDue(now); !at.IsZero() {
		t.Fatalf("nextDue with nothing parked = %v", at)
	}
	q.parkedUntil[aggKey{"order", "a"}] = now.Add(-time.Second)
	q.parkedUntil[aggKey{"order", "b"}] = now.Add(2 * time.Second)
	q.parkedUntil[aggKey{"order", "c"}] = now.Add(time.Second)
	if at := q.nextDue(now); !at.Equal(now.Add(time.Second)) {
		t.Fatalf("nextDue = %v, want c's %v", at, now.Add(time.Second))
	}
}

// The queue counts, for the backlog, the events not done that are not
// rows of the table: messages always, streamed rows only when they were
// deleted in their own transaction (insert+delete), rows read from the
// table never; and it names the commit time of the oldest such event's
// transaction.
func TestQueueCountsTheEventsOnlyInTheWAL(t *testing.T) {
	for _, rowsGone := range []bool{false, true} {
		q := newQueue()
		q.rowsGone = rowsGone
		c1, c2 := time.Date(2026, 1, 1, 0, 0, 1, 0, time.UTC), time.Date(2026, 1, 1, 0, 0, 2, 0, time.UTC)
		row := func(agg, id string) *event { e := qev(agg, id); e.row = true; return e }
		drained := &txn{drain: true, events: []*event{row("d", "d1")}}
		t1 := &txn{end: 100, commit: c1, events: []*event{row("a", "r1"), qev("b", "m1")}}
		t2 := &txn{end: 200, commit: c2, events: []*event{qev("c", "m2"), row("a", "r2")}}
		q.push(drained)
		q.push(t1)
		q.push(t2)
		check := func(step string, wal int, oldest time.Time) {
			t.Helper()
			if q.wal != wal || !q.oldestWAL().Equal(oldest) {
				t.Fatalf("rowsGone %v, %s: wal %d oldest %v, want %d, %v", rowsGone, step, q.wal, q.oldestWAL(), wal, oldest)
			}
		}
		if rowsGone {
			check("pushed", 4, c1) // the messages and the streamed rows
		} else {
			check("pushed", 2, c1) // the messages
		}
		q.done(drained.events[0])
		q.done(t1.events[1]) // m1
		if rowsGone {
			check("m1 done", 3, c1) // r1 is left of t1
			q.done(t1.events[0])
			check("t1 done", 2, c2) // m2 and r2
		} else {
			check("t1's message done", 1, c2) // m2; r1 and r2 are the table's
			q.done(t1.events[0])
		}
		q.done(t2.events[0])
		q.done(t2.events[1])
		q.advance()
		check("all done", 0, time.Time{})
		q.push(&txn{end: 300, commit: c2, events: []*event{qev("e", "m3")}})
		q.reset()
		check("reset", 0, time.Time{})
	}
}
