package outboxsql_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxdrivertest"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxsql"
)

// TestDriverConformance runs the shared driver suite with database/sql
// writers (pgx's stdlib driver) and, for the relay and the tools, the pgx
// Store, which outboxsql relies on.
func TestDriverConformance(t *testing.T) {
	t.Parallel()
	pool := testenv.PoolMax(t, 40) // the cases run in parallel
	db, err := sql.Open("pgx", testenv.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	outboxdrivertest.Run(t, outboxdrivertest.Harness{
		Name:     "database/sql",
		Store:    outboxpgx.New(pool),
		NewTable: func(t testing.TB) outboxdriver.Table { return testenv.Table(t, pool) },
		Write: func(ctx context.Context, tb outboxdriver.Table, commit bool, events ...outbox.Event) error {
			return testenv.WriteSQL(ctx, db, outboxsql.New(db), tb, commit, events...)
		},
		ExecInsert: func(ctx context.Context, tb outboxdriver.Table, id, aggregateType, aggregateID, typ, payload string) error {
			_, err := db.ExecContext(ctx, `INSERT INTO `+tb.Qualified("")+` (id, aggregatetype, aggregateid, type, payload)
				VALUES ($1, $2, $3, $4, $5)`, id, aggregateType, aggregateID, typ, payload)
			return err
		},
		DeliverAtVersion: 12,
		ExecDelay: func(ctx context.Context, tb outboxdriver.Table, id, column string, d time.Duration) error {
			_, err := db.ExecContext(ctx, `UPDATE `+tb.Qualified("")+` SET `+column+` = clock_timestamp() + $2 * interval '1 microsecond' WHERE id = $1`,
				id, d.Microseconds())
			return err
		},
		Parallel: true,
	})
}
