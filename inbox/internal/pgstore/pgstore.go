// Package pgstore is the consumertest Store of the adapters' tests: an
// inboxpgx inbox and an effects table in a fresh schema of the real
// PostgreSQL.
package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumertest"
	"github.com/outboxkit/outbox/inbox/inboxpgx"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
)

// New migrates an inbox table and creates an effects table in a new schema
// that is dropped when the test ends.
func New(t *testing.T) consumertest.Store[pgx.Tx] {
	t.Helper()
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	tbl.Name = "inbox"
	ctx := testenv.Context(t, 30*time.Second)
	if _, err := inboxpgx.Migrate(ctx, pool, tbl); err != nil {
		t.Fatal(err)
	}
	effects := outboxdriver.QuoteIdent(tbl.Schema) + ".effects"
	if _, err := pool.Exec(ctx, `CREATE TABLE `+effects+` (seq bigserial PRIMARY KEY, consumer text NOT NULL, event_id text NOT NULL, agg text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return consumertest.Store[pgx.Tx]{
		Inbox: func(t *testing.T, consumer string, m inbox.Metrics) *inbox.Inbox[pgx.Tx] {
			t.Helper()
			ib, err := inbox.New(inboxpgx.New(pool), &inbox.Config{Consumer: consumer, Schema: tbl.Schema, Table: tbl.Name, Metrics: m})
			if err != nil {
				t.Fatal(err)
			}
			return ib
		},
		Effect: func(ctx context.Context, tx pgx.Tx, consumer string, e consumertest.Effect) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (consumer, event_id, agg) VALUES ($1, $2, $3)`, consumer, e.EventID, e.AggregateID)
			return err
		},
		Effects: func(t *testing.T, consumer string) []consumertest.Effect {
			t.Helper()
			rows, err := pool.Query(testenv.Context(t, 10*time.Second), `SELECT event_id, agg FROM `+effects+` WHERE consumer = $1 ORDER BY seq`, consumer)
			if err != nil {
				t.Fatal(err)
			}
			out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (consumertest.Effect, error) {
				var e consumertest.Effect
				err := r.Scan(&e.EventID, &e.AggregateID)
				return e, err
			})
			if err != nil {
				t.Fatal(err)
			}
			return out
		},
	}
}
