package relayd_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxpgx/cdc"
	"github.com/outboxkit/outbox/outboxsql"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/relayd"
	"github.com/outboxkit/outbox/route"
)

// Writers on database/sql write in message and insert + delete mode
// (outboxsql.WithMessages, WithInsertDelete): refused with ErrNoSlot (the
// shared sentinel, which outboxpgx's is too) while no slot exists;
// Migrate with such a Driver makes the slot (MigrateTx refuses to); then
// a relay with log tailing publishes exactly the committed events, byte
// for byte, and the table stays empty.
func TestDatabaseSQLWritersInLogTailingModes(t *testing.T) {
	// A cluster of the test's own: its slot goes with it, and no other
	// session's DDL meets the slot's creation.
	pg := testenv.StartPrivatePostgres(t)
	ctx := testenv.Context(t, 3*time.Minute)
	pool, err := pgxpool.New(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	db, err := sql.Open("pgx", pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	tb := outboxdriver.Table{Schema: "public", Name: testenv.Name("outbox")}
	if _, err := outboxsql.New(db).Migrate(ctx, tb, nil); err != nil { // the table mode: no slot
		t.Fatal(err)
	}
	modes := []struct {
		name string
		opt  outboxsql.Option
	}{{"message", outboxsql.WithMessages()}, {"insert-delete", outboxsql.WithInsertDelete()}}
	ev := func(agg, typ string) outbox.Event {
		return outbox.Event{AggregateType: "order", AggregateID: agg, Type: typ, Payload: []byte(`{"agg": "` + agg + `", "type": "` + typ + `"}`)}
	}

	// No slot yet: nothing is written, one event or several, WriteTx or
	// Write, and the error says so.
	for _, m := range modes {
		w := outboxsql.New(db, m.opt)
		for _, n := range []int{1, 3} {
			evs := make([]outbox.Event, n)
			for i := range evs {
				evs[i] = ev("lost", fmt.Sprint(i))
			}
			err := testenv.WriteSQL(ctx, db, w, tb, true, evs...)
			if !errors.Is(err, outboxsql.ErrNoSlot) || !errors.Is(err, outboxpgx.ErrNoSlot) || !errors.Is(err, outboxdriver.ErrNoSlot) {
				t.Fatalf("%s: WriteTx of %d event(s) with no slot: %v, want ErrNoSlot", m.name, n, err)
			}
		}
		ob, err := outbox.New(w, &outbox.Config{Schema: tb.Schema, Table: tb.Name})
		if err != nil {
			t.Fatal(err)
		}
		if err := ob.Write(ctx, ev("lost", "w")); !errors.Is(err, outboxsql.ErrNoSlot) {
			t.Fatalf("%s: Write with no slot: %v, want ErrNoSlot", m.name, err)
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = w.MigrateTx(ctx, tx, tb, &outboxdriver.MigrateOptions{CDC: true})
		tx.Rollback()
		if err == nil {
			t.Fatalf("%s: MigrateTx with CDC: no error, want a refusal (no slot in a transaction that wrote)", m.name)
		}
	}

	// Migrate with a Driver in message mode makes the slot, once.
	slots := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, cdc.DefaultSlot(tb)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := slots(); n != 0 {
		t.Fatalf("%d slot(s) after a migration in table mode, want none", n)
	}
	for _, m := range modes {
		if _, err := outboxsql.New(db, m.opt).Migrate(ctx, tb, nil); err != nil {
			t.Fatalf("%s: migrate: %v", m.name, err)
		}
		if n := slots(); n != 1 {
			t.Fatalf("%s: %d slot(s) %s after Migrate, want 1", m.name, n, cdc.DefaultSlot(tb))
		}
	}

	// Committed events of both modes, one and several per transaction,
	// and a rolled-back one.
	var want [][]byte
	for _, m := range modes {
		w := outboxsql.New(db, m.opt)
		one, two, three := ev(m.name, "1"), ev(m.name, "2"), ev(m.name, "3")
		three.Payload, three.RawPayload = nil, []byte{0xde, 0xad, 0x00}
		two.Headers = map[string]string{"h": "v"}
		for _, c := range []struct {
			commit bool
			evs    []outbox.Event
		}{{true, []outbox.Event{one}}, {false, []outbox.Event{ev(m.name, "rolled back")}}, {true, []outbox.Event{two, three}}} {
			if err := testenv.WriteSQL(ctx, db, w, tb, c.commit, c.evs...); err != nil {
				t.Fatalf("%s: write: %v", m.name, err)
			}
		}
		want = append(want, one.Payload, two.Payload, three.RawPayload)
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+tb.Qualified("")).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("the table holds %d row(s) (%v), want none", rows, err)
	}

	_, js := testenv.JetStream(t)
	st, prefix := testenv.Stream(t, js)
	router, err := route.New(&route.Config{Destination: prefix + ".all"})
	if err != nil {
		t.Fatal(err)
	}
	rl, err := relayd.Open(ctx, pg.URL(), natsSink(t, ctx, testenv.NATSURL(), prefix), &relayd.Options{
		Schema: tb.Schema, Table: tb.Name, Source: relayd.SourceCDC, CDC: cdc.Config{Mode: cdc.ModeMessages},
		Relay: relay.Config{Router: router, LeaseTTL: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rl.Stop(context.Background()) })
	if err := rl.Start(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.WaitStreamMsgs(t, st, uint64(len(want)), time.Minute)
	if err := rl.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	msgs := testenv.StreamMessages(t, st)
	if len(msgs) != len(want) {
		t.Fatalf("%d messages published, want %d", len(msgs), len(want))
	}
	// No order across aggregates is promised: each payload once.
	left := map[string]int{}
	for _, w := range want {
		left[string(w)]++
	}
	for _, m := range msgs {
		if left[string(m.Data)] == 0 {
			t.Errorf("message %q published, not written or published twice", m.Data)
		}
		left[string(m.Data)]--
	}
}
