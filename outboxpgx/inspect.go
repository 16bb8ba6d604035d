package outboxpgx

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/outboxdriver"
)

// FindDeadLetters lists the dead letters of t that q selects, oldest
// first, one page at a time.
func (d *Driver) FindDeadLetters(ctx context.Context, t outboxdriver.Table, q outboxdriver.DeadLetterQuery) (outboxdriver.DeadLetterPage, error) {
	return d.findDeadLetters(ctx, t, q, "", nil)
}

// FindRoutedDeadLetters is FindDeadLetters keeping only the dead letters
// whose column holds one of values.
func (d *Driver) FindRoutedDeadLetters(ctx context.Context, t outboxdriver.Table, q outboxdriver.DeadLetterQuery, column string, values []string) (outboxdriver.DeadLetterPage, error) {
	if deadLetterColumns[column] == "" {
		return outboxdriver.DeadLetterPage{}, fmt.Errorf("outboxpgx: cannot select dead letters by %q", column)
	}
	if values == nil {
		values = []string{}
	}
	return d.findDeadLetters(ctx, t, q, column, values)
}

// deadLetterColumns are the columns a destination filter can select dead
// letters by, as SQL.
var deadLetterColumns = map[string]string{"aggregatetype": "aggregatetype", "aggregateid": "aggregateid", "type": "type", "id": "id::text"}

// deadLetterWhere is the condition of a list of dead letters: only the
// filters q sets (so that the planner sees which index answers them), the
// routed column's values when column is set, and q's cursor; args are
// appended to.
func deadLetterWhere(q outboxdriver.DeadLetterQuery, column string, values []string, args *[]any) string {
	conds := []string{"TRUE"}
	arg := func(v any) string {
		*args = append(*args, v)
		return fmt.Sprintf("$%d", len(*args))
	}
	if q.AggregateType != "" {
		conds = append(conds, "aggregatetype = "+arg(q.AggregateType))
	}
	if q.AggregateID != "" {
		conds = append(conds, "aggregateid = "+arg(q.AggregateID))
	}
	if q.Type != "" {
		conds = append(conds, "type = "+arg(q.Type))
	}
	if q.ErrorContains != "" {
		conds = append(conds, "strpos(lower(last_error), lower("+arg(q.ErrorContains)+")) > 0")
	}
	if !q.Since.IsZero() {
		conds = append(conds, "dead_lettered_at >= "+arg(q.Since))
	}
	if !q.Until.IsZero() {
		conds = append(conds, "dead_lettered_at < "+arg(q.Until))
	}
	if column != "" {
		conds = append(conds, deadLetterColumns[column]+" = ANY("+arg(values)+"::text[])")
	}
	if q.After != nil {
		conds = append(conds, "(dead_lettered_at, seq) > ("+arg(q.After.At)+"::timestamptz, "+arg(q.After.Seq)+"::bigint)")
	}
	return strings.Join(conds, " AND ")
}

func (d *Driver) findDeadLetters(ctx context.Context, t outboxdriver.Table, q outboxdriver.DeadLetterQuery, column string, values []string) (outboxdriver.DeadLetterPage, error) {
	var page outboxdriver.DeadLetterPage
	n, err := d.names(t)
	if err != nil {
		return page, err
	}
	if q.Limit <= 0 {
		return page, fmt.Errorf("outboxpgx: list dead letters of %s: limit %d, want a positive one", t, q.Limit)
	}
	var args []any
	where := deadLetterWhere(q, column, values, &args)
	rows, err := d.pool.Query(ctx, `SELECT id::text, aggregatetype, aggregateid, type, attempts, last_error, dead_lettered_at, held, seq
FROM `+n.DeadLetter+`
WHERE `+where+`
ORDER BY dead_lettered_at, seq
LIMIT `+fmt.Sprint(q.Limit+1), args...)
	if err != nil {
		return page, d.fail(ctx, t, "list dead letters of", err)
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
		return page, d.fail(ctx, t, "list dead letters of", err)
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

// DeadLetterValues lists up to limit distinct values of column among the
// dead letters of t that q selects.
func (d *Driver) DeadLetterValues(ctx context.Context, t outboxdriver.Table, q outboxdriver.DeadLetterQuery, column string, limit int) ([]string, error) {
	n, err := d.names(t)
	if err != nil {
		return nil, err
	}
	expr := deadLetterColumns[column]
	if expr == "" {
		return nil, fmt.Errorf("outboxpgx: cannot select dead letters by %q", column)
	}
	q.After = nil
	var args []any
	sql := `SELECT DISTINCT ` + expr + ` FROM ` + n.DeadLetter + ` WHERE ` + deadLetterWhere(q, "", nil, &args) + ` LIMIT ` + fmt.Sprint(limit)
	if column == "aggregatetype" || column == "type" {
		// Few distinct values, each read once from the column's index
		// (a skip scan): a superset of those the filters select, which
		// the list applies again.
		sql = `WITH RECURSIVE v AS (
    (SELECT ` + expr + ` AS x FROM ` + n.DeadLetter + ` ORDER BY 1 LIMIT 1)
    UNION ALL
    SELECT (SELECT ` + expr + ` FROM ` + n.DeadLetter + ` WHERE ` + expr + ` > v.x ORDER BY 1 LIMIT 1) FROM v WHERE v.x IS NOT NULL
)
SELECT x FROM v WHERE x IS NOT NULL LIMIT ` + fmt.Sprint(limit)
		args = nil
	}
	rows, err := d.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, d.fail(ctx, t, "values of "+column+" among the dead letters of", err)
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, d.fail(ctx, t, "values of "+column+" among the dead letters of", err)
	}
	return vs, nil
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
		return dl, d.fail(ctx, t, "dead letter "+id+" of", err)
	}
	if headers != nil {
		dl.Headers = driverkit.ParseHeaders(*headers)
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
		return d.fail(ctx, t, "audit of", err)
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
	// Only the filters q sets, so that the planner sees which index
	// answers them (schema version 11 indexes event, request, action and
	// actor, each with the id).
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args))
	}
	conds := []string{"TRUE"}
	if q.Actor != "" {
		conds = append(conds, "actor = "+arg(q.Actor))
	}
	if q.Action != "" {
		conds = append(conds, "action = "+arg(q.Action))
	}
	if event != nil {
		conds = append(conds, "event_id = "+arg(*event))
	}
	if q.Before > 0 {
		conds = append(conds, "id < "+arg(q.Before))
	}
	if request != nil {
		conds = append(conds, "request_id = "+arg(*request))
	}
	if !q.Since.IsZero() {
		conds = append(conds, "at >= "+arg(q.Since))
	}
	if !q.Until.IsZero() {
		conds = append(conds, "at < "+arg(q.Until))
	}
	rows, err := d.pool.Query(ctx, `SELECT id, at, actor, action, coalesce(event_id::text, ''), detail, role, reason,
       coalesce(request_id::text, ''), before::text, after::text
FROM `+n.Audit+`
WHERE `+strings.Join(conds, " AND ")+`
ORDER BY id DESC
LIMIT `+fmt.Sprint(q.Limit), args...)
	if err != nil {
		return nil, d.fail(ctx, t, "audit of", err)
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
		return nil, d.fail(ctx, t, "audit of", err)
	}
	return out, nil
}

// timeArg is nil for the zero time.
func timeArg(at time.Time) *time.Time {
	if at.IsZero() {
		return nil
	}
	return &at
}
