package outboxsql_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxdriver/drivertest"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxsql"
)

// TestDriverConformance runs the shared driver suite with database/sql
// writers (pgx's stdlib driver) and, for the relay and the tools, the pgx
// Store, which outboxsql relies on.
func TestDriverConformance(t *testing.T) {
	t.Parallel()
	testenv.Pool(t) // fails with how to start PostgreSQL when it is down
	url := testenv.DatabaseURL()
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, url+sep+"pool_max_conns=40")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	drivertest.Run(t, drivertest.Harness{
		Name:     "database/sql",
		Store:    outboxpgx.NewStore(pool),
		NewTable: func(t testing.TB) outboxdriver.Table { return testenv.Table(t, pool) },
		Write: func(ctx context.Context, tb outboxdriver.Table, commit bool, events ...outbox.Event) error {
			ob, err := outbox.New(outboxsql.New(), &outbox.Config{Schema: tb.Schema, Table: tb.Name})
			if err != nil {
				return err
			}
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			if err := ob.WriteTx(ctx, tx, events...); err != nil {
				return err
			}
			if !commit {
				return tx.Rollback()
			}
			return tx.Commit()
		},
		ExecInsert: func(ctx context.Context, tb outboxdriver.Table, id, aggregateType, aggregateID, typ, payload string) error {
			_, err := db.ExecContext(ctx, `INSERT INTO `+tb.Qualified("")+` (id, aggregatetype, aggregateid, type, payload)
				VALUES ($1, $2, $3, $4, $5)`, id, aggregateType, aggregateID, typ, payload)
			return err
		},
		Parallel: true,
	})
}
