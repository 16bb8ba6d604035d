// Package inboxpgx is the PostgreSQL driver of the inbox for pgx v5: it
// records events inside a pgx.Tx and migrates the inbox tables.
//
//	drv := inboxpgx.New(pool)
//	_, err := inboxpgx.Migrate(ctx, pool, outboxdriver.Table{Schema: "public", Name: "inbox"})
//	ib, err := inbox.New(drv, &inbox.Config{Consumer: "billing"})
package inboxpgx

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/internal/inboxschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// DB is what the driver needs of a database: a *pgxpool.Pool, a *pgx.Conn
// (or a pgx.Tx, whose Begin opens a savepoint).
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Driver implements inbox.Driver[pgx.Tx].
type Driver struct {
	db DB
}

var _ inbox.Driver[pgx.Tx] = (*Driver)(nil)

// New returns a driver on db. HandleTx uses only the caller's transaction;
// Handle, DeadLetter, DeadLetters and Cleanup use db. It does no I/O.
func New(db DB) *Driver { return &Driver{db: db} }

// DefaultSchema implements inbox.Driver: "public".
func (d *Driver) DefaultSchema() string { return inboxschema.Postgres.DefaultSchema() }

func queries(t outboxdriver.Table) inboxschema.Queries {
	return inboxschema.QueriesFor(inboxschema.Postgres, t)
}

// ClaimTx implements inbox.Driver with INSERT … ON CONFLICT DO NOTHING.
func (d *Driver) ClaimTx(ctx context.Context, tx pgx.Tx, t outboxdriver.Table, consumer, eventID string) (bool, error) {
	if tx == nil {
		return false, errors.New("transaction is nil")
	}
	tag, err := tx.Exec(ctx, queries(t).Claim, consumer, eventID)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

// AdvanceTx implements inbox.Driver with INSERT … ON CONFLICT DO UPDATE …
// WHERE the stored version is lower.
func (d *Driver) AdvanceTx(ctx context.Context, tx pgx.Tx, t outboxdriver.Table, k inbox.VersionKey, version int64) (bool, error) {
	tag, err := tx.Exec(ctx, queries(t).Advance, k.Consumer, k.AggregateType, k.AggregateID, version)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

// InTx implements inbox.Driver.
func (d *Driver) InTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	if d.db == nil {
		return errors.New("inboxpgx: no database: build the driver with New(pool)")
	}
	return pgx.BeginFunc(ctx, d.db, fn)
}

// RecordDeadLetter implements inbox.Driver.
func (d *Driver) RecordDeadLetter(ctx context.Context, t outboxdriver.Table, dl inbox.DeadLetter) error {
	h, err := headersJSON(dl.Headers)
	if err != nil {
		return err
	}
	_, err = d.db.Exec(ctx, queries(t).DeadLetter, dl.Consumer, dl.EventID, dl.AggregateType, dl.AggregateID,
		dl.Type, dl.Destination, h, dl.Payload, dl.Error)
	return err
}

// DeadLetters implements inbox.Driver.
func (d *Driver) DeadLetters(ctx context.Context, t outboxdriver.Table, consumer string, limit int) ([]inbox.DeadLetter, error) {
	return d.deadLetters(ctx, queries(t).DeadLetters, consumer, limit)
}

func (d *Driver) deadLetters(ctx context.Context, sql string, args ...any) ([]inbox.DeadLetter, error) {
	rows, err := d.db.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (inbox.DeadLetter, error) {
		var dl inbox.DeadLetter
		var h string
		var retry *time.Time
		if err := row.Scan(&dl.ID, &dl.Consumer, &dl.EventID, &dl.AggregateType, &dl.AggregateID, &dl.Type,
			&dl.Destination, &h, &dl.Payload, &dl.Error, &dl.DeadLetteredAt, &retry); err != nil {
			return dl, err
		}
		if retry != nil {
			dl.RetryRequestedAt = *retry
		}
		if err := json.Unmarshal([]byte(h), &dl.Headers); err != nil {
			return dl, fmt.Errorf("dead letter %d: headers: %w", dl.ID, err)
		}
		return dl, nil
	})
}

// DeadLetter implements inbox.Admin.
func (d *Driver) DeadLetter(ctx context.Context, t outboxdriver.Table, consumer string, id int64) (inbox.DeadLetter, error) {
	dls, err := d.deadLetters(ctx, queries(t).DeadLetterByID, consumer, id)
	if err != nil {
		return inbox.DeadLetter{}, err
	}
	if len(dls) == 0 {
		return inbox.DeadLetter{}, fmt.Errorf("dead letter %d of %s: %w", id, consumer, inbox.ErrNotFound)
	}
	return dls[0], nil
}

