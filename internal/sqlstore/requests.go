package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/outboxdriver"
)

// requestCols are the columns scanRequest reads, in its order, with the
// request's expiry and heartbeat judged by the database clock.
func (s Store) requestCols() string {
	tt := s.d.TimeText
	return `id, kind, state, requester, requester_role, reason, params, ` + tt("created_at") + `, ` + tt("expires_at") + `,
decided_by, decided_role, ` + tt("decided_at") + `, decision_note, executor, epoch, ` + tt("heartbeat_at") + `, ` + tt("started_at") + `, ` + tt("finished_at") + ",\n" +
		"total, done, `cursor`, `error`, CASE WHEN expires_at <= " + s.d.Now + " THEN 1 ELSE 0 END"
}

// request is a request with whether it is past its expiry.
type request struct {
	outboxdriver.Request
	expired bool
}

func scanRequest(r interface{ Scan(...any) error }) (request, error) {
	var q request
	var params string
	var total sql.NullInt64
	var expired int
	err := r.Scan(&q.ID, &q.Kind, &q.State, &q.Requester, &q.RequesterRole, &q.Reason, text{&params}, timeCol{&q.CreatedAt}, timeCol{&q.ExpiresAt},
		&q.DecidedBy, &q.DecidedRole, nullTime{&q.DecidedAt}, &q.DecisionNote, &q.Executor, &q.Epoch, nullTime{&q.HeartbeatAt}, nullTime{&q.StartedAt}, nullTime{&q.FinishedAt},
		&total, &q.Done, &q.Cursor, &q.Error, &expired)
	q.Params = json.RawMessage(params)
	if total.Valid {
		q.Total = &total.Int64
	}
	q.expired = expired == 1
	return q, err
}

// getRequest reads request id (locked in a transaction), wrapping
// ErrNotFound.
func (s Store) getRequest(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, n tables, id string, lock bool) (request, error) {
	u, ok := canonID(id)
	if !ok {
		return request{}, fmt.Errorf("request %s: %w", id, outboxdriver.ErrNotFound)
	}
	forUpdate := ""
	if lock {
		forUpdate = s.d.ForUpdate
	}
	r, err := scanRequest(q.QueryRowContext(ctx, `SELECT `+s.requestCols()+` FROM `+n.requests+` WHERE id = ?`+forUpdate, u))
	if errors.Is(err, sql.ErrNoRows) {
		return r, fmt.Errorf("request %s: %w", id, outboxdriver.ErrNotFound)
	}
	return r, err
}

// stateErr says why r cannot move.
func stateErr(r request) error {
	state := r.State
	if r.expired && (state == outboxdriver.StatePending || state == outboxdriver.StateApproved) {
		state = outboxdriver.StateExpired
	}
	return fmt.Errorf("request %s is %s: %w", r.ID, state, outboxdriver.ErrRequestState)
}

// requestTx runs fn in a transaction on t's tables.
func (s Store) requestTx(ctx context.Context, t outboxdriver.Table, what string, fn func(*sql.Tx, tables) error) error {
	db, n, err := s.open(t)
	if err != nil {
		return err
	}
	if err := s.inTx(ctx, db, func(tx *sql.Tx) error { return fn(tx, n) }); err != nil {
		return s.fail(ctx, t, what, err)
	}
	return nil
}

// CreateRequest stores r as a pending request and audits it as by.
func (s Store) CreateRequest(ctx context.Context, t outboxdriver.Table, r outboxdriver.Request, by outboxdriver.Acting) error {
	return s.requestTx(ctx, t, "create a request on", func(tx *sql.Tx, n tables) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+n.requests+` (id, kind, requester, requester_role, reason, params, created_at, expires_at)
VALUES (?, ?, ?, ?, ?, ?, `+s.d.Now+`, ?)`, r.ID, r.Kind, r.Requester, r.RequesterRole, r.Reason, string(r.Params), s.d.TimeArg(r.ExpiresAt)); err != nil {
			return err
		}
		return s.audit(ctx, tx, n, driverkit.CreatedAudit(r, by))
	})
}

