package outboxpgx_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxdrivertest"
	"github.com/outboxkit/outbox/outboxpgx"
)

// TestDriverConformance runs the shared driver suite with pgx writers and
// the pgx Store.
func TestDriverConformance(t *testing.T) {
	t.Parallel()
	pool := testenv.PoolMax(t, 40) // the cases run in parallel, each holding open batches, a listener and relays
	outboxdrivertest.Run(t, outboxdrivertest.Harness{
		Name:     "pgx",
		Store:    outboxpgx.New(pool),
		NewTable: func(t testing.TB) outboxdriver.Table { return testenv.Table(t, pool) },
		Write: func(ctx context.Context, tb outboxdriver.Table, commit bool, events ...outbox.Event) error {
			ob, err := outbox.New(outboxpgx.New(pool), &outbox.Config{Schema: tb.Schema, Table: tb.Name})
			if err != nil {
				return err
			}
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(context.WithoutCancel(ctx))
			if err := ob.WriteTx(ctx, tx, events...); err != nil {
				return err
			}
			if !commit {
				return tx.Rollback(ctx)
			}
			return tx.Commit(ctx)
		},
		ExecInsert: func(ctx context.Context, tb outboxdriver.Table, id, aggregateType, aggregateID, typ, payload string) error {
			_, err := pool.Exec(ctx, `INSERT INTO `+tb.Qualified("")+` (id, aggregatetype, aggregateid, type, payload)
				VALUES ($1, $2, $3, $4, $5)`, id, aggregateType, aggregateID, typ, payload)
			return err
		},
		DeliverAtVersion: 12,
		ExecDelay: func(ctx context.Context, tb outboxdriver.Table, id, column string, d time.Duration) error {
			_, err := pool.Exec(ctx, `UPDATE `+tb.Qualified("")+` SET `+column+` = clock_timestamp() + $2 * interval '1 microsecond' WHERE id = $1`,
				id, d.Microseconds())
			return err
		},
		Parallel: true,
	})
}
