package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/outboxdriver"
)

// FindDeadLetters lists the dead letters of t that q selects, oldest
// first, one page at a time.
func (s Store) FindDeadLetters(ctx context.Context, t outboxdriver.Table, q outboxdriver.DeadLetterQuery) (outboxdriver.DeadLetterPage, error) {
	return s.findDeadLetters(ctx, t, q, "", nil)
}

// FindRoutedDeadLetters is FindDeadLetters keeping only the dead letters
// whose column holds one of values: how a destination filter is answered.
func (s Store) FindRoutedDeadLetters(ctx context.Context, t outboxdriver.Table, q outboxdriver.DeadLetterQuery, column string, values []string) (outboxdriver.DeadLetterPage, error) {
	if !routedColumns[column] {
		return outboxdriver.DeadLetterPage{}, fmt.Errorf("%s: cannot select dead letters by %q", s.d.Driver, column)
	}
	if values == nil {
		values = []string{}
	}
	return s.findDeadLetters(ctx, t, q, column, values)
}

// DeadLetterValues lists up to limit distinct values of column among the
// dead letters of t that q selects (q's After and Limit aside).
func (s Store) DeadLetterValues(ctx context.Context, t outboxdriver.Table, q outboxdriver.DeadLetterQuery, column string, limit int) ([]string, error) {
	db, n, err := s.open(t)
	if err != nil {
		return nil, err
	}
	if !routedColumns[column] {
		return nil, fmt.Errorf("%s: cannot select dead letters by %q", s.d.Driver, column)
	}
	q.After = nil
	w := s.deadLetterWhere(q, "", nil)
	rows, err := db.QueryContext(ctx, `SELECT DISTINCT `+column+` FROM `+n.dead+` WHERE `+w.sql()+` LIMIT ?`, append(w.args, limit)...)
	if err != nil {
		return nil, s.fail(ctx, t, "list routed values of the dead letters of", err)
	}
	defer rows.Close()
	var vs []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			return nil, s.fail(ctx, t, "list routed values of the dead letters of", err)
		}
		vs = append(vs, v)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fail(ctx, t, "list routed values of the dead letters of", err)
	}
	return vs, nil
}

// deadLetterWhere is the condition of a list of dead letters: q's
// filters, the routed column's values when column is set, q's cursor.
func (s Store) deadLetterWhere(q outboxdriver.DeadLetterQuery, column string, values []string) where {
	var w where
	if column != "" {
		if len(values) == 0 {
			w.add("1 = 0")
		} else {
			w.add(column+" IN ("+placeholders(len(values))+")", anys(values)...)
		}
	}
	for _, f := range []struct{ col, v string }{{"aggregatetype", q.AggregateType}, {"aggregateid", q.AggregateID}, {"type", q.Type}} {
		if f.v != "" {
			w.add(f.col+" = ?", f.v)
		}
	}
	if q.ErrorContains != "" {
		w.add("instr(lower(last_error), lower(?)) > 0", q.ErrorContains)
	}
	if !q.Since.IsZero() {
		w.add("dead_lettered_at >= ?", s.d.TimeArg(q.Since))
	}
	if !q.Until.IsZero() {
		w.add("dead_lettered_at < ?", s.d.TimeArg(q.Until))
	}
	if q.After != nil {
		at := s.d.TimeArg(q.After.At)
		w.add("(dead_lettered_at > ? OR (dead_lettered_at = ? AND seq > ?))", at, at, q.After.Seq)
	}
	return w
}

