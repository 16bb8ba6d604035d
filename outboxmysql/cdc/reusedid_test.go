package cdc_test

import (
	"errors"
	"testing"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxmysql/cdc"
)

// TestBinlogReusedIDIsNotDroppedOnItsWayToTheDeadLetters: in insert-delete
// mode the table is empty between writes, so nothing refuses a reused id.
// An event whose id the dead letters hold for another event is not
// dropped on its way there: the first dead letter stays as it is, and the
// event stays unconfirmed in the log, so a streamer that takes over reads
// it again.
func TestBinlogReusedIDIsNotDroppedOnItsWayToTheDeadLetters(t *testing.T) {
	f := newFixture(t)
	a := f.source("a", cdc.ModeInsertDelete, outboxdriver.RetentionDelete)
	if err := a.Setup(f.ctx); err != nil {
		t.Fatal(err)
	}
	leases := f.acquire(a, 2*time.Second)
	const id = "00000000-0000-4000-8000-00000000dead"
	write := func(agg string) {
		tx, err := f.db.BeginTx(f.ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(f.ctx, "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (?, 'order', ?, 'Step', '{}')", id, agg); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(f.ctx, "DELETE FROM outbox WHERE id = ?", id); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	deadLetter := func(src *cdc.Source, leases []outboxdriver.Lease, agg string) {
		t.Helper()
		b := f.claimN(src, leases, 1)
		if got := b.Records()[0]; got.ID != id || got.AggregateID != agg {
			t.Fatalf("claimed %s of aggregate %s, want %s of %s", got.ID, got.AggregateID, id, agg)
		}
		if err := b.Finish(f.ctx, outboxdriver.Outcome{Failed: []outboxdriver.Failure{{ID: id, Err: errors.New("poison"), DeadLetter: true}}}); err != nil {
			t.Fatal(err)
		}
	}
	write("p")
	deadLetter(a, leases, "p")
	write("q")
	deadLetter(a, leases, "q")
	var n int
	var agg string
	if err := f.db.QueryRowContext(f.ctx, "SELECT COUNT(*), MIN(aggregateid) FROM outbox_dead_letter WHERE id = ?", id).Scan(&n, &agg); err != nil || n != 1 || agg != "p" {
		t.Fatalf("%d dead letters of %s, of aggregate %q (%v); want the first event's alone, p", n, id, agg, err)
	}
	a.Close() // the lease expires
	b := f.source("b", cdc.ModeInsertDelete, outboxdriver.RetentionDelete)
	leases = f.acquire(b, 10*time.Second)
	batch := f.claimN(b, leases, 1)
	if got := batch.Records()[0]; got.ID != id || got.AggregateID != "q" {
		t.Fatalf("the streamer that took over read %s of aggregate %s, want the kept event, %s of q", got.ID, got.AggregateID, id)
	}
}
