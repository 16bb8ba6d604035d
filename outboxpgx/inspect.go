package outboxpgx

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/outbox/outboxdriver"
)

// The Driver answers the operations console (package ops).
var (
	_ outboxdriver.Inspector         = (*Driver)(nil)
	_ outboxdriver.Auditor           = (*Driver)(nil)
	_ outboxdriver.DeadLetterActions = (*Driver)(nil)
)

// FindDeadLetters lists the dead letters of t that q selects, oldest
// first, one page at a time.
func (d *Driver) FindDeadLetters(ctx context.Context, t outboxdriver.Table, q outboxdriver.DeadLetterQuery) (outboxdriver.DeadLetterPage, error) {
	var page outboxdriver.DeadLetterPage
	n, err := d.names(t)
	if err != nil {
		return page, err
	}
	if q.Limit <= 0 {
		return page, fmt.Errorf("outboxpgx: list dead letters of %s: limit %d, want a positive one", t, q.Limit)
	}
	var afterAt *time.Time
	var afterSeq int64
	if q.After != nil {
		afterAt, afterSeq = &q.After.At, q.After.Seq
	}
	rows, err := d.pool.Query(ctx, `SELECT id::text, aggregatetype, aggregateid, type, attempts, last_error, dead_lettered_at, held, seq
FROM `+n.DeadLetter+`
WHERE ($1 = '' OR aggregatetype = $1)
  AND ($2 = '' OR aggregateid = $2)
  AND ($3 = '' OR type = $3)
  AND ($4 = '' OR strpos(lower(last_error), lower($4)) > 0)
  AND ($5::timestamptz IS NULL OR dead_lettered_at >= $5)
  AND ($6::timestamptz IS NULL OR dead_lettered_at < $6)
  AND ($7::timestamptz IS NULL OR (dead_lettered_at, seq) > ($7, $8::bigint))
ORDER BY dead_lettered_at, seq
LIMIT $9`, q.AggregateType, q.AggregateID, q.Type, q.ErrorContains, timeArg(q.Since), timeArg(q.Until), afterAt, afterSeq, q.Limit+1)
	if err != nil {
		return page, fmt.Errorf("outboxpgx: list dead letters of %s: %w", t, err)
	}
	type row struct {
		outboxdriver.DeadLetter
		seq int64
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		dl := &x.DeadLetter
		err := r.Scan(&dl.ID, &dl.AggregateType, &dl.AggregateID, &dl.Type, &dl.Attempts, &dl.LastError, &dl.DeadLetteredAt, &dl.Held, &x.seq)
		return x, err
	})
	if err != nil {
		return page, fmt.Errorf("outboxpgx: list dead letters of %s: %w", t, err)
	}
	if len(all) > q.Limit {
		all = all[:q.Limit]
		last := all[len(all)-1]
		page.Next = &outboxdriver.DeadLetterCursor{At: last.DeadLetteredAt, Seq: last.seq}
	}
	page.DeadLetters = make([]outboxdriver.DeadLetter, len(all))
	for i, r := range all {
		page.DeadLetters[i] = r.DeadLetter
	}
	return page, nil
}

// DeadLetter returns one dead letter of t with its payload and headers; it
// wraps outboxdriver.ErrNotFound when there is none with that id.
func (d *Driver) DeadLetter(ctx context.Context, t outboxdriver.Table, id string) (outboxdriver.DeadLetterDetail, error) {
	var dl outboxdriver.DeadLetterDetail
	n, err := d.names(t)
	if err != nil {
		return dl, err
	}
	u, err := uuid.Parse(id)
	if err != nil {
		return dl, fmt.Errorf("outboxpgx: dead letter %q of %s: %w", id, t, outboxdriver.ErrNotFound)
	}
	var headers, payload *string
	err = d.pool.QueryRow(ctx, `SELECT id::text, aggregatetype, aggregateid, type, attempts, last_error, dead_lettered_at, held,
       seq, created_at, headers::text, coalesce(tracingspancontext, ''), payload::text, payload_raw
FROM `+n.DeadLetter+` WHERE id = $1`, u).Scan(&dl.ID, &dl.AggregateType, &dl.AggregateID, &dl.Type, &dl.Attempts, &dl.LastError,
		&dl.DeadLetteredAt, &dl.Held, &dl.Seq, &dl.CreatedAt, &headers, &dl.TraceContext, &payload, &dl.PayloadRaw)
	if errors.Is(err, pgx.ErrNoRows) {
		return dl, fmt.Errorf("outboxpgx: dead letter %s of %s: %w", id, t, outboxdriver.ErrNotFound)
	}
	if err != nil {
		return dl, fmt.Errorf("outboxpgx: dead letter %s of %s: %w", id, t, err)
	}
	if headers != nil {
		dl.Headers = outboxdriver.ParseHeaders(*headers)
	}
	if payload != nil {
		dl.Payload = []byte(*payload)
	}
	return dl, nil
}

