package cdc_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxpgx"
)

// Writers in message and insert + delete mode refuse, with
// outboxpgx.ErrNoSlot and a message that says what to do, while no
// replication slot relays the table, on every write path (WriteTx, Write,
// a Tx from Begin, Queue in a batch): nothing is written, where no relay
// would ever read it. Once the slot exists they write and the relay
// publishes; once it is dropped they refuse again.
func TestCDCWritersRefuseWhileNoSlotExists(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	refused := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, outboxpgx.ErrNoSlot) || !strings.Contains(err.Error(), "outbox migrate --cdc") {
			t.Fatalf("%s with no slot: %v, want outboxpgx.ErrNoSlot saying to run `outbox migrate --cdc`", what, err)
		}
	}
	for _, mode := range []string{modeMessage, modeInsertDelete} {
		ob, drv := f.writerAndDriver(mode)
		refused(mode+": Write", ob.Write(f.ctx, cdcEvent("w-"+mode, 1)))

		tx, err := f.pool.Begin(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		refused(mode+": WriteTx", ob.WriteTx(f.ctx, tx, cdcEvent("t-"+mode, 1)))
		tx.Rollback(f.ctx)

		otx, err := drv.Begin(f.ctx, pgx.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := ob.WriteTx(f.ctx, otx, cdcEvent("c-"+mode, 1)); err != nil {
			t.Fatal(err) // kept for the commit
		}
		refused(mode+": a Tx's Commit", otx.Commit(f.ctx))

		btx, err := f.pool.Begin(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		var b pgx.Batch
		if err := ob.Queue(f.ctx, &b, cdcEvent("q-"+mode, 1)); err != nil {
			t.Fatal(err)
		}
		if err := btx.SendBatch(f.ctx, &b).Close(); err == nil || !strings.Contains(err.Error(), "no replication slot relays") {
			t.Fatalf("%s: a queued event with no slot: %v, want the database's refusal", mode, err)
		}
		btx.Rollback(f.ctx)
	}
	if n := f.count(""); n != 0 {
		t.Fatalf("%d rows left in the table by refused writes", n)
	}

	stop := f.streamingRelay() // makes the slot
	var ids []string
	for _, mode := range []string{modeMessage, modeInsertDelete} {
		ob := f.writer(mode)
		e := cdcEvent("after-"+mode, 1)
		f.write(ob, e)
		ids = append(ids, e.ID)
	}
	f.waitFor(ids...)

	// The insert + delete writer's statement without wake-ups turns them
	// off for the rest of its transaction, and leaves no row.
	quiet, err := outbox.New(outboxpgx.New(f.pool, outboxpgx.WithInsertDelete(), outboxpgx.WithoutWakeups()), &outbox.Config{Schema: f.tb.Schema, Table: f.tb.Name})
	if err != nil {
		t.Fatal(err)
	}
	var notify string
	err = pgx.BeginFunc(f.ctx, f.pool, func(tx pgx.Tx) error {
		if err := quiet.WriteTx(f.ctx, tx, cdcEvent("quiet", 1), cdcEvent("quiet", 2)); err != nil {
			return err
		}
		return tx.QueryRow(f.ctx, `SELECT coalesce(current_setting('outbox.notify', true), '')`).Scan(&notify)
	})
	if err != nil || notify != "off" {
		t.Fatalf("insert + delete without wake-ups: outbox.notify = %q, %v; want off", notify, err)
	}
	if n := f.count(""); n != 0 {
		t.Fatalf("%d rows left by insert + delete", n)
	}

	stop()
	f.exec(`SELECT pg_drop_replication_slot($1)`, f.slot())
	for _, mode := range []string{modeMessage, modeInsertDelete} {
		refused(mode+": Write after the slot was dropped", f.writer(mode).Write(context.WithoutCancel(f.ctx), cdcEvent("late-"+mode, 1)))
	}
}