// findDeadLetters lists the dead letters of t that q selects, and when
// column is set whose column holds one of values.
func (s Store) findDeadLetters(ctx context.Context, t outboxdriver.Table, q outboxdriver.DeadLetterQuery, column string, values []string) (outboxdriver.DeadLetterPage, error) {
	var page outboxdriver.DeadLetterPage
	db, n, err := s.open(t)
	if err != nil {
		return page, err
	}
	if q.Limit <= 0 {
		return page, fmt.Errorf("%s: list dead letters of %s: limit %d, want a positive one", s.d.Driver, t, q.Limit)
	}
	w := s.deadLetterWhere(q, column, values)
	rows, err := db.QueryContext(ctx, `SELECT id, aggregatetype, aggregateid, type, attempts, last_error, `+s.d.TimeText("dead_lettered_at")+`, held, seq
FROM `+n.dead+` WHERE `+w.sql()+` ORDER BY dead_lettered_at, seq LIMIT ?`, append(w.args, q.Limit+1)...)
	if err != nil {
		return page, s.fail(ctx, t, "list dead letters of", err)
	}
	defer rows.Close()
	var seqs []int64
	for rows.Next() {
		var dl outboxdriver.DeadLetter
		var seq int64
		if err := rows.Scan(&dl.ID, &dl.AggregateType, &dl.AggregateID, &dl.Type, &dl.Attempts, &dl.LastError, timeCol{&dl.DeadLetteredAt}, &dl.Held, &seq); err != nil {
			return page, s.fail(ctx, t, "list dead letters of", err)
		}
		page.DeadLetters = append(page.DeadLetters, dl)
		seqs = append(seqs, seq)
	}
	if err := rows.Err(); err != nil {
		return page, s.fail(ctx, t, "list dead letters of", err)
	}
	if len(page.DeadLetters) > q.Limit {
		page.DeadLetters = page.DeadLetters[:q.Limit]
		page.Next = &outboxdriver.DeadLetterCursor{At: page.DeadLetters[q.Limit-1].DeadLetteredAt, Seq: seqs[q.Limit-1]}
	}
	if page.DeadLetters == nil {
		page.DeadLetters = []outboxdriver.DeadLetter{}
	}
	return page, nil
}

// DeadLetter returns one dead letter of t with its payload and headers; it
// wraps outboxdriver.ErrNotFound when there is none with that id.
func (s Store) DeadLetter(ctx context.Context, t outboxdriver.Table, id string) (outboxdriver.DeadLetterDetail, error) {
	var dl outboxdriver.DeadLetterDetail
	db, n, err := s.open(t)
	if err != nil {
		return dl, err
	}
	u, ok := canonID(id)
	if !ok {
		return dl, fmt.Errorf("%s: dead letter %q of %s: %w", s.d.Driver, id, t, outboxdriver.ErrNotFound)
	}
	var headers, payload sql.NullString
	err = db.QueryRowContext(ctx, `SELECT id, aggregatetype, aggregateid, type, attempts, last_error, `+s.d.TimeText("dead_lettered_at")+`, held,
       seq, `+s.d.TimeText("created_at")+`, headers, tracingspancontext, payload, payload_raw
FROM `+n.dead+` WHERE id = ?`, u).Scan(&dl.ID, &dl.AggregateType, &dl.AggregateID, &dl.Type, &dl.Attempts, &dl.LastError,
		timeCol{&dl.DeadLetteredAt}, &dl.Held, &dl.Seq, timeCol{&dl.CreatedAt}, &headers, text{&dl.TraceContext}, &payload, &dl.PayloadRaw)
	if errors.Is(err, sql.ErrNoRows) {
		return dl, fmt.Errorf("%s: dead letter %s of %s: %w", s.d.Driver, id, t, outboxdriver.ErrNotFound)
	}
	if err != nil {
		return dl, s.fail(ctx, t, "dead letter of", err)
	}
	if headers.Valid {
		dl.Headers = driverkit.ParseHeaders(headers.String)
	}
	if payload.Valid {
		dl.Payload = []byte(payload.String)
	}
	return dl, nil
}

// AppendAudit adds r to the audit table of t.
func (s Store) AppendAudit(ctx context.Context, t outboxdriver.Table, r outboxdriver.AuditRecord) error {
	db, n, err := s.open(t)
	if err != nil {
		return err
	}
	if err := s.audit(ctx, db, n, r); err != nil {
		return s.fail(ctx, t, "audit of", err)
	}
	return nil
}

