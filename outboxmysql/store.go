package outboxmysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outbox/outboxdriver"
)

// schemaArg is the schema as a query argument: NULL (the current
// database) when empty.
func schemaArg(t outboxdriver.Table) any {
	if t.Schema == "" {
		return nil
	}
	return t.Schema
}

// Status reports the backlog, the age of the oldest unpublished event, the
// dead letters, the held aggregates and every partition's lease of t.
func (d *Driver) Status(ctx context.Context, t outboxdriver.Table) (outboxdriver.Status, error) {
	st := outboxdriver.Status{Table: t, LatestSchemaVersion: d.LatestVersion()}
	if err := validate(t); err != nil {
		return st, err
	}
	fail := func(err error) (outboxdriver.Status, error) {
		return st, fmt.Errorf("outboxmysql: status of %s: %w", t, err)
	}
	db, err := d.Need()
	if err != nil {
		return st, err
	}
	n := namesOf(t)
	var found int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.TABLES
WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME IN (?, ?)`, schemaArg(t), t.Name, t.Name+"_migrations").Scan(&found); err != nil {
		return fail(err)
	}
	if found != 2 {
		return st, fmt.Errorf("outboxmysql: %s: %w", t, outboxdriver.ErrNotMigrated)
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
	return st, nil
}

// DeadLetters lists up to limit dead letters of t, oldest first.
func (d *Driver) DeadLetters(ctx context.Context, t outboxdriver.Table, limit int) ([]outboxdriver.DeadLetter, error) {
	if err := validate(t); err != nil {
		return nil, err
	}
	db, err := d.Need()
	if err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, `SELECT id, aggregatetype, aggregateid, type, attempts, last_error,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', dead_lettered_at), held
FROM `+namesOf(t).DeadLetter+` ORDER BY dead_lettered_at, seq LIMIT ?`, limit)
	if err != nil {
		return nil, fmt.Errorf("outboxmysql: list dead letters of %s: %w", t, err)
	}
	defer rows.Close()
	out := []outboxdriver.DeadLetter{}
	for rows.Next() {
		var dl outboxdriver.DeadLetter
		var micros int64
		if err := rows.Scan(&dl.ID, &dl.AggregateType, &dl.AggregateID, &dl.Type, &dl.Attempts, &dl.LastError, &micros, &dl.Held); err != nil {
			return nil, fmt.Errorf("outboxmysql: list dead letters of %s: %w", t, err)
		}
		dl.DeadLetteredAt = time.UnixMicro(micros).UTC()
		out = append(out, dl)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outboxmysql: list dead letters of %s: %w", t, err)
	}
	return out, nil
}

// idFilter returns the condition that selects ids (nil: every row) and
// its arguments, and false when ids is empty but not nil (no row).
func idFilter(ids []string) (string, []any, bool) {
	if ids == nil {
		return "TRUE", nil, true
	}
	if len(ids) == 0 {
		return "", nil, false
	}
	return "id IN (" + placeholders(len(ids)) + ")", strs(ids), true
}

// lockedDeadLetters locks the selected dead letters in tx and returns
// their ids in seq order with their audit detail.
func lockedDeadLetters(ctx context.Context, tx *sql.Tx, n outboxdriver.Names, where string, args []any) (ids, details []string, err error) {
	rows, err := tx.QueryContext(ctx, `SELECT id, CONCAT(aggregatetype, '/', aggregateid, ' ', type, ' after: ', last_error)
FROM `+n.DeadLetter+` WHERE `+where+` ORDER BY seq FOR UPDATE`, args...)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var id, detail string
		if err := rows.Scan(&id, &detail); err != nil {
			return nil, nil, err
		}
		ids, details = append(ids, id), append(details, detail)
	}
	return ids, details, rows.Err()
}

// moveDeadLetters runs fn on the selected dead letters in one transaction,
// audits each under actor and action, and returns their ids.
func (d *Driver) moveDeadLetters(ctx context.Context, t outboxdriver.Table, ids []string, actor, action string,
	fn func(tx *sql.Tx, n outboxdriver.Names, in string, args []any) error) ([]string, error) {
	if err := validate(t); err != nil {
		return nil, err
	}
	db, err := d.Need()
	if err != nil {
		return nil, err
	}
	where, args, ok := idFilter(ids)
	if !ok {
		return nil, nil
	}
	n := namesOf(t)
	out, err := func() ([]string, error) {
		tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			return nil, err
		}
		defer tx.Rollback()
		moved, details, err := lockedDeadLetters(ctx, tx, n, where, args)
		if err != nil || len(moved) == 0 {
			return nil, err
		}
		for part := range chunks(moved) {
			if err := fn(tx, n, placeholders(len(part)), strs(part)); err != nil {
				return nil, err
			}
		}
		for i, id := range moved {
			if _, err := tx.ExecContext(ctx, `INSERT INTO `+n.Audit+` (actor, action, event_id, detail) VALUES (?, ?, ?, ?)`,
				actor, action, id, details[i]); err != nil {
				return nil, err
			}
		}
		return moved, tx.Commit()
	}()
	if err != nil {
		return nil, fmt.Errorf("outboxmysql: %s dead letters of %s: %w", action, t, err)
	}
	return out, nil
}

// RetryDeadLetters moves dead letters back into the outbox with their ids
// and original positions (seq), so they are relayed again first within
// their aggregates (an aggregate held behind one of them stays held until
// it is published). ids nil means every dead letter. Each move is recorded
// in the audit table under actor. It returns the ids moved, in seq order.
func (d *Driver) RetryDeadLetters(ctx context.Context, t outboxdriver.Table, ids []string, actor string) ([]string, error) {
	return d.moveDeadLetters(ctx, t, ids, actor, "retry", func(tx *sql.Tx, n outboxdriver.Names, in string, args []any) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+n.Table+` (id, aggregatetype, aggregateid, type, payload, seq, created_at, headers, tracingspancontext, payload_raw)
SELECT id, aggregatetype, aggregateid, type, payload, seq, created_at, headers, tracingspancontext, payload_raw
FROM `+n.DeadLetter+` WHERE id IN (`+in+`) ORDER BY seq`, args...); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `DELETE FROM `+n.DeadLetter+` WHERE id IN (`+in+`)`, args...)
		return err
	})
}

// DiscardDeadLetters deletes dead letters for good and releases the
// aggregates held behind them. ids nil means every dead letter. Each
// deletion is recorded in the audit table under actor. It returns the ids
// deleted, in seq order.
func (d *Driver) DiscardDeadLetters(ctx context.Context, t outboxdriver.Table, ids []string, actor string) ([]string, error) {
	return d.moveDeadLetters(ctx, t, ids, actor, "discard", func(tx *sql.Tx, n outboxdriver.Names, in string, args []any) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM `+n.Held+` WHERE event_id IN (`+in+`)`, args...); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `DELETE FROM `+n.DeadLetter+` WHERE id IN (`+in+`)`, args...)
		return err
	})
}

