package outboxpgx

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// DeadLetters lists up to limit dead letters of t, oldest first.
func (d *Driver) DeadLetters(ctx context.Context, t outboxdriver.Table, limit int) ([]outboxdriver.DeadLetter, error) {
	n, err := d.names(t)
	if err != nil {
		return nil, err
	}
	rows, err := d.pool.Query(ctx, `SELECT id::text, aggregatetype, aggregateid, type, attempts, last_error, dead_lettered_at, held
FROM `+n.DeadLetter+` ORDER BY dead_lettered_at, seq LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("outboxpgx: list dead letters of %s: %w", t, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[outboxdriver.DeadLetter])
	if err != nil {
		return nil, fmt.Errorf("outboxpgx: list dead letters of %s: %w", t, err)
	}
	return out, nil
}

// RetryDeadLetters moves dead letters back into the outbox with their ids
// and original positions, so they are relayed again first within their
// aggregates (an aggregate held behind one of them stays held until it is
// published). ids nil means every dead letter. Each move is recorded in the
// audit table under actor. It returns the ids moved.
func (d *Driver) RetryDeadLetters(ctx context.Context, t outboxdriver.Table, ids []string, actor string) ([]string, error) {
	n, err := d.names(t)
	if err != nil {
		return nil, err
	}
	rows, err := d.pool.Query(ctx, `WITH moved AS (
    DELETE FROM `+n.DeadLetter+` WHERE $1::uuid[] IS NULL OR id = ANY($1::uuid[]) RETURNING *
), back AS (
    INSERT INTO `+n.Table+` (id, aggregatetype, aggregateid, type, payload, seq, created_at, headers, tracingspancontext, payload_raw)
    SELECT id, aggregatetype, aggregateid, type, payload, seq, created_at, headers, tracingspancontext, payload_raw
    FROM moved ORDER BY seq
    RETURNING id, seq
), audit AS (
    INSERT INTO `+n.Audit+` (actor, action, event_id, detail)
    SELECT $2, 'retry', m.id, m.aggregatetype || '/' || m.aggregateid || ' ' || m.type || ' after: ' || m.last_error FROM moved m
)
SELECT b.id::text FROM back AS b
-- Relays drop their floors (floor.go): the rows are back below them.
CROSS JOIN (SELECT pg_notify($3, '`+rewindPayload+`')) AS rewind
ORDER BY b.seq`, ids, actor, t.WithDefaults().Channel())
	if err != nil {
		return nil, fmt.Errorf("outboxpgx: retry dead letters of %s: %w", t, err)
	}
	return collectIDs(rows, "retry", t)
}

// DiscardDeadLetters deletes dead letters for good and releases the
// aggregates held behind them. ids nil means every dead letter. Each
// deletion is recorded in the audit table under actor. It returns the ids
// deleted.
func (d *Driver) DiscardDeadLetters(ctx context.Context, t outboxdriver.Table, ids []string, actor string) ([]string, error) {
	n, err := d.names(t)
	if err != nil {
		return nil, err
	}
	rows, err := d.pool.Query(ctx, `WITH gone AS (
    DELETE FROM `+n.DeadLetter+` WHERE $1::uuid[] IS NULL OR id = ANY($1::uuid[])
    RETURNING id, seq, aggregatetype, aggregateid, type, last_error
), unheld AS (
    DELETE FROM `+n.Held+` h USING gone g WHERE h.event_id = g.id
), audit AS (
    INSERT INTO `+n.Audit+` (actor, action, event_id, detail)
    SELECT $2, 'discard', g.id, g.aggregatetype || '/' || g.aggregateid || ' ' || g.type || ' after: ' || g.last_error FROM gone g
)
SELECT id::text FROM gone ORDER BY seq`, ids, actor)
	if err != nil {
		return nil, fmt.Errorf("outboxpgx: discard dead letters of %s: %w", t, err)
	}
	return collectIDs(rows, "discard", t)
}

// Audit lists the newest limit operator actions on t, newest first.
func (d *Driver) Audit(ctx context.Context, t outboxdriver.Table, limit int) ([]outboxdriver.AuditEntry, error) {
	n, err := d.names(t)
	if err != nil {
		return nil, err
	}
	rows, err := d.pool.Query(ctx, `SELECT at, actor, action, coalesce(event_id::text, ''), detail FROM `+n.Audit+` ORDER BY id DESC LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("outboxpgx: audit of %s: %w", t, err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[outboxdriver.AuditEntry])
}

// names validates t and returns its names; it fails when the Driver has
// no pool of its own.
func (d *Driver) names(t outboxdriver.Table) (outboxdriver.Names, error) {
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return outboxdriver.Names{}, fmt.Errorf("outboxpgx: %w", err)
	}
	if d.pool == nil {
		return outboxdriver.Names{}, errNoPool
	}
	return pgschema.NamesOf(t), nil
}

func collectIDs(rows pgx.Rows, what string, t outboxdriver.Table) ([]string, error) {
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("outboxpgx: %s dead letters of %s: %w", what, t, err)
	}
	return ids, nil
}
