package cdc_test

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxpgx/cdc"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/sink"
)

// gatedSink holds the publishes of one aggregate (key) until open is
// closed (release), and says when the first one waits.
type gatedSink struct {
	sink.Sink
	key      string
	open     chan struct{}
	waiting  chan struct{}
	once     sync.Once
	openOnce sync.Once
}

// release lets the held publishes go; it may be called again.
func (s *gatedSink) release() { s.openOnce.Do(func() { close(s.open) }) }

func (s *gatedSink) Publish(ctx context.Context, msgs []sink.Message) []error {
	if slices.ContainsFunc(msgs, func(m sink.Message) bool { return string(m.Key) == s.key }) {
		s.once.Do(func() { close(s.waiting) })
		select {
		case <-s.open:
		case <-ctx.Done():
		}
	}
	return s.Sink.Publish(ctx, msgs)
}

// In table mode, a slot lost while an event is in flight and a
// transaction is open: the relay reports the loss once, makes a new slot
// (which waits for the open transaction), relays the rows still in the
// table (the open transaction's, and those committed while the new slot
// was being made) ahead of the new slot's stream, and streams on. Nothing
// is lost and each aggregate's events arrive in commit order across the
// switch.
func TestCDCSlotLostWithAnEventInFlightAndATransactionOpen(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	logged := &lockedLog{t: t}
	f.log = slog.New(slog.NewTextHandler(logged, &slog.HandlerOptions{Level: slog.LevelWarn}))
	f.setup()
	snk := &gatedSink{Sink: f.natsSink(), key: "d", open: make(chan struct{}), waiting: make(chan struct{})}
	// A long lease: the held publish must not time out (half a TTL).
	f.ddl(func() {
		f.relayInto(f.source("r1", nil), snk, relay.Config{LeaseTTL: 20 * time.Second})
		f.streaming()
	})
	t.Cleanup(snk.release) // before the relay stops (cleanups run last-in first-out), even when the test fails
	ob := f.writer(modeTable)
	var written []outbox.Event
	write := func(evs ...outbox.Event) {
		t.Helper()
		f.write(ob, evs...)
		written = append(written, evs...)
	}
	write(cdcEvent("a", 0))
	f.waitFor(written[0].ID)

	// In flight at the loss: decoded, claimed, its publish held.
	write(cdcEvent("d", 1))
	select {
	case <-snk.waiting:
	case <-time.After(30 * time.Second):
		t.Fatal("the event of aggregate d was never published")
	}
	open := []outbox.Event{cdcEvent("a", 1), cdcEvent("b", 1)}
	f.ddl(func() { // the relay makes the slot again
		// Open across the loss: written before, committed after. Begun in
		// the turn: a test that makes a slot in its turn waits for every
		// open transaction, and this one must not wait for that turn.
		tx := f.begin(ob, open...)
		f.dropSlotWhileStreamed()
		snk.release() // the held publish completes after the loss
		f.eventually("the relay makes a new slot (it waits for the open transaction)", func() bool {
			var n int
			err := f.pool.QueryRow(f.ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, f.slot()).Scan(&n)
			return err == nil && n == 1
		})
		// Committed while the new slot is not consistent yet: not in its
		// stream, only in the table.
		write(cdcEvent("c", 1), cdcEvent("d", 2))
		f.commit(tx)
		written = append(written, open...)
		f.streaming()
	})
	write(cdcEvent("a", 2), cdcEvent("b", 2), cdcEvent("c", 2), cdcEvent("d", 3))

	var ids []string
	byAgg := map[string][]string{}
	for _, e := range written {
		ids = append(ids, e.ID)
		byAgg[e.AggregateID] = append(byAgg[e.AggregateID], e.ID)
	}
	got := f.waitFor(ids...)
	for agg, want := range byAgg {
		var order []string
		for _, id := range got {
			if slices.Contains(want, id) && !slices.Contains(order, id) {
				order = append(order, id)
			}
		}
		if !slices.Equal(order, want) {
			t.Fatalf("aggregate %s published in the order %v, want the commit order %v", agg, order, want)
		}
	}
	if n := logged.lines("replication slot lost"); n != 1 {
		t.Fatalf("the lost slot was reported %d times, want once", n)
	}
	f.eventually("published rows are deleted", func() bool { return f.count("") == 0 })
}

// The rows a new slot does not hold are read from the table page by page
// while writers go on. A row whose transaction commits after the page
// that its seq falls in was read comes only from the new slot's stream,
// after every row read from the table: a later row of its aggregate,
// committed after it and read by a later page, must not go out first.
// Here the relay holds one event in memory (MaxPending 1), so each page
// is one row, and the test holds the pages apart by holding publishes.
func TestCDCRowsReadFromTheTableKeepCommitOrderWithLateCommits(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	ob := f.writer(modeTable)
	z1 := cdcEvent("z", 1)
	f.write(ob, z1) // in the table before the slot
	f.setup()
	gateB := &gatedSink{Sink: f.natsSink(), key: "b", open: make(chan struct{}), waiting: make(chan struct{})}
	gateZ := &gatedSink{Sink: gateB, key: "z", open: make(chan struct{}), waiting: make(chan struct{})}
	f.relayInto(f.source("r1", &cdc.Config{MaxPending: 1}), gateZ, relay.Config{LeaseTTL: 20 * time.Second})
	t.Cleanup(gateZ.release) // before the relay stops, even when the test fails
	t.Cleanup(gateB.release)
	wait := func(g *gatedSink) {
		t.Helper()
		select {
		case <-g.waiting:
		case <-time.After(30 * time.Second):
			t.Fatalf("aggregate %s was never published", g.key)
		}
	}
	wait(gateZ) // the first page (z1) is read, the new slot made before it
	a1, b1, a2 := cdcEvent("a", 1), cdcEvent("b", 1), cdcEvent("a", 2)
	tx := f.begin(ob, a1) // a1 takes its seq now and commits late
	f.write(ob, b1)
	gateZ.release()
	wait(gateB) // the next page: b1 (a1 is not committed yet)
	f.commit(tx)
	f.write(ob, a2) // after a1
	gateB.release()
	got := f.waitFor(z1.ID, a1.ID, b1.ID, a2.ID)
	if first := slices.Index(got, a1.ID); first > slices.Index(got, a2.ID) {
		t.Fatalf("published %v: a2 before a1, which committed first", got)
	}
}