// DeadLetterIDs implements inbox.Admin.
func (d *Driver) DeadLetterIDs(ctx context.Context, t outboxdriver.Table, consumer string) ([]int64, error) {
	rows, err := d.db.Query(ctx, queries(t).DeadLetterIDs, consumer)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// RequestRetry implements inbox.Admin.
func (d *Driver) RequestRetry(ctx context.Context, t outboxdriver.Table, consumer string, ids []int64) ([]int64, error) {
	return d.each(ctx, queries(t).RequestRetry, consumer, ids)
}

// DeleteDeadLetters implements inbox.Admin.
func (d *Driver) DeleteDeadLetters(ctx context.Context, t outboxdriver.Table, consumer string, ids []int64) ([]int64, error) {
	return d.each(ctx, queries(t).DeleteDeadLetter, consumer, ids)
}

// ClaimRetries implements inbox.Admin.
func (d *Driver) ClaimRetries(ctx context.Context, t outboxdriver.Table, consumer string, limit int) ([]inbox.DeadLetter, error) {
	q := queries(t)
	dls, err := d.deadLetters(ctx, q.RetryRequested, consumer, limit)
	if err != nil {
		return nil, err
	}
	var claimed []inbox.DeadLetter
	for _, dl := range dls {
		tag, err := d.db.Exec(ctx, q.ClaimRetry, consumer, dl.ID)
		if err != nil {
			return claimed, err
		}
		if tag.RowsAffected() == 1 {
			dl.RetryRequestedAt = time.Time{}
			claimed = append(claimed, dl)
		}
	}
	return claimed, nil
}

func (d *Driver) each(ctx context.Context, sql, consumer string, ids []int64) ([]int64, error) {
	return inboxschema.Each(ids, func(id int64) (bool, error) {
		tag, err := d.db.Exec(ctx, sql, consumer, id)
		return tag.RowsAffected() == 1, err
	})
}

// Stats implements inbox.Admin.
func (d *Driver) Stats(ctx context.Context, t outboxdriver.Table, consumer string) (inbox.Stats, error) {
	q := queries(t)
	s := inbox.Stats{Consumer: consumer}
	rows, err := d.db.Query(ctx, q.Processed, consumer)
	if err != nil {
		return s, err
	}
	if s.Processed, err = pgx.CollectExactlyOneRow(rows, pgx.RowTo[int64]); err != nil {
		return s, err
	}
	rows, err = d.db.Query(ctx, q.DeadLetterStats, consumer)
	if err != nil {
		return s, err
	}
	var oldest *time.Time
	_, err = pgx.ForEachRow(rows, []any{&s.DeadLetters, &s.RetryRequested, &oldest}, func() error { return nil })
	if oldest != nil {
		s.OldestDeadLetter = *oldest
	}
	return s, err
}

// Cleanup implements inbox.Driver.
func (d *Driver) Cleanup(ctx context.Context, t outboxdriver.Table, consumer string, olderThan time.Duration, limit int) (int, error) {
	tag, err := d.db.Exec(ctx, queries(t).Cleanup, consumer, olderThan.Seconds(), limit)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

func headersJSON(h map[string]string) (string, error) {
	if len(h) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(h)
	return string(b), err
}

type migrateTx struct{ tx pgx.Tx }

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

// Beginner starts transactions: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Migrate creates or upgrades the inbox table t (default name "inbox" in
// schema "public") and its companions <t>_versions, <t>_dead_letter and
// <t>_migrations in one transaction, and returns the versions it applied; a
// second run applies none. Concurrent runs wait for each other.
func Migrate(ctx context.Context, db Beginner, t outboxdriver.Table) ([]int, error) {
	return inTx(ctx, db, t, func(tx inboxschema.Tx, t outboxdriver.Table) ([]int, error) {
		return inboxschema.Up(ctx, tx, inboxschema.Postgres, t)
	})
}

// MigrateDown reverts the inbox table t to version target in one
// transaction and returns the versions it reverted; target 0 drops the
// inbox tables and everything in them.
func MigrateDown(ctx context.Context, db Beginner, t outboxdriver.Table, target int) ([]int, error) {
	return inTx(ctx, db, t, func(tx inboxschema.Tx, t outboxdriver.Table) ([]int, error) {
		return inboxschema.Down(ctx, tx, inboxschema.Postgres, t, target)
	})
}

// LatestVersion is the newest inbox schema version this build knows.
func LatestVersion() int { return inboxschema.Latest(inboxschema.Postgres) }

func inTx(ctx context.Context, db Beginner, t outboxdriver.Table, fn func(inboxschema.Tx, outboxdriver.Table) ([]int, error)) ([]int, error) {
	t = withDefaults(t)
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("inboxpgx: %w", err)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("inboxpgx: migrate %s: %w", t, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	vs, err := fn(migrateTx{tx}, t)
	if err != nil {
		return nil, fmt.Errorf("inboxpgx: migrate %s: %w", t, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("inboxpgx: migrate %s: commit: %w", t, err)
	}
	return vs, nil
}

func withDefaults(t outboxdriver.Table) outboxdriver.Table {
	if t.Schema == "" {
		t.Schema = inboxschema.Postgres.DefaultSchema()
	}
	if t.Name == "" {
		t.Name = inbox.DefaultTable
	}
	return t
}