// AppendAudit adds r to the audit table of t.
func (d *Driver) AppendAudit(ctx context.Context, t outboxdriver.Table, r outboxdriver.AuditRecord) error {
	if _, err := d.names(t); err != nil {
		return err
	}
	err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error { return d.requestAudit(ctx, tx, t, r) })
	if err != nil {
		return auditErr(t, "audit of", err)
	}
	return nil
}

// FindAudit lists the audit rows of t that q selects, newest first.
func (d *Driver) FindAudit(ctx context.Context, t outboxdriver.Table, q outboxdriver.AuditQuery) ([]outboxdriver.AuditRecord, error) {
	n, err := d.names(t)
	if err != nil {
		return nil, err
	}
	if q.Limit <= 0 {
		return nil, fmt.Errorf("outboxpgx: audit of %s: limit %d, want a positive one", t, q.Limit)
	}
	var event *uuid.UUID
	if q.EventID != "" {
		u, err := uuid.Parse(q.EventID)
		if err != nil {
			return nil, nil // no row has it
		}
		event = &u
	}
	var request *uuid.UUID
	if q.RequestID != "" {
		u, err := uuid.Parse(q.RequestID)
		if err != nil {
			return nil, nil // no row has it
		}
		request = &u
	}
	rows, err := d.pool.Query(ctx, `SELECT id, at, actor, action, coalesce(event_id::text, ''), detail, role, reason,
       coalesce(request_id::text, ''), before::text, after::text
FROM `+n.Audit+`
WHERE ($1 = '' OR actor = $1)
  AND ($2 = '' OR action = $2)
  AND ($3::uuid IS NULL OR event_id = $3)
  AND ($4::bigint <= 0 OR id < $4)
  AND ($6::uuid IS NULL OR request_id = $6)
  AND ($7::timestamptz IS NULL OR at >= $7)
  AND ($8::timestamptz IS NULL OR at < $8)
ORDER BY id DESC
LIMIT $5`, q.Actor, q.Action, event, q.Before, q.Limit, request, timeArg(q.Since), timeArg(q.Until))
	if err != nil {
		return nil, auditErr(t, "audit of", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outboxdriver.AuditRecord, error) {
		var a outboxdriver.AuditRecord
		var before, after *string
		err := r.Scan(&a.ID, &a.At, &a.Actor, &a.Action, &a.EventID, &a.Detail, &a.Role, &a.Reason, &a.RequestID, &before, &after)
		if before != nil {
			a.Before = json.RawMessage(*before)
		}
		if after != nil {
			a.After = json.RawMessage(*after)
		}
		return a, err
	})
	if err != nil {
		return nil, auditErr(t, "audit of", err)
	}
	return out, nil
}

// RetryDeadLettersAs is RetryDeadLetters with each audit row carrying
// by's name, role and reason.
func (d *Driver) RetryDeadLettersAs(ctx context.Context, t outboxdriver.Table, ids []string, by outboxdriver.Acting) ([]string, error) {
	return d.retryDeadLetters(ctx, t, ids, by, true)
}

// DiscardDeadLettersAs is DiscardDeadLetters with each audit row carrying
// by's name, role and reason.
func (d *Driver) DiscardDeadLettersAs(ctx context.Context, t outboxdriver.Table, ids []string, by outboxdriver.Acting) ([]string, error) {
	return d.discardDeadLetters(ctx, t, ids, by, true)
}

// auditErr wraps err; an audit table without the columns of schema
// version 5 says to migrate.
func auditErr(t outboxdriver.Table, what string, err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && (pg.Code == "42703" || pg.Code == "42P01") { // undefined_column, undefined_table
		return fmt.Errorf("outboxpgx: %s %s: the table predates the console's schema (version 5 for role and reason, 7 for requests): run `outbox migrate`: %w", what, t, err)
	}
	return fmt.Errorf("outboxpgx: %s %s: %w", what, t, err)
}

// timeArg is nil for the zero time.
func timeArg(at time.Time) *time.Time {
	if at.IsZero() {
		return nil
	}
	return &at
}
