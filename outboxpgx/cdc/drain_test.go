package cdc_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx/cdc"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/sink"
)

// caughtUp waits until the slot confirmed every commit so far, and so the
// relay has read and published everything its stream will ever bring.
func (f *cdcFixture) caughtUp() {
	f.t.Helper()
	var last string
	if err := f.pool.QueryRow(f.ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&last); err != nil {
		f.t.Fatal(err)
	}
	f.eventually("the slot confirms up to the last commit", func() bool {
		var ok bool
		err := f.pool.QueryRow(f.ctx, `SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`, f.slot(), last).Scan(&ok)
		return err == nil && ok
	})
}

// countingSink records every message its sink acknowledged, in order:
// JetStream drops copies by Nats-Msg-Id, so its stream cannot show them.
type countingSink struct {
	sink.Sink
	mu  sync.Mutex
	ids []string
}

func (s *countingSink) Publish(ctx context.Context, msgs []sink.Message) []error {
	errs := s.Sink.Publish(ctx, msgs)
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, m := range msgs {
		if errs[i] == nil {
			s.ids = append(s.ids, m.ID)
		}
	}
	return errs
}

func (s *countingSink) published() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ids)
}

// countingRelay starts a relay over src into the fixture's stream through
// a countingSink.
func (f *cdcFixture) countingRelay(src outboxdriver.Source, cfg relay.Config) *countingSink {
	f.t.Helper()
	snk := &countingSink{Sink: f.natsSink()}
	f.relayInto(src, snk, cfg)
	return snk
}

// onceEach fails unless got holds each of want exactly once.
func onceEach(t *testing.T, got, want []string) {
	t.Helper()
	seen := map[string]int{}
	for _, id := range got {
		seen[id]++
	}
	for _, id := range want {
		if seen[id] != 1 {
			t.Errorf("event %s published %d times, want once", id, seen[id])
		}
	}
	if len(got) != len(want) {
		t.Errorf("published %d messages, want %d", len(got), len(want))
	}
}

// A slot made by `outbox migrate --cdc` on an empty table holds every
// event written after it: the first relay has nothing to drain, and each
// event is published once (no duplicate without a fault).
func TestCDCSlotMadeOnAnEmptyTablePublishesEachEventOnce(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	f.setup()
	ob := f.writer(modeTable)
	var ids []string
	for i := range 20 {
		e := cdcEvent(fmt.Sprint("e", i%3), i)
		f.write(ob, e)
		ids = append(ids, e.ID)
	}
	snk := f.countingRelay(f.source("r1", nil), relay.Config{})
	f.waitFor(ids...)
	f.caughtUp()
	onceEach(t, snk.published(), ids)
}

// Rows in the table when the slot is made are drained from the table,
// every row committed after it comes from the stream: each once, and each
// aggregate in commit order, also for rows committed while the drain
// reads.
func TestCDCDrainsExactlyTheRowsTheSlotDoesNotHold(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	ob := f.writer(modeTable)
	var mu sync.Mutex
	var all []string
	order := map[string][]string{} // per aggregate, in commit order
	write := func(tag string, n int) {
		for i := range n {
			e := cdcEvent(fmt.Sprint(tag, i%4), i)
			f.write(ob, e)
			mu.Lock()
			all = append(all, e.ID)
			order[e.AggregateID] = append(order[e.AggregateID], e.ID)
			mu.Unlock()
		}
	}
	agg := func(n int) []outbox.Event { // many rows in few transactions
		evs := make([]outbox.Event, n)
		for i := range evs {
			evs[i] = cdcEvent(fmt.Sprint("a", i%4), i)
		}
		return evs
	}
	for range 4 {
		evs := agg(500)
		f.write(ob, evs...)
		for _, e := range evs {
			all = append(all, e.ID)
			order[e.AggregateID] = append(order[e.AggregateID], e.ID)
		}
	}
	f.setup()
	write("a", 20) // after the slot, before any relay: in its stream
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // while the relay drains
		defer wg.Done()
		write("a", 100)
	}()
	snk := f.countingRelay(f.source("r1", &cdc.Config{MaxPending: 100}), relay.Config{BatchSize: 50})
	wg.Wait()
	f.waitFor(all...)
	f.caughtUp()
	got := snk.published()
	onceEach(t, got, all)
	for a, ids := range order {
		var pos []int
		for _, id := range ids {
			pos = append(pos, slices.Index(got, id))
		}
		if !slices.IsSorted(pos) {
			t.Errorf("aggregate %s published out of commit order", a)
		}
	}
}
