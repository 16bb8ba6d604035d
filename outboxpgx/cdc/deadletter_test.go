package cdc

import (
	"context"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxpgx"
)

// PostgreSQL sends a transaction to the stream a moment before other
// sessions see it. The claim's dead-letter lookup must therefore say when
// the event's transaction is not visible yet: an operator's retry moves the
// dead letter back in that very transaction, and until it is visible the
// dead letter still looks present (the retried event was taken for a
// replay of the dead letter and dropped, its aggregate held for ever).
func TestDeadLetterLookupSaysWhenTheEventsTransactionIsNotVisibleYet(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, time.Minute)
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	if _, err := outboxpgx.New(pool).Migrate(ctx, tb, nil); err != nil {
		t.Fatal(err)
	}
	id := testenv.AddDeadLetters(t, pool, tb, testenv.DeadLetterRow{AggregateType: "order", AggregateID: "p", Type: "T", Payload: "{}", LastError: "poison", Attempts: 1, Held: true})[0]
	q := newQueries(tb).isDeadLetter
	lookup := func(xid int64) (dead, visible bool) {
		t.Helper()
		var got string
		if err := pool.QueryRow(ctx, q, pgschema.UUIDArray([]string{id}), []int64{xid}).Scan(&got, &dead, &visible); err != nil {
			t.Fatal(err)
		}
		return dead, visible
	}

	// The retry's transaction: the dead letter moves back, not committed.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, `DELETE FROM `+tb.Qualified("_dead_letter")+` WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	var full int64
	if err := tx.QueryRow(ctx, `SELECT txid_current()`).Scan(&full); err != nil {
		t.Fatal(err)
	}
	xid := full & 0xffffffff // what the stream says
	if dead, visible := lookup(xid); !dead || visible {
		t.Fatalf("retry in progress: dead %v, visible %v; want the dead letter still seen and the transaction not visible", dead, visible)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if dead, visible := lookup(xid); dead || !visible {
		t.Fatalf("retry committed: dead %v, visible %v; want the dead letter gone and the transaction visible", dead, visible)
	}
	if _, visible := lookup(0); !visible {
		t.Fatal("an event read from the table (no xid) is not visible")
	}
}
