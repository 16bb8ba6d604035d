package outboxpgx

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// RetryDeadLetters moves dead letters back into the outbox with their ids
// and original positions, so they are relayed again first within their
// aggregates (an aggregate held behind one of them stays held until it is
// published). ids nil means every dead letter. Each move is recorded in the
// audit table as by, in the same transaction. It returns the ids moved.
func (d *Driver) RetryDeadLetters(ctx context.Context, t outboxdriver.Table, ids []string, by outboxdriver.Acting) ([]string, error) {
	if _, err := d.names(t); err != nil {
		return nil, err
	}
	moved, err := d.retryDeadLettersOn(ctx, d.pool, t, ids, by)
	if err != nil {
		return nil, d.fail(ctx, t, "retry dead letters of", err)
	}
	return moved, nil
}

// DiscardDeadLetters deletes dead letters for good and releases the
// aggregates held behind them. ids nil means every dead letter. Each
// deletion is recorded in the audit table as by, in the same transaction.
// It returns the ids deleted.
func (d *Driver) DiscardDeadLetters(ctx context.Context, t outboxdriver.Table, ids []string, by outboxdriver.Acting) ([]string, error) {
	n, err := d.names(t)
	if err != nil {
		return nil, err
	}
	cols, vals, audit := auditRow("g", "discard", 2, by)
	rows, err := d.pool.Query(ctx, `WITH gone AS (
    DELETE FROM `+n.DeadLetter+` WHERE $1::uuid[] IS NULL OR id = ANY($1::uuid[])
    RETURNING id, seq, aggregatetype, aggregateid, type, last_error
), unheld AS (
    DELETE FROM `+n.Held+` h USING gone g WHERE h.event_id = g.id
), audit AS (
    INSERT INTO `+n.Audit+` (`+cols+`)
    SELECT `+vals+` FROM gone g
)
SELECT id::text FROM gone ORDER BY seq`, append([]any{ids}, audit...)...)
	if err != nil {
		return nil, d.fail(ctx, t, "discard dead letters of", err)
	}
	gone, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, d.fail(ctx, t, "discard dead letters of", err)
	}
	return gone, nil
}

// auditRow returns the audit CTE's columns and values for action on the
// rows of alias, and the arguments from the first one, $first.
func auditRow(alias, action string, first int, by outboxdriver.Acting) (cols, vals string, args []any) {
	detail := alias + `.aggregatetype || '/' || ` + alias + `.aggregateid || ' ' || ` + alias + `.type || ' after: ' || ` + alias + `.last_error`
	arg := func(k int) string { return fmt.Sprintf("$%d", first+k) }
	return `actor, role, action, event_id, detail, reason`,
		arg(0) + `, ` + arg(1) + `, '` + action + `', ` + alias + `.id, ` + detail + `, ` + arg(2), []any{by.Name, by.Role, by.Reason}
}

// querier is a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// retryDeadLettersOn is RetryDeadLetters on q: the pool, or a transaction
// that does more (a repair). Its errors are the database's: the caller
// wraps them once q's connection is back.
func (d *Driver) retryDeadLettersOn(ctx context.Context, q querier, t outboxdriver.Table, ids []string, by outboxdriver.Acting) ([]string, error) {
	n := pgschema.NamesOf(t.WithDefaults())
	cols, vals, audit := auditRow("m", "retry", 3, by)
	rows, err := q.Query(ctx, `WITH moved AS (
    DELETE FROM `+n.DeadLetter+` WHERE $1::uuid[] IS NULL OR id = ANY($1::uuid[]) RETURNING *
), back AS (
    INSERT INTO `+n.Table+` (id, aggregatetype, aggregateid, type, payload, seq, created_at, headers, tracingspancontext, payload_raw)
    SELECT id, aggregatetype, aggregateid, type, payload, seq, created_at, headers, tracingspancontext, payload_raw
    FROM moved ORDER BY seq
    RETURNING id, seq
), audit AS (
    INSERT INTO `+n.Audit+` (`+cols+`)
    SELECT `+vals+` FROM moved m
)
SELECT b.id::text FROM back AS b
-- Relays drop their floors (floor.go): the rows are back below them.
CROSS JOIN (SELECT pg_notify($2, '`+rewindPayload+`')) AS rewind
ORDER BY b.seq`, append([]any{ids, t.WithDefaults().Channel()}, audit...)...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// names validates t and returns its names; it fails when the Driver has
// no pool of its own.
func (d *Driver) names(t outboxdriver.Table) (driverkit.Names, error) {
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return driverkit.Names{}, fmt.Errorf("outboxpgx: %w", err)
	}
	if d.pool == nil {
		return driverkit.Names{}, errNoPool
	}
	return pgschema.NamesOf(t), nil
}