// Audit lists the newest limit operator actions on t, newest first.
func (d *Driver) Audit(ctx context.Context, t outboxdriver.Table, limit int) ([]outboxdriver.AuditEntry, error) {
	if err := validate(t); err != nil {
		return nil, err
	}
	db, err := d.Need()
	if err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, `SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', at), actor, action, COALESCE(event_id, ''), detail
FROM `+namesOf(t).Audit+` ORDER BY id DESC LIMIT ?`, limit)
	if err != nil {
		return nil, fmt.Errorf("outboxmysql: audit of %s: %w", t, err)
	}
	defer rows.Close()
	out := []outboxdriver.AuditEntry{}
	for rows.Next() {
		var a outboxdriver.AuditEntry
		var micros int64
		if err := rows.Scan(&micros, &a.Actor, &a.Action, &a.EventID, &a.Detail); err != nil {
			return nil, fmt.Errorf("outboxmysql: audit of %s: %w", t, err)
		}
		a.At = time.UnixMicro(micros).UTC()
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outboxmysql: audit of %s: %w", t, err)
	}
	return out, nil
}

// isNoSuchTable reports MySQL's "table doesn't exist" (1146).
func isNoSuchTable(err error) bool {
	var my *mysql.MySQLError
	return errors.As(err, &my) && my.Number == 1146
}