// GetRequest returns one request of t.
func (s Store) GetRequest(ctx context.Context, t outboxdriver.Table, id string) (outboxdriver.Request, error) {
	db, n, err := s.open(t)
	if err != nil {
		return outboxdriver.Request{}, err
	}
	r, err := s.getRequest(ctx, db, n, id, false)
	if err != nil {
		return r.Request, s.fail(ctx, t, "request of", err)
	}
	return r.Request, nil
}

// ListRequests lists the requests of t, newest first.
func (s Store) ListRequests(ctx context.Context, t outboxdriver.Table, state string, limit int) ([]outboxdriver.Request, error) {
	db, n, err := s.open(t)
	if err != nil {
		return nil, err
	}
	var w where
	if state != "" {
		w.add("state = ?", state)
	}
	rows, err := db.QueryContext(ctx, `SELECT `+s.requestCols()+` FROM `+n.requests+` WHERE `+w.sql()+` ORDER BY created_at DESC, id LIMIT ?`, append(w.args, limit)...)
	if err != nil {
		return nil, s.fail(ctx, t, "requests of", err)
	}
	defer rows.Close()
	var out []outboxdriver.Request
	for rows.Next() {
		r, err := scanRequest(rows)
		if err != nil {
			return nil, s.fail(ctx, t, "requests of", err)
		}
		out = append(out, r.Request)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fail(ctx, t, "requests of", err)
	}
	return out, nil
}

// DecideRequest approves, rejects or cancels a request.
func (s Store) DecideRequest(ctx context.Context, t outboxdriver.Table, id, to string, by outboxdriver.Acting) (outboxdriver.Request, error) {
	var out outboxdriver.Request
	action := map[string]string{outboxdriver.StateApproved: "approve", outboxdriver.StateRejected: "reject", outboxdriver.StateCancelled: "cancel"}[to]
	if action == "" {
		return out, fmt.Errorf("%s: request %s: cannot move to %q", s.d.Driver, id, to)
	}
	err := s.requestTx(ctx, t, "decide a request on", func(tx *sql.Tx, n tables) error {
		r, err := s.getRequest(ctx, tx, n, id, true)
		if err != nil {
			return err
		}
		switch to {
		case outboxdriver.StateApproved, outboxdriver.StateRejected:
			// Never the requester's own: ops refuses it first, with a message.
			if r.State != outboxdriver.StatePending || r.expired || r.Requester == by.Name {
				return stateErr(r)
			}
			_, err = tx.ExecContext(ctx, `UPDATE `+n.requests+` SET state = ?, decided_by = ?, decided_role = ?, decided_at = `+s.d.Now+`, decision_note = ? WHERE id = ?`,
				to, by.Name, by.Role, by.Reason, r.ID)
		default:
			if r.State != outboxdriver.StatePending && r.State != outboxdriver.StateApproved && r.State != outboxdriver.StateExecuting || by.Role == "" {
				return stateErr(r)
			}
			msg := "cancelled by " + by.Name
			if by.Reason != "" {
				msg += ": " + by.Reason
			}
			_, err = tx.ExecContext(ctx, `UPDATE `+n.requests+` SET state = ?, finished_at = `+s.d.Now+", `error` = ? WHERE id = ?", to, msg, r.ID)
		}
		if err != nil {
			return err
		}
		if r, err = s.getRequest(ctx, tx, n, r.ID, false); err != nil {
			return err
		}
		out = r.Request
		return s.audit(ctx, tx, n, outboxdriver.AuditRecord{
			Actor: by.Name, Action: action, Detail: out.Kind + " requested by " + out.Requester,
			Role: by.Role, Reason: by.Reason, RequestID: out.ID,
		})
	})
	return out, err
}

