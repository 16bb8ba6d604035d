package outboxsqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/sqlstore"
	"github.com/outboxkit/outbox/outboxdriver"
)

// migrated reports whether t and its migrations table exist.
func migrated(ctx context.Context, q interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}, t outboxdriver.Table) (bool, error) {
	var found int
	err := q.QueryRowContext(ctx, `SELECT count(*) FROM `+outboxdriver.QuoteIdent(t.Schema)+`.sqlite_master
WHERE type = 'table' AND name IN (?, ?)`, t.Name, t.Name+"_migrations").Scan(&found)
	return found == 2, err
}

// Status reports the backlog, the age of the oldest unpublished event, the
// dead letters, the held aggregates, the delayed events that are not due
// yet and every partition's lease of table
// t, all read in one read-only transaction (one consistent snapshot). It
// wraps outboxdriver.ErrNotMigrated when t does not exist.
func (d *Driver) Status(ctx context.Context, t outboxdriver.Table) (outboxdriver.Status, error) {
	t, err := table(t)
	st := outboxdriver.Status{Table: t, LatestSchemaVersion: d.LatestVersion()}
	if err != nil {
		return st, err
	}
	db, err := d.pool.Need()
	if err != nil {
		return st, err
	}
	fail := func(err error) (outboxdriver.Status, error) {
		return st, fmt.Errorf("outboxsqlite: status of %s: %s", t, oneLine(err))
	}
	tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return fail(err)
	}
	defer tx.Rollback()
	n := namesOf(t)
	var attached int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM pragma_database_list WHERE name = ?`, t.Schema).Scan(&attached); err != nil {
		return fail(err)
	}
	if attached == 0 {
		return st, fmt.Errorf("outboxsqlite: status of %s: no database named %q is attached (SQLite's own is %q)", t, t.Schema, Schema)
	}
	ok, err := migrated(ctx, tx, t)
	if err != nil {
		return fail(err)
	}
	if !ok {
		return st, driverkit.NotMigrated("outboxsqlite", t)
	}
	var ageSeconds, heldSeconds float64
	err = tx.QueryRowContext(ctx, `SELECT
    (SELECT count(*) FROM `+n.Table+` WHERE published_at IS NULL),
    (SELECT coalesce((julianday('now') - julianday(min(created_at))) * 86400.0, 0) FROM `+n.Table+` WHERE published_at IS NULL),
    (SELECT count(*) FROM `+n.Table+` WHERE published_at IS NOT NULL),
    (SELECT count(*) FROM `+n.DeadLetter+`),
    (SELECT count(*) FROM `+n.Held+`),
    (SELECT coalesce((julianday('now') - julianday(min(held_at))) * 86400.0, 0) FROM `+n.Held+`),
    (SELECT coalesce(max(version), 0) FROM `+n.Migrations+`)`).
		Scan(&st.Backlog, &ageSeconds, &st.Published, &st.DeadLetters, &st.Held, &heldSeconds, &st.SchemaVersion)
	if err == nil && st.SchemaVersion >= relayVersionsSince {
		err = tx.QueryRowContext(ctx, `SELECT coalesce(max(relays_from), 0) FROM `+n.Migrations).Scan(&st.RelaysFrom)
	}
	if err != nil {
		return fail(err)
	}
	if ageSeconds > 0 {
		st.OldestUnpublishedAge = time.Duration(ageSeconds * float64(time.Second))
	}
	if heldSeconds > 0 {
		st.OldestHeldAge = time.Duration(heldSeconds * float64(time.Second))
	}
	rows, err := tx.QueryContext(ctx, `SELECT l.partition, coalesce(l.owner, ''), l.epoch,
       coalesce((julianday(l.expires_at) - julianday('now')) * 86400.0, -1e9),
       coalesce(b.n, 0)
FROM `+n.Leases+` AS l
LEFT JOIN (SELECT partition, count(*) AS n FROM `+n.Table+` WHERE published_at IS NULL GROUP BY partition) AS b
  ON b.partition = l.partition
ORDER BY l.partition`)
	if err != nil {
		return fail(err)
	}
	defer rows.Close()
	for rows.Next() {
		var p outboxdriver.PartitionStatus
		var secs float64
		if err := rows.Scan(&p.Partition, &p.Owner, &p.Epoch, &secs, &p.Backlog); err != nil {
			return fail(err)
		}
		p.ExpiresIn = time.Duration(secs * float64(time.Second))
		if p.ExpiresIn <= 0 {
			p.Owner = "" // an expired lease is nobody's
		}
		st.Partitions = append(st.Partitions, p)
	}
	if err := rows.Err(); err != nil {
		return fail(err)
	}
	if st.SchemaVersion >= delayedVersion {
		// Through the partial index of the rows that wait.
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM `+n.Table+`
WHERE published_at IS NULL AND (next_attempt_at IS NOT NULL OR deliver_at IS NOT NULL) AND deliver_at > `+nowSQL).Scan(&st.Delayed); err != nil {
			return fail(err)
		}
	}
	if st.SchemaVersion >= consoleVersion {
		// In the same transaction: a second connection may be one the pool
		// does not have.
		if st.Pauses, err = sqlstore.Pauses(ctx, dialect, tx, t); err != nil {
			return st, err
		}
	}
	return st, nil
}

// EstimateStatus is Status: its counts are exact.
func (d *Driver) EstimateStatus(ctx context.Context, t outboxdriver.Table, _ int64) (outboxdriver.Status, error) {
	return d.Status(ctx, t)
}
