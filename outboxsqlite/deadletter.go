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

// RetryDeadLetters moves dead letters back into the outbox with their ids
// and original positions (seq), so they are relayed again first within
// their aggregates (an aggregate held behind one of them stays held until
// it is published). ids nil means every dead letter. Each move is recorded
// in the audit table under actor, in the same transaction. It returns the
// ids moved, in seq order.
func (d *Driver) RetryDeadLetters(ctx context.Context, t outboxdriver.Table, ids []string, actor string) ([]string, error) {
	return d.moveDeadLetters(ctx, t, ids, actor, "retry")
}

// DiscardDeadLetters deletes dead letters for good and releases the
// aggregates held behind them. ids nil means every dead letter. Each
// deletion is recorded in the audit table under actor, in the same
// transaction. It returns the ids deleted, in seq order.
func (d *Driver) DiscardDeadLetters(ctx context.Context, t outboxdriver.Table, ids []string, actor string) ([]string, error) {
	return d.moveDeadLetters(ctx, t, ids, actor, "discard")
}

func (d *Driver) moveDeadLetters(ctx context.Context, t outboxdriver.Table, ids []string, actor, action string) (_ []string, err error) {
	t, db, err := d.table(t)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("outboxsqlite: %s dead letters of %s: %s", action, t, oneLine(err))
		}
	}()
	n := namesOf(t)
	sel, args := `SELECT id FROM `+n.DeadLetter+` ORDER BY seq`, []any(nil)
	if ids != nil {
		sel = `SELECT id FROM ` + n.DeadLetter + ` WHERE id IN (SELECT value FROM json_each(?1)) ORDER BY seq`
		args = []any{stringsJSON(ids)}
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, sel, args...)
	if err != nil {
		return nil, err
	}
	var moved []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, err
		}
		moved = append(moved, id)
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	if len(moved) == 0 {
		return nil, nil
	}
	these := stringsJSON(moved)
	chosen := ` WHERE id IN (SELECT value FROM json_each(?1))`
	type step struct {
		sql  string
		args []any
	}
	steps := []step{{`INSERT INTO ` + n.Audit + ` (actor, action, event_id, detail)
SELECT ?2, ?3, id, aggregatetype || '/' || aggregateid || ' ' || type || ' after: ' || last_error
FROM ` + n.DeadLetter + chosen + ` ORDER BY seq`, []any{these, actor, action}}}
	if action == "retry" {
		steps = append(steps, step{`INSERT INTO ` + n.Table + ` (id, aggregatetype, aggregateid, type, payload, seq, created_at, headers, tracingspancontext, payload_raw)
SELECT id, aggregatetype, aggregateid, type, payload, seq, created_at, headers, tracingspancontext, payload_raw
FROM ` + n.DeadLetter + chosen + ` ORDER BY seq`, []any{these}})
	} else {
		steps = append(steps, step{`DELETE FROM ` + n.Held + ` WHERE event_id IN (SELECT value FROM json_each(?1))`, []any{these}})
	}
	steps = append(steps, step{`DELETE FROM ` + n.DeadLetter + chosen, []any{these}})
	for _, st := range steps {
		if _, err := tx.ExecContext(ctx, st.sql, st.args...); err != nil {
			return nil, err
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	return moved, nil
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
