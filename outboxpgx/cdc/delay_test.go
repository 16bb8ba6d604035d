package cdc_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/relay"
)

// published returns when each id reached the stream (JetStream's time),
// and the stream's ids in order.
func (f *cdcFixture) publishedAt() (map[string]time.Time, []string) {
	f.t.Helper()
	at := map[string]time.Time{}
	var order []string
	for _, m := range testenv.StreamMessages(f.t, f.st) {
		id := m.Header.Get("id")
		if _, ok := at[id]; !ok {
			at[id] = m.Time
			order = append(order, id)
		}
	}
	return at, order
}

// before fails the test unless a comes before b in order.
func before(t *testing.T, order []string, a, b string) {
	t.Helper()
	i, j := slices.Index(order, a), slices.Index(order, b)
	if i < 0 || j < 0 || i > j {
		t.Fatalf("%s at %d, %s at %d in the stream: want the first before the second", a, i, b, j)
	}
}

// Log tailing parks a delayed event, and its aggregate's later events
// behind it, in the database; they are published at its time and in
// order, across a relay restart, whether the row stays (table mode) or is
// deleted at once (insert+delete written with plain SQL). Other
// aggregates flow meanwhile.
func TestCDCDelayedEventsAreParkedAndPublishedInOrder(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	stop := f.streamingRelay()

	due := time.Now().Add(5 * time.Second).Truncate(time.Millisecond)
	a1, a2, b1 := cdcEvent("a", 1), cdcEvent("a", 2), cdcEvent("b", 1)
	a1.DeliverAt = due
	f.write(f.writer(modeTable), a1)
	f.write(f.writer(modeTable), a2)
	// Insert + delete by plain SQL: the WAL and then the parked table are
	// the only copies.
	c1, c2 := cdcEvent("c", 1).ID, cdcEvent("c", 2).ID
	tx, err := f.pool.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) })
	for i, id := range []string{c1, c2} {
		var at *time.Time
		if i == 0 {
			at = &due
		}
		if _, err := tx.Exec(f.ctx, `INSERT INTO `+f.tb.Qualified("")+` (id, aggregatetype, aggregateid, type, payload, deliver_at)
VALUES ($1, 'order', 'c', 'Placed', $2, $3)`, id, fmt.Sprintf(`{"n": %d}`, i+1), at); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(f.ctx, `DELETE FROM `+f.tb.Qualified("")+` WHERE id = $1`, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	f.write(f.writer(modeTable), b1)
	f.waitFor(b1.ID)

	// Parked, durably, before their time; then the relay stops.
	f.eventually("the delayed events and those behind them are parked", func() bool { return f.count("_cdc_parked") == 4 })
	if now := time.Now(); now.After(due) {
		t.Fatalf("the test is too slow: %s past the due time before the checks", now.Sub(due))
	}
	for _, id := range []string{a1.ID, a2.ID, c1, c2} {
		if slices.Contains(f.delivered(), id) {
			t.Fatalf("%s published before its aggregate's delayed event was due", id)
		}
	}
	st, err := f.drv.Status(f.ctx, f.tb)
	if err != nil {
		t.Fatal(err)
	}
	if st.Delayed != 2 || st.Parked != 4 {
		t.Fatalf("status: %d delayed, %d parked; want 2 (one row, one deleted row), 4", st.Delayed, st.Parked)
	}
	stop()

	// Another relay publishes them at their time, in order.
	f.relay(f.source("r2", nil), relay.Config{})
	f.waitFor(a1.ID, a2.ID, c1, c2)
	at, order := f.publishedAt()
	before(t, order, a1.ID, a2.ID)
	before(t, order, c1, c2)
	for _, id := range []string{a1.ID, c1} {
		if at[id].Before(due) {
			t.Errorf("%s published at %s, %s before its time", id, at[id].Format(time.RFC3339Nano), due.Sub(at[id]))
		}
		if late := at[id].Sub(due); late > 2*time.Second {
			t.Errorf("%s published %s after its time", id, late)
		}
	}
	f.eventually("the parked table is empty", func() bool { return f.count("_cdc_parked") == 0 })
	f.eventually("the table's rows are done", func() bool {
		var left int
		if err := f.pool.QueryRow(f.ctx, `SELECT count(*) FROM `+f.tb.Qualified("")+` WHERE published_at IS NULL`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		return left == 0
	})
}

// A thousand delayed events due at the same moment, each followed by an
// undelayed event of its aggregate, are published from that moment on,
// the first within the relay's poll interval and a second, each pair in
// order. How fast the rest follow is the drain's speed, which outbox
// bench measures, not this test.
func TestCDCManyDelayedEventsDueAtOnce(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	f.setup()
	const pairs = 1000
	poll := 200 * time.Millisecond
	f.relay(f.source("r1", nil), relay.Config{PollInterval: poll})
	f.streaming()

	due := time.Now().Add(8 * time.Second).Truncate(time.Millisecond)
	var first, second []string
	var events []outbox.Event
	for i := range pairs {
		d, n := cdcEvent(fmt.Sprintf("agg-%d", i), 1), cdcEvent(fmt.Sprintf("agg-%d", i), 2)
		d.DeliverAt = due
		first, second = append(first, d.ID), append(second, n.ID)
		events = append(events, d, n)
	}
	ob := f.writer(modeTable)
	for chunk := range slices.Chunk(events, 200) {
		f.write(ob, chunk...)
	}
	other := cdcEvent("other", 1)
	f.write(ob, other)
	f.waitFor(other.ID)
	if time.Now().After(due) {
		t.Fatal("the test is too slow: the events were due before they were all written")
	}
	f.waitFor(slices.Concat(first, second)...)
	at, order := f.publishedAt()
	var firstAt, last time.Time
	for i := range pairs {
		if at[first[i]].Before(due) {
			t.Fatalf("event %s published %s before its time", first[i], due.Sub(at[first[i]]))
		}
		before(t, order, first[i], second[i])
		for _, id := range []string{first[i], second[i]} {
			if at[id].After(last) {
				last = at[id]
			}
			if firstAt.IsZero() || at[id].Before(firstAt) {
				firstAt = at[id]
			}
		}
	}
	if late := firstAt.Sub(due); late > poll+time.Second {
		t.Fatalf("the first of %d events due at once was published %s after their time, want within %s", 2*pairs, late, poll+time.Second)
	}
	t.Logf("%d events due at once: the first published %s after their time, the last %s", 2*pairs,
		firstAt.Sub(due).Round(time.Millisecond), last.Sub(due).Round(time.Millisecond))
}

// On a table whose parked events have no deliver_at yet (schema version
// 13), the relay of this version dead-letters a delayed row as an earlier
// one did, rather than publish it early; after the migration it parks it.
func TestCDCDelayedEventBeforeSchema14IsDeadLettered(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	f.ddl(func() {
		if _, err := f.drv.MigrateDown(f.ctx, f.tb, 13); err != nil {
			t.Fatal(err)
		}
	})
	f.streamingRelay()
	late := cdcEvent("late", 1)
	late.DeliverAt = time.Now().Add(time.Hour)
	marker := cdcEvent("m", 1)
	f.write(f.writer(modeTable), late)
	f.write(f.writer(modeTable), marker)
	f.waitFor(marker.ID)
	f.eventually("the delayed row is dead-lettered", func() bool { return f.count("_dead_letter") == 1 })
	var id, lastErr string
	if err := f.pool.QueryRow(f.ctx, `SELECT id::text, last_error FROM `+f.tb.Qualified("_dead_letter")).Scan(&id, &lastErr); err != nil {
		t.Fatal(err)
	}
	if id != late.ID || !strings.Contains(lastErr, "before version 14") {
		t.Fatalf("dead letter %s: %q; want %s with a cause naming the schema", id, lastErr, late.ID)
	}
	if slices.Contains(f.delivered(), late.ID) {
		t.Fatalf("the delayed event %s was published", late.ID)
	}
	// Message and insert+delete writers refuse a delayed event.
	for _, mode := range []string{modeMessage, modeInsertDelete} {
		tx, err := f.pool.Begin(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		err = f.writer(mode).WriteTx(f.ctx, tx, late)
		tx.Rollback(f.ctx)
		if !errors.Is(err, outbox.ErrInvalidEvent) || !strings.Contains(err.Error(), "DeliverAt") {
			t.Fatalf("%s mode: WriteTx of a delayed event = %v; want ErrInvalidEvent naming DeliverAt", mode, err)
		}
	}
}

// Reverting version 14 while a delayed event is parked would publish it
// early: refused until it is gone.
func TestCDCMigrateDownKeepsParkedDelays(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	stop := f.streamingRelay()
	late := cdcEvent("late", 1)
	late.DeliverAt = time.Now().Add(time.Hour)
	f.write(f.writer(modeTable), late)
	f.eventually("the delayed event is parked", func() bool { return f.count("_cdc_parked") == 1 })
	stop()
	if _, err := f.drv.MigrateDown(f.ctx, f.tb, 13); err == nil || !strings.Contains(err.Error(), "1 parked delayed event(s) not due yet") {
		t.Fatalf("migrate --down 13 with a parked delayed event: %v", err)
	}
	if f.count("_cdc_parked") != 1 {
		t.Fatal("the parked event is gone")
	}
}