// ExpireRequests marks the requests past their expiry expired.
func (s Store) ExpireRequests(ctx context.Context, t outboxdriver.Table, by outboxdriver.Acting) ([]string, error) {
	var ids []string
	err := s.requestTx(ctx, t, "expire requests of", func(tx *sql.Tx, n tables) error {
		rows, err := tx.QueryContext(ctx, `SELECT id, kind, requester, `+s.d.TimeText("expires_at")+` FROM `+n.requests+`
WHERE state IN ('pending', 'approved') AND expires_at <= `+s.d.Now+` ORDER BY created_at`+s.d.ForUpdate)
		if err != nil {
			return err
		}
		type gone struct {
			id, kind, requester string
			at                  time.Time
		}
		var all []gone
		for rows.Next() {
			var g gone
			if err := rows.Scan(&g.id, &g.kind, &g.requester, timeCol{&g.at}); err != nil {
				rows.Close()
				return err
			}
			all = append(all, g)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, g := range all {
			if _, err := tx.ExecContext(ctx, `UPDATE `+n.requests+` SET state = 'expired', finished_at = `+s.d.Now+` WHERE id = ?`, g.id); err != nil {
				return err
			}
			if err := s.audit(ctx, tx, n, outboxdriver.AuditRecord{
				Actor: by.Name, Action: "expire",
				Detail: g.kind + " requested by " + g.requester + " was not carried out by " + g.at.Format(time.RFC3339),
				Role:   by.Role, RequestID: g.id,
			}); err != nil {
				return err
			}
			ids = append(ids, g.id)
		}
		return nil
	})
	return ids, err
}

// ClaimRequest makes executor the executor of an approved request, or
// takes over an executing one whose executor went quiet.
func (s Store) ClaimRequest(ctx context.Context, t outboxdriver.Table, id, executor string, stale time.Duration) (outboxdriver.Request, error) {
	var out outboxdriver.Request
	err := s.requestTx(ctx, t, "execute a request on", func(tx *sql.Tx, n tables) error {
		r, err := s.getRequest(ctx, tx, n, id, true)
		if err != nil {
			return err
		}
		var quiet int
		if err := tx.QueryRowContext(ctx, `SELECT CASE WHEN heartbeat_at < `+s.d.NowMinusMS+` THEN 1 ELSE 0 END FROM `+n.requests+` WHERE id = ?`,
			stale.Milliseconds(), r.ID).Scan(&quiet); err != nil {
			return err
		}
		if !(r.State == outboxdriver.StateApproved && !r.expired) && !(r.State == outboxdriver.StateExecuting && quiet == 1) {
			return stateErr(r)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE `+n.requests+` SET state = 'executing', executor = ?, epoch = epoch + 1, heartbeat_at = `+s.d.Now+`,
    started_at = coalesce(started_at, `+s.d.Now+`) WHERE id = ?`, executor, r.ID); err != nil {
			return err
		}
		if r, err = s.getRequest(ctx, tx, n, r.ID, false); err != nil {
			return err
		}
		out = r.Request
		return s.audit(ctx, tx, n, driverkit.ExecuteAudit(out, executor))
	})
	return out, err
}

// lockExecuting locks request id if executor holds it at epoch.
func (s Store) lockExecuting(ctx context.Context, tx *sql.Tx, n tables, id, executor string, epoch int64) (request, error) {
	r, err := s.getRequest(ctx, tx, n, id, true)
	if err != nil {
		return r, err
	}
	if r.State != outboxdriver.StateExecuting || r.Executor != executor || r.Epoch != epoch {
		return r, stateErr(r)
	}
	return r, nil
}

// FinishRequest ends an execution: done, or failed with msg.
func (s Store) FinishRequest(ctx context.Context, t outboxdriver.Table, id, executor string, epoch int64, state, msg string) error {
	if state != outboxdriver.StateDone && state != outboxdriver.StateFailed {
		return fmt.Errorf("%s: request %s: finish as %q", s.d.Driver, id, state)
	}
	return s.requestTx(ctx, t, "finish a request on", func(tx *sql.Tx, n tables) error {
		r, err := s.lockExecuting(ctx, tx, n, id, executor, epoch)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE `+n.requests+" SET state = ?, `error` = ?, finished_at = "+s.d.Now+` WHERE id = ?`, state, msg, r.ID); err != nil {
			return err
		}
		return s.audit(ctx, tx, n, driverkit.FinishAudit(r.Request, state, msg))
	})
}

// SetRequestTotal records how many events an execution found, once.
func (s Store) SetRequestTotal(ctx context.Context, t outboxdriver.Table, id string, total int64) error {
	db, n, err := s.open(t)
	if err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `UPDATE `+n.requests+` SET total = ? WHERE id = ? AND total IS NULL`, total, id); err != nil {
		return s.fail(ctx, t, "request of", err)
	}
	return nil
}

