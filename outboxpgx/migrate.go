package outboxpgx

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Beginner starts transactions: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

type migrateTx struct{ tx pgx.Tx }

func (m migrateTx) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := m.tx.Exec(ctx, sql, args...)
	return err
}

func (m migrateTx) Versions(ctx context.Context, sql string, args ...any) ([]int, error) {
	rows, err := m.tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int])
}

// Migrate creates or upgrades the outbox table t and its companions (dead
// letters, leases, held aggregates, audit, wake-up registry, migration
// bookkeeping) in one transaction. It returns the versions it applied; a
// second run applies none. opts may be nil.
func Migrate(ctx context.Context, db Beginner, t outboxdriver.Table, opts *outboxdriver.MigrateOptions) ([]int, error) {
	o := outboxdriver.MigrateOptions{}
	if opts != nil {
		o = *opts
	}
	return inTx(ctx, db, t, func(tx pgschema.Tx) ([]int, error) { return pgschema.Up(ctx, tx, t, o) })
}

// MigrateDown reverts migrations of t newer than target in one transaction;
// target 0 removes the outbox tables and everything in them.
func MigrateDown(ctx context.Context, db Beginner, t outboxdriver.Table, target int) ([]int, error) {
	return inTx(ctx, db, t, func(tx pgschema.Tx) ([]int, error) { return pgschema.Down(ctx, tx, t, target) })
}

func inTx(ctx context.Context, db Beginner, t outboxdriver.Table, fn func(pgschema.Tx) ([]int, error)) ([]int, error) {
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("outboxpgx: %w", err)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("outboxpgx: migrate %s: %w", t, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	vs, err := fn(migrateTx{tx})
	if err != nil {
		return nil, fmt.Errorf("outboxpgx: migrate %s: %w", t, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("outboxpgx: migrate %s: commit: %w", t, err)
	}
	return vs, nil
}
