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

// LatestVersion is the newest schema version this driver knows.
func (d *Driver) LatestVersion() int { return pgschema.Latest() }

// Migrate creates or upgrades the outbox table t and its companions (dead
// letters, leases, held aggregates, audit, wake-up registry, migration
// bookkeeping) in one transaction on the Driver's pool. It returns the
// versions it applied; a second run applies none. opts may be nil.
//
// With opts.CDC, or on a Driver in message or insert + delete mode
// (WithMessages, WithInsertDelete), whose writes need it, it then also
// makes what log tailing streams from when missing: the publication and
// the replication slot (outboxdriver.MigrateOptions.CDC), which keeps WAL
// until a relay consumes it or `outbox cdc drop` drops it.
func (d *Driver) Migrate(ctx context.Context, t outboxdriver.Table, opts *outboxdriver.MigrateOptions) ([]int, error) {
	if d.pool == nil {
		return nil, errNoPool
	}
	vs, err := inTx(ctx, d.pool, t, func(tx pgx.Tx, t outboxdriver.Table) ([]int, error) { return d.migrateTx(ctx, tx, t, opts) })
	if err != nil {
		return nil, err
	}
	if err := pgschema.MigrateSlot(ctx, pgschema.PgxTx(d.pool), t, opts, d.messages || d.insertDelete); err != nil {
		return vs, fmt.Errorf("outboxpgx: migrate %s: log tailing: %w", t.WithDefaults(), err)
	}
	return vs, nil
}

// MigrateTx is Migrate inside the caller's transaction tx, which the
// caller commits: the outbox table then comes into being with the
// caller's own schema changes, or not at all. It makes no replication
// slot, not even for a Driver in message or insert + delete mode
// (MigrateOptions.CDC is refused, wrapping pgschema's reason): make it
// after the commit with Migrate or `outbox migrate --cdc`.
func (d *Driver) MigrateTx(ctx context.Context, tx pgx.Tx, t outboxdriver.Table, opts *outboxdriver.MigrateOptions) ([]int, error) {
	if opts != nil && opts.CDC {
		return nil, fmt.Errorf("outboxpgx: migrate %s: %w", t.WithDefaults(), pgschema.ErrSlotInTx)
	}
	return d.migrateTx(ctx, tx, t, opts)
}

func (d *Driver) migrateTx(ctx context.Context, tx pgx.Tx, t outboxdriver.Table, opts *outboxdriver.MigrateOptions) ([]int, error) {
	t = t.WithDefaults()
	o, err := driverkit.ResolveMigrate(opts)
	if err == nil {
		err = t.Validate()
	}
	if err != nil {
		return nil, fmt.Errorf("outboxpgx: migrate %s: %w", t, err)
	}
	vs, err := pgschema.Up(ctx, pgschema.PgxTx(tx), t, o)
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
		vs, err := pgschema.Down(ctx, pgschema.PgxTx(tx), t, target)
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