// routedColumns are the columns a destination filter (of a replay, or of
// dead letters) may name.
var routedColumns = map[string]bool{"aggregatetype": true, "aggregateid": true, "type": true, "id": true}

// replayWhere selects the kept published events of f among the rows of
// alias o.
func (s Store) replayWhere(f outboxdriver.ReplayFilter) (where, error) {
	var w where
	w.add("o.published_at IS NOT NULL")
	if !f.Since.IsZero() {
		w.add("o.published_at >= ?", s.d.TimeArg(f.Since))
	}
	if !f.Until.IsZero() {
		w.add("o.published_at < ?", s.d.TimeArg(f.Until))
	}
	for _, x := range []struct{ col, v string }{{"aggregatetype", f.AggregateType}, {"aggregateid", f.AggregateID}, {"type", f.Type}} {
		if x.v != "" {
			w.add("o."+x.col+" = ?", x.v)
		}
	}
	if f.RoutedColumn != "" {
		if !routedColumns[f.RoutedColumn] {
			return w, fmt.Errorf("%s: cannot select events by the destination routed from %q", s.d.Driver, f.RoutedColumn)
		}
		if len(f.RoutedValues) == 0 {
			w.add("1 = 0")
		} else {
			w.add("o."+f.RoutedColumn+" IN ("+placeholders(len(f.RoutedValues))+")", anys(f.RoutedValues)...)
		}
	}
	return w, nil
}

// HasPublished reports whether t keeps any published row.
func (s Store) HasPublished(ctx context.Context, t outboxdriver.Table) (bool, error) {
	db, n, err := s.open(t)
	if err != nil {
		return false, err
	}
	var one int
	err = db.QueryRowContext(ctx, `SELECT 1 FROM `+n.table+` WHERE published_at IS NOT NULL LIMIT 1`).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, s.fail(ctx, t, "published rows of", err)
	}
	return true, nil
}

