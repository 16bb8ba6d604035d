package outboxpgx

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// migrateTx is a transaction (or the pool) as pgschema reads and writes
// through it.
type migrateTx struct {
	tx interface {
		Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
		Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	}
}

func (m migrateTx) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := m.tx.Exec(ctx, sql, args...)
	return err
}

func (m migrateTx) Each(ctx context.Context, sql string, args []any, row func(scan func(dest ...any) error) error) error {
	rows, err := m.tx.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := row(rows.Scan); err != nil {
			return err
		}
	}
	return rows.Err()
}

func (m migrateTx) Versions(ctx context.Context, sql string, args ...any) ([]int, error) {
	rows, err := m.tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int])
}

// LatestVersion is the newest schema version this driver knows.
func (d *Driver) LatestVersion() int { return pgschema.Latest() }

// Migrate creates or upgrades the outbox table t and its companions (dead
// letters, leases, held aggregates, audit, wake-up registry, migration
// bookkeeping) in one transaction on the Driver's pool. It returns the
// versions it applied; a second run applies none. opts may be nil.
func (d *Driver) Migrate(ctx context.Context, t outboxdriver.Table, opts *outboxdriver.MigrateOptions) ([]int, error) {
	if d.pool == nil {
		return nil, errNoPool
	}
	return inTx(ctx, d.pool, t, func(tx pgx.Tx, t outboxdriver.Table) ([]int, error) { return d.MigrateTx(ctx, tx, t, opts) })
}

// MigrateTx is Migrate inside the caller's transaction tx, which the
// caller commits: the outbox table then comes into being with the
// caller's own schema changes, or not at all.
func (d *Driver) MigrateTx(ctx context.Context, tx pgx.Tx, t outboxdriver.Table, opts *outboxdriver.MigrateOptions) ([]int, error) {
	t = t.WithDefaults()
	o, err := driverkit.ResolveMigrate(opts)
	if err == nil {
		err = t.Validate()
	}
	if err != nil {
		return nil, fmt.Errorf("outboxpgx: migrate %s: %w", t, err)
	}
	vs, err := pgschema.Up(ctx, migrateTx{tx}, t, o)
	if err != nil {
		return nil, fmt.Errorf("outboxpgx: migrate %s: %w", t, err)
	}
	return vs, nil
}

// MigrateDown reverts migrations of t newer than target in one transaction;
// target 0 removes the outbox tables and everything in them.
func (d *Driver) MigrateDown(ctx context.Context, t outboxdriver.Table, target int) ([]int, error) {
	if d.pool == nil {
		return nil, errNoPool
	}
	return inTx(ctx, d.pool, t, func(tx pgx.Tx, t outboxdriver.Table) ([]int, error) {
		vs, err := pgschema.Down(ctx, migrateTx{tx}, t, target)
		if err != nil {
			return nil, fmt.Errorf("outboxpgx: migrate %s: %w", t, err)
		}
		return vs, nil
	})
}

// migrateAttempts is how often a migration is run when PostgreSQL ends
// it as the victim of a deadlock: a migration that changes the outbox
// table while relays claim and delete rows can meet one of their
// transactions the other way round. The whole transaction was rolled
// back, so running it again is safe.
const migrateAttempts = 3

// inTx runs fn in a transaction of db and commits it; a transaction
// ended by a deadlock (SQLSTATE 40P01) is run again, up to
// migrateAttempts times in all.
func inTx(ctx context.Context, db interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}, t outboxdriver.Table, fn func(pgx.Tx, outboxdriver.Table) ([]int, error)) ([]int, error) {
	for attempt := 1; ; attempt++ {
		vs, err := inTxOnce(ctx, db, t, fn)
		var pgErr *pgconn.PgError
		if err == nil || attempt == migrateAttempts || !errors.As(err, &pgErr) || pgErr.Code != "40P01" || ctx.Err() != nil {
			return vs, err
		}
	}
}

// inTxOnce runs fn in a transaction of db and commits it.
func inTxOnce(ctx context.Context, db interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}, t outboxdriver.Table, fn func(pgx.Tx, outboxdriver.Table) ([]int, error)) ([]int, error) {
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("outboxpgx: %w", err)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("outboxpgx: migrate %s: %w", t, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	vs, err := fn(tx, t)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("outboxpgx: migrate %s: commit: %w", t, err)
	}
	return vs, nil
}