// execer is a pool or a transaction.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// audit inserts one full audit row.
func (s Store) audit(ctx context.Context, q execer, n tables, r outboxdriver.AuditRecord) error {
	var event any
	if r.EventID != "" {
		u, ok := canonID(r.EventID)
		if !ok {
			return fmt.Errorf("event id %q is not a UUID", r.EventID)
		}
		event = u
	}
	_, err := q.ExecContext(ctx, `INSERT INTO `+n.audit+" (actor, role, action, event_id, detail, reason, request_id, `before`, `after`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
		r.Actor, r.Role, r.Action, event, r.Detail, r.Reason, nullString(r.RequestID), nullJSON(r.Before), nullJSON(r.After))
	return err
}

// FindAudit lists the audit rows of t that q selects, newest first.
func (s Store) FindAudit(ctx context.Context, t outboxdriver.Table, q outboxdriver.AuditQuery) ([]outboxdriver.AuditRecord, error) {
	db, n, err := s.open(t)
	if err != nil {
		return nil, err
	}
	if q.Limit <= 0 {
		return nil, fmt.Errorf("%s: audit of %s: limit %d, want a positive one", s.d.Driver, t, q.Limit)
	}
	var w where
	if q.Actor != "" {
		w.add("actor = ?", q.Actor)
	}
	if q.Action != "" {
		w.add("action = ?", q.Action)
	}
	if q.EventID != "" {
		u, ok := canonID(q.EventID)
		if !ok {
			return nil, nil // no row has it
		}
		w.add("event_id = ?", u)
	}
	if q.RequestID != "" {
		u, ok := canonID(q.RequestID)
		if !ok {
			return nil, nil
		}
		w.add("request_id = ?", u)
	}
	if q.Before > 0 {
		w.add("id < ?", q.Before)
	}
	if !q.Since.IsZero() {
		w.add("at >= ?", s.d.TimeArg(q.Since))
	}
	if !q.Until.IsZero() {
		w.add("at < ?", s.d.TimeArg(q.Until))
	}
	rows, err := db.QueryContext(ctx, `SELECT id, `+s.d.TimeText("at")+", actor, action, event_id, detail, role, reason, request_id, `before`, `after`"+`
FROM `+n.audit+` WHERE `+w.sql()+` ORDER BY id DESC LIMIT ?`, append(w.args, q.Limit)...)
	if err != nil {
		return nil, s.fail(ctx, t, "audit of", err)
	}
	defer rows.Close()
	out := []outboxdriver.AuditRecord{}
	for rows.Next() {
		var a outboxdriver.AuditRecord
		var before, after sql.NullString
		if err := rows.Scan(&a.ID, timeCol{&a.At}, &a.Actor, &a.Action, text{&a.EventID}, &a.Detail, &a.Role, &a.Reason, text{&a.RequestID}, &before, &after); err != nil {
			return nil, s.fail(ctx, t, "audit of", err)
		}
		if before.Valid {
			a.Before = []byte(before.String)
		}
		if after.Valid {
			a.After = []byte(after.String)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fail(ctx, t, "audit of", err)
	}
	return out, nil
}

// RetryDeadLetters moves dead letters back into the outbox with their ids
// and original positions (seq), so they are relayed again first within
// their aggregates (an aggregate held behind one of them stays held until
// it is published). ids nil means every dead letter. Each move is recorded
// in the audit table as by, in the same transaction. It returns the ids
// moved, in seq order.
func (s Store) RetryDeadLetters(ctx context.Context, t outboxdriver.Table, ids []string, by outboxdriver.Acting) ([]string, error) {
	return s.move(ctx, t, ids, by, "retry")
}

// DiscardDeadLetters deletes dead letters for good and releases the
// aggregates held behind them. ids nil means every dead letter. Each
// deletion is recorded in the audit table as by, in the same transaction.
// It returns the ids deleted, in seq order.
func (s Store) DiscardDeadLetters(ctx context.Context, t outboxdriver.Table, ids []string, by outboxdriver.Acting) ([]string, error) {
	return s.move(ctx, t, ids, by, "discard")
}

func (s Store) move(ctx context.Context, t outboxdriver.Table, ids []string, by outboxdriver.Acting, action string) ([]string, error) {
	db, n, err := s.open(t)
	if err != nil {
		return nil, err
	}
	if ids != nil && len(ids) == 0 {
		return nil, nil
	}
	var moved []string
	err = s.inTx(ctx, db, func(tx *sql.Tx) error {
		var err error
		moved, err = s.moveIn(ctx, tx, n, ids, by, action)
		return err
	})
	if err != nil {
		return nil, s.fail(ctx, t, action+" dead letters of", err)
	}
	return moved, nil
}

// moveIn retries or discards the dead letters ids (nil: all) inside tx,
// auditing each, and returns the ids moved in seq order.
func (s Store) moveIn(ctx context.Context, tx *sql.Tx, n tables, ids []string, by outboxdriver.Acting, action string) ([]string, error) {
	type dead struct{ id, detail string }
	var found []dead
	lock := func(cond string, args []any) error {
		rows, err := tx.QueryContext(ctx, `SELECT id, aggregatetype, aggregateid, type, last_error FROM `+n.dead+` WHERE `+cond+` ORDER BY seq`+s.d.ForUpdate, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id, at, ai, typ, last string
			if err := rows.Scan(&id, &at, &ai, &typ, &last); err != nil {
				return err
			}
			found = append(found, dead{id, at + "/" + ai + " " + typ + " after: " + last})
		}
		return rows.Err()
	}
	if ids == nil {
		if err := lock("TRUE", nil); err != nil {
			return nil, err
		}
	} else {
		var canon []string
		for _, id := range ids {
			if u, ok := canonID(id); ok {
				canon = append(canon, u)
			}
		}
		for _, part := range chunks(canon) {
			if err := lock("id IN ("+placeholders(len(part))+")", anys(part)); err != nil {
				return nil, err
			}
		}
		if len(ids) > chunk { // each chunk was in order; all of them together must be too
			if err := sortBySeq(ctx, tx, n, found, func(d dead) string { return d.id }); err != nil {
				return nil, err
			}
		}
	}
	if len(found) == 0 {
		return nil, nil
	}
	out := make([]string, len(found))
	for i, d := range found {
		out[i] = d.id
	}
	for _, part := range chunks(out) {
		in, args := "id IN ("+placeholders(len(part))+")", anys(part)
		if action == "retry" {
			if _, err := tx.ExecContext(ctx, `INSERT INTO `+n.table+` (id, aggregatetype, aggregateid, type, payload, seq, created_at, headers, tracingspancontext, payload_raw)
SELECT id, aggregatetype, aggregateid, type, payload, seq, created_at, headers, tracingspancontext, payload_raw
FROM `+n.dead+` WHERE `+in+` ORDER BY seq`, args...); err != nil {
				return nil, err
			}
		} else if _, err := tx.ExecContext(ctx, `DELETE FROM `+n.held+` WHERE event_`+in, args...); err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM `+n.dead+` WHERE `+in, args...); err != nil {
			return nil, err
		}
	}
	for _, d := range found {
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+n.audit+` (actor, role, action, event_id, detail, reason) VALUES (?, ?, ?, ?, ?, ?)`,
			by.Name, by.Role, action, d.id, d.detail, by.Reason); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// sortBySeq orders xs (found chunk by chunk) by the seq of their dead
// letters.
func sortBySeq[T any](ctx context.Context, tx *sql.Tx, n tables, xs []T, id func(T) string) error {
	seq := map[string]int64{}
	for _, part := range chunks(xs) {
		ids := make([]string, len(part))
		for i, x := range part {
			ids[i] = id(x)
		}
		rows, err := tx.QueryContext(ctx, `SELECT id, seq FROM `+n.dead+` WHERE id IN (`+placeholders(len(ids))+`)`, anys(ids)...)
		if err != nil {
			return err
		}
		for rows.Next() {
			var k string
			var v int64
			if err := rows.Scan(&k, &v); err != nil {
				rows.Close()
				return err
			}
			seq[k] = v
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}
	slices.SortStableFunc(xs, func(a, b T) int { return cmp.Compare(seq[id(a)], seq[id(b)]) })
	return nil
}