// PreviewReplay counts the events f selects and returns the first limit.
func (s Store) PreviewReplay(ctx context.Context, t outboxdriver.Table, f outboxdriver.ReplayFilter, limit int) (int64, []outboxdriver.ReplayEvent, error) {
	db, n, err := s.open(t)
	if err != nil {
		return 0, nil, err
	}
	w, err := s.replayWhere(f)
	if err != nil {
		return 0, nil, err
	}
	var count int64
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM `+n.table+` o WHERE `+w.sql(), w.args...).Scan(&count); err != nil {
		return 0, nil, s.fail(ctx, t, "preview a replay of", err)
	}
	rows, err := db.QueryContext(ctx, `SELECT o.id, o.seq, o.aggregatetype, o.aggregateid, o.type, `+s.d.TimeText("o.created_at")+`, `+s.d.TimeText("o.published_at")+`
FROM `+n.table+` o WHERE `+w.sql()+` ORDER BY o.seq LIMIT ?`, append(w.args, limit)...)
	if err != nil {
		return 0, nil, s.fail(ctx, t, "preview a replay of", err)
	}
	defer rows.Close()
	var evs []outboxdriver.ReplayEvent
	for rows.Next() {
		var e outboxdriver.ReplayEvent
		if err := rows.Scan(&e.ID, &e.Seq, &e.AggregateType, &e.AggregateID, &e.Type, timeCol{&e.CreatedAt}, timeCol{&e.PublishedAt}); err != nil {
			return 0, nil, s.fail(ctx, t, "preview a replay of", err)
		}
		evs = append(evs, e)
	}
	if err := rows.Err(); err != nil {
		return 0, nil, s.fail(ctx, t, "preview a replay of", err)
	}
	return count, evs, nil
}

// RoutedValues lists distinct values of column among the events f selects.
func (s Store) RoutedValues(ctx context.Context, t outboxdriver.Table, f outboxdriver.ReplayFilter, column string, limit int) ([]string, error) {
	db, n, err := s.open(t)
	if err != nil {
		return nil, err
	}
	if !routedColumns[column] {
		return nil, fmt.Errorf("%s: cannot select events by the destination routed from %q", s.d.Driver, column)
	}
	w, err := s.replayWhere(f)
	if err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, `SELECT DISTINCT o.`+column+` FROM `+n.table+` o WHERE `+w.sql()+` LIMIT ?`, append(w.args, limit)...)
	if err != nil {
		return nil, s.fail(ctx, t, "destinations of", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			return nil, s.fail(ctx, t, "destinations of", err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fail(ctx, t, "destinations of", err)
	}
	return out, nil
}

// kept is one published event a replay copies.
type kept struct {
	id                        string
	seq                       int64
	aggType, aggID, typ       string
	payload, headers, tracing sql.NullString
	raw                       []byte
}

// ReplayBatch re-enqueues the next events of a replay: the copies, the
// request's cursor and progress and its heartbeat in one transaction.
func (s Store) ReplayBatch(ctx context.Context, t outboxdriver.Table, b outboxdriver.ReplayBatch) (int, bool, error) {
	if b.Limit <= 0 {
		return 0, false, fmt.Errorf("%s: replay batch of %s: limit %d", s.d.Driver, t, b.Limit)
	}
	w, err := s.replayWhere(b.Filter)
	if err != nil {
		return 0, false, err
	}
	var count int
	var more bool
	err = s.requestTx(ctx, t, "replay events of", func(tx *sql.Tx, n tables) error {
		r, err := s.lockExecuting(ctx, tx, n, b.Request, b.Executor, b.Epoch)
		if err != nil {
			return err
		}
		rows, err := tx.QueryContext(ctx, `SELECT o.id, o.seq, o.aggregatetype, o.aggregateid, o.type, o.payload, o.headers, o.tracingspancontext, o.payload_raw
FROM `+n.table+` o WHERE o.seq > ? AND `+w.sql()+` ORDER BY o.seq LIMIT ?`+s.d.ForUpdate, append(append([]any{r.Cursor}, w.args...), b.Limit+1)...)
		if err != nil {
			return err
		}
		var evs []kept
		for rows.Next() {
			var e kept
			if err := rows.Scan(&e.id, &e.seq, &e.aggType, &e.aggID, &e.typ, &e.payload, &e.headers, &e.tracing, &e.raw); err != nil {
				rows.Close()
				return err
			}
			evs = append(evs, e)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if len(evs) > b.Limit {
			evs, more = evs[:b.Limit], true
		}
		count = len(evs)
		if count > 0 {
			if err := s.copyEvents(ctx, tx, n, evs, b); err != nil {
				return err
			}
		}
		cursor := r.Cursor
		if count > 0 {
			cursor = evs[count-1].seq
		}
		_, err = tx.ExecContext(ctx, `UPDATE `+n.requests+" SET `cursor` = ?, done = done + ?, heartbeat_at = "+s.d.Now+` WHERE id = ?`, cursor, count, r.ID)
		return err
	})
	if err != nil {
		return 0, false, err
	}
	return count, more, nil
}

// copyEvents re-enqueues copies of evs in their order: with new ids and
// the header outbox-replay-of, or in place of the originals with their
// ids; each with the header outbox-replay-id.
func (s Store) copyEvents(ctx context.Context, tx *sql.Tx, n tables, evs []kept, b outboxdriver.ReplayBatch) error {
	if !b.NewIDs {
		ids := make([]string, len(evs))
		for i, e := range evs {
			ids[i] = e.id
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM `+n.table+` WHERE id IN (`+placeholders(len(ids))+`)`, anys(ids)...)
		if err != nil {
			return err
		}
		if k, err := res.RowsAffected(); err != nil || int(k) != len(ids) {
			return fmt.Errorf("replay batch: %d of %d events re-enqueued (a row changed meanwhile); nothing of this batch is applied (%v)", k, len(ids), err)
		}
	}
	var q strings.Builder
	q.WriteString(`INSERT INTO ` + n.table + ` (id, aggregatetype, aggregateid, type, payload, headers, tracingspancontext, payload_raw) VALUES `)
	args := make([]any, 0, 8*len(evs))
	for i, e := range evs {
		headers := map[string]json.RawMessage{}
		if e.headers.Valid && e.headers.String != "" {
			if err := json.Unmarshal([]byte(e.headers.String), &headers); err != nil {
				return fmt.Errorf("replay batch: headers of %s: %w", e.id, err)
			}
		}
		replayID, _ := json.Marshal(b.Request)
		headers["outbox-replay-id"] = replayID
		id := e.id
		if b.NewIDs {
			id = uuid.Must(uuid.NewV7()).String()
			of, _ := json.Marshal(e.id)
			headers["outbox-replay-of"] = of
		}
		h, err := json.Marshal(headers)
		if err != nil {
			return err
		}
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString("(?, ?, ?, ?, ?, ?, ?, ?)")
		var payload, tracing any
		if e.payload.Valid {
			payload = e.payload.String
		}
		if e.tracing.Valid {
			tracing = e.tracing.String
		}
		args = append(args, id, e.aggType, e.aggID, e.typ, payload, string(h), tracing, e.raw)
	}
	_, err := tx.ExecContext(ctx, q.String(), args...)
	return err
}

