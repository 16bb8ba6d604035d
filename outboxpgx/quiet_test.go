package outboxpgx_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxpgx"
)

// WithoutWakeups turns outbox.notify off for the rest of the writer's
// transaction in the insert itself, in each of the insert's forms (one
// row, several; insert + delete's is in package cdc's tests, which make
// the slot it needs), and still inserts every event; without it the
// setting is left alone.
func TestWithoutWakeupsSetsOutboxNotifyOffInTheInsert(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	if _, err := outboxpgx.New(pool).Migrate(ctx, tb, nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		opts   []outboxpgx.Option
		events int
		want   string // outbox.notify after the insert, in the same transaction
		rows   int    // rows left in the table
	}{
		{"one row", []outboxpgx.Option{outboxpgx.WithoutWakeups()}, 1, "off", 1},
		{"several rows", []outboxpgx.Option{outboxpgx.WithoutWakeups()}, 3, "off", 3},
		{"default", nil, 2, "", 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			ob, err := outbox.New(outboxpgx.New(pool, c.opts...), &outbox.Config{Schema: tb.Schema, Table: tb.Name})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `TRUNCATE `+tb.Qualified("")); err != nil {
				t.Fatal(err)
			}
			var got string
			err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				events := make([]outbox.Event, c.events)
				for i := range events {
					events[i] = outbox.Event{AggregateType: "order", AggregateID: fmt.Sprint(i), Type: "Placed", Payload: []byte(`{}`)}
				}
				if err := ob.WriteTx(ctx, tx, events...); err != nil {
					return err
				}
				return tx.QueryRow(ctx, `SELECT coalesce(current_setting('outbox.notify', true), '')`).Scan(&got)
			})
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Fatalf("outbox.notify after the insert = %q, want %q", got, c.want)
			}
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+tb.Qualified("")).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != c.rows {
				t.Fatalf("%d rows in the table, want %d", n, c.rows)
			}
		})
	}
}
