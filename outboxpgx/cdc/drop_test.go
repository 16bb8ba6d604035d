package cdc_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxpgx/cdc"
)

// Drop removes the slot, its state and its publication and keeps the
// table: refused while a relay streams the slot; in table mode the rows
// still in the table are published by the next relay, whose slot is new.
func TestCDCDropKeepsTheTableAndTheNextRelayPublishesItsRows(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	stop := f.streamingRelay()
	src := f.source("dropper", nil)
	if _, err := src.Drop(f.ctx, cdc.DropOptions{}); err == nil || !strings.Contains(err.Error(), "is streamed by a relay") {
		t.Fatalf("Drop while a relay streams the slot: %v, want a refusal", err)
	}
	stop()
	waiting := cdcEvent("kept", 1)
	f.write(f.writer(modeTable), waiting)
	f.ddl(func() {
		if _, err := src.Drop(f.ctx, cdc.DropOptions{}); err != nil {
			t.Fatal(err)
		}
	})
	var slots, states, pubs int
	err := f.pool.QueryRow(f.ctx, `SELECT (SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1),
       (SELECT count(*) FROM `+f.tb.Qualified("_cdc")+`),
       (SELECT count(*) FROM pg_publication WHERE pubname = $1)`, f.slot()).Scan(&slots, &states, &pubs)
	if err != nil {
		t.Fatal(err)
	}
	if slots != 0 || states != 0 || pubs != 0 {
		t.Fatalf("after Drop: %d slots, %d state rows, %d publications; want none", slots, states, pubs)
	}
	if n := f.count(""); n != 1 {
		t.Fatalf("after Drop the table holds %d rows, want the 1 unpublished", n)
	}
	f.streamingRelay() // a new slot
	f.waitFor(waiting.ID)
}

// In message mode the slot's WAL is the only copy of what it has not
// relayed: Drop refuses, with the count, while it holds an event of the
// table, and drops with Force; writers are refused from then on.
func TestCDCDropRefusesToLoseMessages(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	f.setup()
	f.write(f.writer(modeMessage), cdcEvent("m", 1), cdcEvent("m", 2))
	// A message of another prefix is no event of the table's.
	f.exec(`SELECT pg_logical_emit_message(true, 'other:prefix', 'x')`)
	src := f.source("dropper", &cdc.Config{Mode: cdc.ModeMessages})
	pending, err := src.Drop(f.ctx, cdc.DropOptions{})
	if !errors.Is(err, cdc.ErrPendingInSlot) || pending != 2 || !strings.Contains(err.Error(), "2 event(s)") {
		t.Fatalf("Drop with 2 messages not relayed: %d, %v; want 2 and cdc.ErrPendingInSlot", pending, err)
	}
	var slots int
	if err := f.pool.QueryRow(f.ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, f.slot()).Scan(&slots); err != nil || slots != 1 {
		t.Fatalf("after the refusal: %d slots, %v; want the slot kept", slots, err)
	}
	f.ddl(func() {
		pending, err = src.Drop(f.ctx, cdc.DropOptions{Force: true})
	})
	if err != nil || pending != 2 {
		t.Fatalf("Drop with Force: %d, %v; want 2 lost and no error", pending, err)
	}
	if err := f.writer(modeMessage).Write(f.ctx, cdcEvent("m", 3)); !errors.Is(err, outboxpgx.ErrNoSlot) {
		t.Fatalf("a message written after Drop: %v, want outboxpgx.ErrNoSlot", err)
	}
}
