package outboxsqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/outboxkit/outbox/outboxdriver"
)

// DeadLetters lists up to limit dead letters of t, oldest first.
func (d *Driver) DeadLetters(ctx context.Context, t outboxdriver.Table, limit int) ([]outboxdriver.DeadLetter, error) {
	t, db, err := d.table(t)
	if err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, `SELECT id, aggregatetype, aggregateid, type, attempts, last_error, dead_lettered_at, held
FROM `+namesOf(t).DeadLetter+` ORDER BY dead_lettered_at, seq LIMIT ?`, limit)
	if err != nil {
		return nil, fmt.Errorf("outboxsqlite: list dead letters of %s: %s", t, oneLine(err))
	}
	defer rows.Close()
	var out []outboxdriver.DeadLetter
	for rows.Next() {
		var dl outboxdriver.DeadLetter
		var at string
		if err := rows.Scan(&dl.ID, &dl.AggregateType, &dl.AggregateID, &dl.Type, &dl.Attempts, &dl.LastError, &at, &dl.Held); err != nil {
			return nil, fmt.Errorf("outboxsqlite: list dead letters of %s: %w", t, err)
		}
		dl.DeadLetteredAt = parseTime(at)
		out = append(out, dl)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outboxsqlite: list dead letters of %s: %s", t, oneLine(err))
	}
	return out, nil
}

// Audit lists the newest limit operator actions on t, newest first.
func (d *Driver) Audit(ctx context.Context, t outboxdriver.Table, limit int) ([]outboxdriver.AuditEntry, error) {
	t, db, err := d.table(t)
	if err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, `SELECT at, actor, action, coalesce(event_id, ''), detail FROM `+namesOf(t).Audit+` ORDER BY id DESC LIMIT ?`, limit)
	if err != nil {
		return nil, fmt.Errorf("outboxsqlite: audit of %s: %s", t, oneLine(err))
	}
	defer rows.Close()
	var out []outboxdriver.AuditEntry
	for rows.Next() {
		var a outboxdriver.AuditEntry
		var at string
		if err := rows.Scan(&at, &a.Actor, &a.Action, &a.EventID, &a.Detail); err != nil {
			return nil, fmt.Errorf("outboxsqlite: audit of %s: %w", t, err)
		}
		a.At = parseTime(at)
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outboxsqlite: audit of %s: %s", t, oneLine(err))
	}
	return out, nil
}

// table checks t and fills in the defaults, and returns the Driver's pool;
// it fails when the Driver has none.
func (d *Driver) table(t outboxdriver.Table) (outboxdriver.Table, *sql.DB, error) {
	t, err := table(t)
	if err != nil {
		return t, nil, err
	}
	db, err := d.Need()
	return t, db, err
}
