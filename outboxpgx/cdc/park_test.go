package cdc_test

import (
	"slices"
	"testing"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/relay"
)

// sayEvent is an event of aggregate agg whose payload says body: the
// faultySink refuses "poison" for good.
func sayEvent(agg, body string) outbox.Event {
	return outbox.Event{ID: uuid.NewString(), AggregateType: "order", AggregateID: agg, Type: "T", Payload: []byte(`{"say": "` + body + `"}`)}
}

// walNow is the WAL's insert position now: every commit so far ends
// before it.
func (f *cdcFixture) walNow() string {
	f.t.Helper()
	var lsn string
	if err := f.pool.QueryRow(f.ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn); err != nil {
		f.t.Fatal(err)
	}
	return lsn
}

// confirmedPast waits until the slot confirmed lsn.
func (f *cdcFixture) confirmedPast(what, lsn string) {
	f.t.Helper()
	f.eventually(what, func() bool {
		var ok bool
		err := f.pool.QueryRow(f.ctx, `SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`, f.slot(), lsn).Scan(&ok)
		return err == nil && ok
	})
}

// firstOrder fails unless the ids were first published in this order.
func firstOrder(t *testing.T, got []string, ids ...string) {
	t.Helper()
	pos := make([]int, len(ids))
	for i, id := range ids {
		pos[i] = slices.Index(got, id)
		if pos[i] < 0 {
			t.Fatalf("event %d of %d (%s) not published", i+1, len(ids), id)
		}
	}
	if !slices.IsSorted(pos) {
		t.Fatalf("published at %v, want in this order", pos)
	}
}

// Under the hold policy the stream's later events of an aggregate held
// behind a dead letter are parked in the database, so the slot confirms
// past them while other aggregates flow; an operator's retry of the dead
// letter publishes it, then the parked events in order, then the later
// ones. In every write mode.
func TestCDCParksAHeldAggregateAndReleasesItInOrderOnRetry(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			f, snk := parkFixture(t)
			ob := f.writer(mode)
			p1, p2, p3, b1 := sayEvent("p", "poison"), sayEvent("p", "2"), sayEvent("p", "3"), sayEvent("b", "1")
			f.write(ob, p1, b1)
			f.write(ob, p2)
			f.write(ob, p3)
			f.waitFor(b1.ID)
			f.eventually("p1 is dead-lettered and p2, p3 are parked", func() bool {
				return f.count("_dead_letter") == 1 && f.count("_held") == 1 && f.count("_cdc_parked") == 2
			})
			f.confirmedPast("the slot confirms past the parked events", f.walNow())
			p4, b2 := sayEvent("p", "4"), sayEvent("b", "2")
			f.write(ob, p4, b2)
			f.waitFor(b2.ID)
			f.eventually("p4 is parked behind them", func() bool { return f.count("_cdc_parked") == 3 })
			f.confirmedPast("the slot confirms past p4", f.walNow())
			if st, err := f.drv.Status(f.ctx, f.tb); err != nil || st.Parked != 3 || st.Held != 1 {
				t.Fatalf("status: %d parked, %d held, %v; want 3 parked, 1 held", st.Parked, st.Held, err)
			}
			if got := f.delivered(); slices.ContainsFunc(got, func(id string) bool { return slices.Contains([]string{p1.ID, p2.ID, p3.ID, p4.ID}, id) }) {
				t.Fatalf("an event of the held aggregate was published: %v", got)
			}
			snk.cured.Store(true)
			if ids, err := f.drv.RetryDeadLetters(f.ctx, f.tb, nil, outboxdriver.Acting{Name: "test"}); err != nil || len(ids) != 1 {
				t.Fatalf("retry dead letters = %v, %v", ids, err)
			}
			p5 := sayEvent("p", "5")
			f.write(ob, p5)
			got := f.waitFor(p1.ID, p2.ID, p3.ID, p4.ID, p5.ID)
			firstOrder(t, got, p1.ID, p2.ID, p3.ID, p4.ID, p5.ID)
			f.eventually("nothing left parked, held or in the table", func() bool {
				return f.count("_cdc_parked") == 0 && f.count("_held") == 0 && f.count("") == 0
			})
			f.caughtUp()
		})
	}
}

