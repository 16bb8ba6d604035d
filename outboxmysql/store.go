package outboxmysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/outboxdriver"
)

// delayedVersion is the schema version that adds the deliver_at column.
const delayedVersion = 4

// schemaArg is the schema as a query argument: NULL (the current
// database) when empty.
func schemaArg(t outboxdriver.Table) any {
	if t.Schema == "" {
		return nil
	}
	return t.Schema
}

// migrated reports whether t and its migrations table exist.
func migrated(ctx context.Context, db *sql.DB, t outboxdriver.Table) (bool, error) {
	var found int
	err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.TABLES
WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME IN (?, ?)`, schemaArg(t), t.Name, t.Name+"_migrations").Scan(&found)
	return found == 2, err
}

// Status reports the backlog, the age of the oldest unpublished event, the
// dead letters, the held aggregates, the delayed events that are not due
// yet and every partition's lease of t.
func (d *Driver) Status(ctx context.Context, t outboxdriver.Table) (outboxdriver.Status, error) {
	st := outboxdriver.Status{Table: t, LatestSchemaVersion: d.LatestVersion()}
	if err := validate(t); err != nil {
		return st, err
	}
	fail := func(err error) (outboxdriver.Status, error) {
		return st, fmt.Errorf("outboxmysql: status of %s: %w", t, err)
	}
	db, err := d.pool.Need()
	if err != nil {
		return st, err
	}
	n := namesOf(t)
	ok, err := migrated(ctx, db, t)
	if err != nil {
		return fail(err)
	}
	if !ok {
		return st, driverkit.NotMigrated("outboxmysql", t)
	}
	var ageMicros int64
	if err := db.QueryRowContext(ctx, `SELECT
    (SELECT COUNT(*) FROM `+n.Table+` WHERE published_at IS NULL),
    (SELECT COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), UTC_TIMESTAMP(6)), 0) FROM `+n.Table+` WHERE published_at IS NULL),
    (SELECT COUNT(*) FROM `+n.Table+` WHERE published_at IS NOT NULL),
    (SELECT COALESCE(MAX(version), 0) FROM `+n.Migrations+`)`).
		Scan(&st.Backlog, &ageMicros, &st.Published, &st.SchemaVersion); err != nil {
		return fail(err)
	}
	if ageMicros > 0 {
		st.OldestUnpublishedAge = time.Duration(ageMicros) * time.Microsecond
	}
	if st.SchemaVersion >= relayVersionsSince {
		if err := db.QueryRowContext(ctx, `SELECT COALESCE(MAX(relays_from), 0) FROM `+n.Migrations).Scan(&st.RelaysFrom); err != nil {
			return fail(err)
		}
	}
	if st.SchemaVersion < 2 {
		return st, nil
	}
	var heldMicros int64
	if err := db.QueryRowContext(ctx, `SELECT (SELECT COUNT(*) FROM `+n.DeadLetter+`), (SELECT COUNT(*) FROM `+n.Held+`),
    (SELECT COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(held_at), UTC_TIMESTAMP(6)), 0) FROM `+n.Held+`)`).
		Scan(&st.DeadLetters, &st.Held, &heldMicros); err != nil {
		return fail(err)
	}
	if heldMicros > 0 {
		st.OldestHeldAge = time.Duration(heldMicros) * time.Microsecond
	}
	rows, err := db.QueryContext(ctx, `SELECT l.`+"`partition`"+`, COALESCE(l.owner, ''), l.epoch,
       CASE WHEN l.expires_at <= '1970-01-01 00:00:00' THEN -1000000000000000
            ELSE TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), l.expires_at) END,
       COALESCE(b.n, 0)
FROM `+n.Leases+` AS l
LEFT JOIN (SELECT `+"`partition`"+`, COUNT(*) AS n FROM `+n.Table+` WHERE published_at IS NULL GROUP BY `+"`partition`"+`) AS b
  ON b.`+"`partition`"+` = l.`+"`partition`"+`
ORDER BY l.`+"`partition`"+``)
	if err != nil {
		return fail(err)
	}
	defer rows.Close()
	for rows.Next() {
		var p outboxdriver.PartitionStatus
		var micros int64
		if err := rows.Scan(&p.Partition, &p.Owner, &p.Epoch, &micros, &p.Backlog); err != nil {
			return fail(err)
		}
		p.ExpiresIn = time.Duration(micros) * time.Microsecond
		if p.ExpiresIn <= 0 {
			p.Owner = "" // an expired lease is nobody's
		}
		st.Partitions = append(st.Partitions, p)
	}
	if err := rows.Err(); err != nil {
		return fail(err)
	}
	if st.SchemaVersion >= delayedVersion {
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+n.Table+`
WHERE published_at IS NULL AND deliver_at > UTC_TIMESTAMP(6)`).Scan(&st.Delayed); err != nil {
			return fail(err)
		}
	}
	if st.SchemaVersion >= consoleVersion {
		if st.Pauses, err = d.ListPauses(ctx, t); err != nil {
			return st, err
		}
	}
	return st, nil
}

// EstimateStatus is Status: its counts are exact.
func (d *Driver) EstimateStatus(ctx context.Context, t outboxdriver.Table, _ int64) (outboxdriver.Status, error) {
	return d.Status(ctx, t)
}

// isNoSuchTable reports MySQL's "table doesn't exist" (1146).
func isNoSuchTable(err error) bool {
	var my *mysql.MySQLError
	return errors.As(err, &my) && my.Number == 1146
}

// isNoSuchColumn reports MySQL's error of an unknown column.
func isNoSuchColumn(err error) bool {
	var my *mysql.MySQLError
	return errors.As(err, &my) && my.Number == 1054
}
