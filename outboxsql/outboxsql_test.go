package outboxsql_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxsql"
)

func TestWriteTxThroughDatabaseSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	db, err := sql.Open("pgx", testenv.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if vs, err := outboxsql.New(db).Migrate(ctx, tb, nil); err != nil || len(vs) == 0 {
		t.Fatalf("migrate: %v %v", vs, err)
	}
	if vs, err := outboxsql.New(db).Migrate(ctx, tb, nil); err != nil || len(vs) != 0 {
		t.Fatalf("second migrate applied %v, %v", vs, err)
	}
	ob, err := outbox.New(outboxsql.New(db), &outbox.Config{Schema: tb.Schema, Table: tb.Name})
	if err != nil {
		t.Fatal(err)
	}
	write := func(commit bool, events ...outbox.Event) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if err := ob.WriteTx(ctx, tx, events...); err != nil {
			t.Fatal(err)
		}
		if commit {
			err = tx.Commit()
		} else {
			err = tx.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	write(false, outbox.Event{AggregateType: "order", AggregateID: "0", Type: "Gone", Payload: []byte(`{}`)})
	write(true,
		outbox.Event{AggregateType: "order", AggregateID: "1", Type: "A", Payload: []byte(`{"n": 1}`), Headers: map[string]string{"h": "v"}},
		outbox.Event{AggregateType: "order", AggregateID: "1", Type: "B", RawPayload: []byte{0xde, 0xad}},
		outbox.Event{AggregateType: "order", AggregateID: "1", Type: "C"},
	)
	src, err := outboxpgx.New(pool).NewSource(tb, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	_, n, err := src.Heartbeat(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	leases, err := src.Acquire(ctx, n, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	b, err := src.Claim(ctx, leases, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	r := b.Records()
	if len(r) != 3 {
		t.Fatalf("claimed %d events, want the 3 committed", len(r))
	}
	if r[0].Type != "A" || string(r[0].Payload) != `{"n": 1}` || r[0].Headers["h"] != "v" ||
		r[1].Type != "B" || string(r[1].Payload) != "\xde\xad" ||
		r[2].Type != "C" || r[2].Payload != nil {
		t.Fatalf("records = %+v", r)
	}
}