// A discarded dead letter releases its aggregate: the parked events go
// out in order, the dead letter never.
func TestCDCParkedEventsFlowInOrderAfterADiscard(t *testing.T) {
	t.Parallel()
	f, _ := parkFixture(t)
	ob := f.writer(modeMessage)
	p1, p2, p3 := sayEvent("p", "poison"), sayEvent("p", "2"), sayEvent("p", "3")
	f.write(ob, p1)
	f.write(ob, p2, p3)
	f.eventually("p2, p3 are parked", func() bool { return f.count("_held") == 1 && f.count("_cdc_parked") == 2 })
	if ids, err := f.drv.DiscardDeadLetters(f.ctx, f.tb, nil, outboxdriver.Acting{Name: "test"}); err != nil || len(ids) != 1 {
		t.Fatalf("discard dead letters = %v, %v", ids, err)
	}
	p4 := sayEvent("p", "4")
	f.write(ob, p4)
	got := f.waitFor(p2.ID, p3.ID, p4.ID)
	firstOrder(t, got, p2.ID, p3.ID, p4.ID)
	if slices.Contains(got, p1.ID) {
		t.Fatalf("the discarded dead letter was published: %v", got)
	}
	f.eventually("nothing left parked or held", func() bool { return f.count("_cdc_parked") == 0 && f.count("_held") == 0 })
}

// parkFixture is a fixture with its slot, relayed in this process through
// a faultySink that refuses "poison" until cured.
func parkFixture(t *testing.T) (*cdcFixture, *faultySink) {
	f := newCDC(t)
	f.setup()
	snk := &faultySink{Sink: f.natsSink(), tried: map[string]bool{}}
	f.relayInto(f.source("r1", nil), snk, relay.Config{Poison: relay.Hold})
	f.streaming()
	return f, snk
}

// Relay processes are killed (SIGKILL) while an aggregate is held with
// events parked, and again while the retried dead letter and the parked
// events are being released: every event of the aggregate is published,
// first in commit order, and nothing stays parked. In the modes whose
// events exist only in the WAL.
func TestCDCParkedEventsSurviveKilledRelays(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{modeMessage, modeInsertDelete} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			f := newCDC(t)
			f.setup()
			ob := f.writer(mode)
			a := f.startProcess("a", "poison")
			f.streaming()
			p := []outbox.Event{sayEvent("p", "poison"), sayEvent("p", "2"), sayEvent("p", "3")}
			b1 := sayEvent("b", "1")
			f.write(ob, p[0], b1)
			f.write(ob, p[1])
			f.write(ob, p[2])
			f.waitFor(b1.ID)
			f.eventually("p1 is dead-lettered and p2, p3 are parked", func() bool {
				return f.count("_held") == 1 && f.count("_cdc_parked") == 2
			})
			f.confirmedPast("the slot confirms past the parked events", f.walNow())
			a.kill()
			p = append(p, sayEvent("p", "4"))
			b2 := sayEvent("b", "2")
			f.write(ob, p[3], b2)
			b := f.startProcess("b", "poison")
			f.waitFor(b2.ID)
			f.eventually("p4 is parked behind them", func() bool { return f.count("_cdc_parked") == 3 })
			f.confirmedPast("the slot confirms past p4", f.walNow())
			// An operator repairs the dead letter and retries it.
			f.exec(`UPDATE ` + f.tb.Qualified("_dead_letter") + ` SET payload = '{"say": "cured"}'`)
			if ids, err := f.drv.RetryDeadLetters(f.ctx, f.tb, nil, outboxdriver.Acting{Name: "test"}); err != nil || len(ids) != 1 {
				t.Fatalf("retry dead letters = %v, %v", ids, err)
			}
			p = append(p, sayEvent("p", "5"))
			f.write(ob, p[4])
			f.waitFor(p[0].ID) // the release has begun
			b.kill()
			f.startProcess("c", "poison")
			ids := make([]string, len(p))
			for i, e := range p {
				ids[i] = e.ID
			}
			firstOrder(t, f.waitFor(ids...), ids...)
			f.eventually("nothing left parked or held", func() bool { return f.count("_cdc_parked") == 0 && f.count("_held") == 0 })
		})
	}
}