// RepairDeadLetter replaces a dead letter's payload and headers and moves
// it back into the outbox, as the request's execution.
func (s Store) RepairDeadLetter(ctx context.Context, t outboxdriver.Table, req, executor string, epoch int64, id string, payload, headers json.RawMessage, by outboxdriver.Acting) error {
	return s.requestTx(ctx, t, "repair a dead letter of", func(tx *sql.Tx, n tables) error {
		r, err := s.lockExecuting(ctx, tx, n, req, executor, epoch)
		if err != nil {
			return err
		}
		u, ok := canonID(id)
		if !ok {
			return fmt.Errorf("dead letter %s: %w", id, outboxdriver.ErrNotFound)
		}
		var oldPayload, oldHeaders sql.NullString
		var oldRaw []byte
		err = tx.QueryRowContext(ctx, `SELECT payload, payload_raw, headers FROM `+n.dead+` WHERE id = ?`+s.d.ForUpdate, u).Scan(&oldPayload, &oldRaw, &oldHeaders)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("dead letter %s (retried or discarded meanwhile): %w", id, outboxdriver.ErrNotFound)
		}
		if err != nil {
			return err
		}
		if payload != nil {
			if _, err := tx.ExecContext(ctx, `UPDATE `+n.dead+` SET payload = ?, payload_raw = NULL WHERE id = ?`, string(payload), u); err != nil {
				return err
			}
		}
		if headers != nil {
			if _, err := tx.ExecContext(ctx, `UPDATE `+n.dead+` SET headers = ? WHERE id = ?`, string(headers), u); err != nil {
				return err
			}
		}
		var newPayload, newHeaders sql.NullString
		if err := tx.QueryRowContext(ctx, `SELECT payload, headers FROM `+n.dead+` WHERE id = ?`, u).Scan(&newPayload, &newHeaders); err != nil {
			return err
		}
		before := map[string]any{"headers": rawOrNull(oldHeaders)}
		switch {
		case oldPayload.Valid:
			before["payload"] = json.RawMessage(oldPayload.String)
		case oldRaw != nil:
			before["payload_raw"] = string(oldRaw)
		default:
			before["payload"] = nil
		}
		bb, _ := json.Marshal(before)
		ab, _ := json.Marshal(map[string]any{"payload": rawOrNull(newPayload), "headers": rawOrNull(newHeaders)})
		if err := s.audit(ctx, tx, n, driverkit.RepairAudit(r.Request, u, bb, ab)); err != nil {
			return err
		}
		moved, err := s.moveIn(ctx, tx, n, []string{u}, by, "retry")
		if err != nil {
			return err
		}
		if len(moved) != 1 {
			return fmt.Errorf("dead letter %s: %w", id, outboxdriver.ErrNotFound)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE `+n.requests+" SET state = 'done', total = 1, done = 1, `cursor` = 1, heartbeat_at = "+s.d.Now+", finished_at = "+s.d.Now+` WHERE id = ?`, r.ID); err != nil {
			return err
		}
		return s.audit(ctx, tx, n, driverkit.RepairDoneAudit(r.Request, u))
	})
}

func rawOrNull(s sql.NullString) json.RawMessage {
	if !s.Valid {
		return json.RawMessage("null")
	}
	return json.RawMessage(s.String)
}

// PruneAudit deletes the audit rows of t older than before, the one way
// rows leave the append-only audit table, and records it. On MySQL/MariaDB
// it calls the prune procedure, which does it as the owner (only an
// account granted EXECUTE on it may); on SQLite, and on a MySQL table of
// an earlier version, it sets the mark the audit's guard looks for itself.
func (s Store) PruneAudit(ctx context.Context, t outboxdriver.Table, before time.Time, by outboxdriver.Acting) (int64, error) {
	if s.d.PruneProc != nil {
		n, err := s.pruneProc(ctx, t, before, by)
		if err == nil || !s.d.NoProc(err) {
			if err != nil && s.d.Denied(err) {
				return 0, fmt.Errorf("%s: prune the audit of %s: only the tables' owner (the account that ran migrate) prunes the audit: run it with the owner's URL (docs/security.md): %w", s.d.Driver, t, err)
			}
			if err != nil {
				return 0, s.fail(ctx, t, "prune the audit of", err)
			}
			return n, nil
		}
	}
	var count int64
	err := s.requestTx(ctx, t, "prune the audit of", func(tx *sql.Tx, n tables) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+n.prune+` (id) VALUES (1)`); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM `+n.audit+` WHERE at < ?`, s.d.TimeArg(before))
		if err != nil {
			return err
		}
		if count, err = res.RowsAffected(); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM `+n.prune); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO `+n.audit+` (actor, role, action, detail, reason) VALUES (?, ?, 'audit-prune', ?, ?)`,
			by.Name, by.Role, fmt.Sprintf("deleted %d rows older than %s", count, before.UTC().Format(time.RFC3339Nano)), by.Reason)
		return err
	})
	return count, err
}

// pruneProc calls the prune procedure, outside any transaction: it runs
// in one of its own.
func (s Store) pruneProc(ctx context.Context, t outboxdriver.Table, before time.Time, by outboxdriver.Acting) (int64, error) {
	db, n, err := s.open(t)
	if err != nil {
		return 0, err
	}
	var count int64
	err = db.QueryRowContext(ctx, `CALL `+s.d.PruneProc(n.t)+`(?, ?, ?, ?)`, s.d.TimeArg(before), by.Name, by.Role, by.Reason).Scan(&count)
	return count, err
}
