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

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// requestCols are the columns scanRequest reads, in its order.
const requestCols = `id::text, kind, state, requester, requester_role, reason, params::text, created_at, expires_at,
decided_by, decided_role, decided_at, decision_note, executor, epoch, heartbeat_at, started_at, finished_at,
total, done, cursor, error`

func scanRequest(r pgx.Row) (outboxdriver.Request, error) {
	var q outboxdriver.Request
	var params string
	err := r.Scan(&q.ID, &q.Kind, &q.State, &q.Requester, &q.RequesterRole, &q.Reason, &params, &q.CreatedAt, &q.ExpiresAt,
		&q.DecidedBy, &q.DecidedRole, &q.DecidedAt, &q.DecisionNote, &q.Executor, &q.Epoch, &q.HeartbeatAt, &q.StartedAt, &q.FinishedAt,
		&q.Total, &q.Done, &q.Cursor, &q.Error)
	q.Params = json.RawMessage(params)
	return q, err
}

// requestAudit inserts one audit row about a request (and, for a repair,
// its dead letter) inside tx.
func (d *Driver) requestAudit(ctx context.Context, tx pgx.Tx, t outboxdriver.Table, r outboxdriver.AuditRecord) error {
	var event *uuid.UUID
	if r.EventID != "" {
		u, err := uuid.Parse(r.EventID)
		if err != nil {
			return fmt.Errorf("outboxpgx: audit of %s: event id %q is not a UUID", t, r.EventID)
		}
		event = &u
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+t.Qualified("_audit")+` (actor, role, action, event_id, detail, reason, request_id, before, after)
VALUES ($1, $2, $3, $4, $5, $6, $7::uuid, $8::jsonb, $9::jsonb)`,
		r.Actor, r.Role, r.Action, event, r.Detail, r.Reason, nullText(r.RequestID), nullJSON(r.Before), nullJSON(r.After))
	return err
}

func nullText(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func nullJSON(b json.RawMessage) *string {
	if len(b) == 0 {
		return nil
	}
	s := string(b)
	return &s
}

func (d *Driver) inTx(ctx context.Context, t outboxdriver.Table, what string, fn func(pgx.Tx) error) error {
	if _, err := d.names(t); err != nil {
		return err
	}
	err := pgx.BeginFunc(ctx, d.pool, fn)
	if err != nil && !errors.Is(err, outboxdriver.ErrNotFound) && !errors.Is(err, outboxdriver.ErrRequestState) {
		return d.fail(ctx, t, what, err)
	}
	return err
}

// CreateRequest stores r as a pending request and audits it as by.
func (d *Driver) CreateRequest(ctx context.Context, t outboxdriver.Table, r outboxdriver.Request, by outboxdriver.Acting) error {
	return d.inTx(ctx, t, "create a request on", func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+t.Qualified("_requests")+` (id, kind, requester, requester_role, reason, params, expires_at)
VALUES ($1, $2, $3, $4, $5, $6::json, $7)`, r.ID, r.Kind, r.Requester, r.RequesterRole, r.Reason, string(r.Params), r.ExpiresAt); err != nil {
			return err
		}
		return d.requestAudit(ctx, tx, t, driverkit.CreatedAudit(r, by))
	})
}

// GetRequest returns one request of t.
func (d *Driver) GetRequest(ctx context.Context, t outboxdriver.Table, id string) (outboxdriver.Request, error) {
	if _, err := d.names(t); err != nil {
		return outboxdriver.Request{}, err
	}
	r, err := scanRequest(d.pool.QueryRow(ctx, `SELECT `+requestCols+` FROM `+t.Qualified("_requests")+` WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return r, fmt.Errorf("outboxpgx: request %s of %s: %w", id, t, outboxdriver.ErrNotFound)
	}
	if err != nil {
		return r, d.fail(ctx, t, "request of", err)
	}
	return r, nil
}

// ListRequests lists the requests of t, newest first.
func (d *Driver) ListRequests(ctx context.Context, t outboxdriver.Table, state string, limit int) ([]outboxdriver.Request, error) {
	if _, err := d.names(t); err != nil {
		return nil, err
	}
	rows, err := d.pool.Query(ctx, `SELECT `+requestCols+` FROM `+t.Qualified("_requests")+`
WHERE ($1 = '' OR state = $1) ORDER BY created_at DESC, id LIMIT $2`, state, limit)
	if err != nil {
		return nil, d.fail(ctx, t, "requests of", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outboxdriver.Request, error) { return scanRequest(r) })
	if err != nil {
		return nil, d.fail(ctx, t, "requests of", err)
	}
	return out, nil
}

// stateErr explains why request id could not move: it does not exist, or
// it is in another state.
func stateErr(ctx context.Context, tx pgx.Tx, t outboxdriver.Table, id string) error {
	var state string
	var expired bool
	err := tx.QueryRow(ctx, `SELECT state, expires_at <= clock_timestamp() FROM `+t.Qualified("_requests")+` WHERE id = $1`, id).Scan(&state, &expired)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("request %s: %w", id, outboxdriver.ErrNotFound)
	}
	if err != nil {
		return err
	}
	if expired && (state == outboxdriver.StatePending || state == outboxdriver.StateApproved) {
		state = outboxdriver.StateExpired
	}
	return fmt.Errorf("request %s is %s: %w", id, state, outboxdriver.ErrRequestState)
}

// DecideRequest approves, rejects or cancels a request.
func (d *Driver) DecideRequest(ctx context.Context, t outboxdriver.Table, id, to string, by outboxdriver.Acting) (outboxdriver.Request, error) {
	var out outboxdriver.Request
	var q string
	switch to {
	case outboxdriver.StateApproved, outboxdriver.StateRejected:
		// Never the requester's own: ops refuses it first, with a message.
		q = `UPDATE ` + t.Qualified("_requests") + ` SET state = $2, decided_by = $3, decided_role = $4, decided_at = clock_timestamp(), decision_note = $5
WHERE id = $1 AND state = 'pending' AND expires_at > clock_timestamp() AND requester <> $3
RETURNING ` + requestCols
	case outboxdriver.StateCancelled:
		q = `UPDATE ` + t.Qualified("_requests") + ` SET state = $2, finished_at = clock_timestamp(),
    error = 'cancelled by ' || $3 || CASE WHEN $5 = '' THEN '' ELSE ': ' || $5 END
WHERE id = $1 AND state IN ('pending', 'approved', 'executing') AND $4 <> ''
RETURNING ` + requestCols
	default:
		return out, fmt.Errorf("outboxpgx: request %s: cannot move to %q", id, to)
	}
	err := d.inTx(ctx, t, "decide a request on", func(tx pgx.Tx) error {
		var err error
		out, err = scanRequest(tx.QueryRow(ctx, q, id, to, by.Name, by.Role, by.Reason))
		if errors.Is(err, pgx.ErrNoRows) {
			return stateErr(ctx, tx, t, id)
		}
		if err != nil {
			return err
		}
		action := map[string]string{outboxdriver.StateApproved: "approve", outboxdriver.StateRejected: "reject", outboxdriver.StateCancelled: "cancel"}[to]
		return d.requestAudit(ctx, tx, t, outboxdriver.AuditRecord{
			Actor: by.Name, Action: action, Detail: out.Kind + " requested by " + out.Requester,
			Role: by.Role, Reason: by.Reason, RequestID: id,
		})
	})
	return out, err
}

// ExpireRequests marks the requests past their expiry expired.
func (d *Driver) ExpireRequests(ctx context.Context, t outboxdriver.Table, by outboxdriver.Acting) ([]string, error) {
	var ids []string
	err := d.inTx(ctx, t, "expire requests of", func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `WITH gone AS (
    UPDATE `+t.Qualified("_requests")+` SET state = 'expired', finished_at = clock_timestamp()
    WHERE state IN ('pending', 'approved') AND expires_at <= clock_timestamp()
    RETURNING id, kind, requester, state, expires_at
), audit AS (
    INSERT INTO `+t.Qualified("_audit")+` (actor, role, action, detail, reason, request_id)
    SELECT $1, $2, 'expire', g.kind || ' requested by ' || g.requester || ' was not carried out by ' || g.expires_at, '', g.id FROM gone g
)
SELECT id::text FROM gone`, by.Name, by.Role)
		if err != nil {
			return err
		}
		ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	return ids, err
}

// ClaimRequest makes executor the executor of an approved request, or
// takes over an executing one whose executor went quiet.
func (d *Driver) ClaimRequest(ctx context.Context, t outboxdriver.Table, id, executor string, stale time.Duration) (outboxdriver.Request, error) {
	var out outboxdriver.Request
	err := d.inTx(ctx, t, "execute a request on", func(tx pgx.Tx) error {
		var err error
		out, err = scanRequest(tx.QueryRow(ctx, `UPDATE `+t.Qualified("_requests")+`
SET state = 'executing', executor = $2, epoch = epoch + 1, heartbeat_at = clock_timestamp(),
    started_at = coalesce(started_at, clock_timestamp())
WHERE id = $1 AND ((state = 'approved' AND expires_at > clock_timestamp())
                OR (state = 'executing' AND heartbeat_at < clock_timestamp() - $3 * interval '1 millisecond'))
RETURNING `+requestCols, id, executor, stale.Milliseconds()))
		if errors.Is(err, pgx.ErrNoRows) {
			return stateErr(ctx, tx, t, id)
		}
		if err != nil {
			return err
		}
		return d.requestAudit(ctx, tx, t, driverkit.ExecuteAudit(out, executor))
	})
	return out, err
}

// lockExecuting locks request id if executor holds it at epoch.
func lockExecuting(ctx context.Context, tx pgx.Tx, t outboxdriver.Table, id, executor string, epoch int64) (outboxdriver.Request, error) {
	r, err := scanRequest(tx.QueryRow(ctx, `SELECT `+requestCols+` FROM `+t.Qualified("_requests")+`
WHERE id = $1 AND state = 'executing' AND executor = $2 AND epoch = $3 FOR UPDATE`, id, executor, epoch))
	if errors.Is(err, pgx.ErrNoRows) {
		return r, stateErr(ctx, tx, t, id)
	}
	return r, err
}

// FinishRequest ends an execution: done, or failed with msg.
func (d *Driver) FinishRequest(ctx context.Context, t outboxdriver.Table, id, executor string, epoch int64, state, msg string) error {
	if state != outboxdriver.StateDone && state != outboxdriver.StateFailed {
		return fmt.Errorf("outboxpgx: request %s: finish as %q", id, state)
	}
	return d.inTx(ctx, t, "finish a request on", func(tx pgx.Tx) error {
		r, err := lockExecuting(ctx, tx, t, id, executor, epoch)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE `+t.Qualified("_requests")+` SET state = $2, error = $3, finished_at = clock_timestamp() WHERE id = $1`,
			id, state, msg); err != nil {
			return err
		}
		return d.requestAudit(ctx, tx, t, driverkit.FinishAudit(r, state, msg))
	})
}

// replayWhere is the selection of a replay over the kept rows of alias o;
// its arguments start at $first, in the order of replayArgs.
func replayWhere(first int) string {
	a := func(k int) string { return fmt.Sprintf("$%d", first+k) }
	return `o.published_at IS NOT NULL
  AND (` + a(0) + `::timestamptz IS NULL OR o.published_at >= ` + a(0) + `)
  AND (` + a(1) + `::timestamptz IS NULL OR o.published_at < ` + a(1) + `)
  AND (` + a(2) + ` = '' OR o.aggregatetype = ` + a(2) + `)
  AND (` + a(3) + ` = '' OR o.aggregateid = ` + a(3) + `)
  AND (` + a(4) + ` = '' OR o.type = ` + a(4) + `)
  AND (` + a(5) + `::text[] IS NULL OR CASE ` + a(6) + `::text
        WHEN 'aggregatetype' THEN o.aggregatetype WHEN 'aggregateid' THEN o.aggregateid
        WHEN 'type' THEN o.type WHEN 'id' THEN o.id::text END = ANY(` + a(5) + `::text[]))`
}

func replayArgs(f outboxdriver.ReplayFilter) []any {
	var values []string
	if f.RoutedColumn != "" {
		values = f.RoutedValues
		if values == nil {
			values = []string{}
		}
	}
	return []any{timeArg(f.Since), timeArg(f.Until), f.AggregateType, f.AggregateID, f.Type, values, f.RoutedColumn}
}

// HasPublished reports whether t keeps any published row.
func (d *Driver) HasPublished(ctx context.Context, t outboxdriver.Table) (bool, error) {
	if _, err := d.names(t); err != nil {
		return false, err
	}
	var ok bool
	err := d.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+t.Qualified("")+` WHERE published_at IS NOT NULL)`).Scan(&ok)
	if err != nil {
		return false, d.fail(ctx, t, "published rows of", err)
	}
	return ok, nil
}

const replayEventCols = `o.id::text, o.seq, o.aggregatetype, o.aggregateid, o.type, o.created_at, o.published_at`

// PreviewReplay counts the events f selects and returns the first limit.
func (d *Driver) PreviewReplay(ctx context.Context, t outboxdriver.Table, f outboxdriver.ReplayFilter, limit int) (int64, []outboxdriver.ReplayEvent, error) {
	if _, err := d.names(t); err != nil {
		return 0, nil, err
	}
	var n int64
	args := replayArgs(f)
	if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM `+t.Qualified("")+` o WHERE `+replayWhere(1), args...).Scan(&n); err != nil {
		return 0, nil, d.fail(ctx, t, "preview a replay of", err)
	}
	rows, err := d.pool.Query(ctx, `SELECT `+replayEventCols+` FROM `+t.Qualified("")+` o WHERE `+replayWhere(2)+` ORDER BY o.seq LIMIT $1`,
		append([]any{limit}, args...)...)
	if err != nil {
		return 0, nil, d.fail(ctx, t, "preview a replay of", err)
	}
	evs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[outboxdriver.ReplayEvent])
	if err != nil {
		return 0, nil, d.fail(ctx, t, "preview a replay of", err)
	}
	return n, evs, nil
}

// RoutedValues lists distinct values of column among the events f selects.
func (d *Driver) RoutedValues(ctx context.Context, t outboxdriver.Table, f outboxdriver.ReplayFilter, column string, limit int) ([]string, error) {
	if _, err := d.names(t); err != nil {
		return nil, err
	}
	expr := map[string]string{"aggregatetype": "o.aggregatetype", "aggregateid": "o.aggregateid", "type": "o.type", "id": "o.id::text"}[column]
	if expr == "" {
		return nil, fmt.Errorf("outboxpgx: cannot select events by the destination routed from %q", column)
	}
	rows, err := d.pool.Query(ctx, `SELECT DISTINCT `+expr+` FROM `+t.Qualified("")+` o WHERE `+replayWhere(2)+` LIMIT $1`,
		append([]any{limit}, replayArgs(f)...)...)
	if err != nil {
		return nil, d.fail(ctx, t, "destinations of", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// ReplayBatch re-enqueues the next events of a replay.
func (d *Driver) ReplayBatch(ctx context.Context, t outboxdriver.Table, b outboxdriver.ReplayBatch) (int, bool, error) {
	if b.Limit <= 0 {
		return 0, false, fmt.Errorf("outboxpgx: replay batch of %s: limit %d", t, b.Limit)
	}
	var n int
	var more bool
	err := d.inTx(ctx, t, "replay events of", func(tx pgx.Tx) error {
		r, err := lockExecuting(ctx, tx, t, b.Request, b.Executor, b.Epoch)
		if err != nil {
			return err
		}
		// The rows are found again by ctid (stable while this transaction
		// holds their locks): the table has no index on id.
		var ids, ctids []string
		var seqs []int64
		rows, err := tx.Query(ctx, `SELECT o.id::text, o.seq, o.ctid::text FROM `+t.Qualified("")+` o
WHERE o.seq > $1 AND `+replayWhere(3)+` ORDER BY o.seq LIMIT $2
FOR UPDATE OF o`, append([]any{r.Cursor, b.Limit + 1}, replayArgs(b.Filter)...)...)
		if err != nil {
			return err
		}
		for rows.Next() {
			var id, ctid string
			var seq int64
			if err := rows.Scan(&id, &seq, &ctid); err != nil {
				rows.Close()
				return err
			}
			ids, seqs, ctids = append(ids, id), append(seqs, seq), append(ctids, ctid)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if len(ids) > b.Limit {
			ids, seqs, ctids, more = ids[:b.Limit], seqs[:b.Limit], ctids[:b.Limit], true
		}
		n = len(ids)
		if n > 0 {
			newIDs := make([]string, n)
			for i, id := range ids {
				newIDs[i] = id
				if b.NewIDs {
					newIDs[i] = uuid.Must(uuid.NewV7()).String()
				}
			}
			// A ctid names a row within one table only: seq, unique, keeps
			// a partitioned table's other partitions out.
			src, where := t.Qualified(""), `WHERE o.ctid = ANY($5::text[]::tid[]) AND o.seq = ANY($6::bigint[])`
			if !b.NewIDs {
				// The copy keeps the id: it replaces the kept original.
				src, where = "gone", ""
			}
			tag, err := tx.Exec(ctx, `WITH gone AS (
    DELETE FROM `+t.Qualified("")+` WHERE $3 AND ctid = ANY($5::text[]::tid[]) AND seq = ANY($6::bigint[]) RETURNING *
)
INSERT INTO `+t.Qualified("")+` (id, aggregatetype, aggregateid, type, payload, headers, tracingspancontext, payload_raw)
SELECT u.new_id, o.aggregatetype, o.aggregateid, o.type, o.payload,
       o.headers || jsonb_build_object('outbox-replay-id', $4::text)
                 || CASE WHEN $3 THEN '{}'::jsonb ELSE jsonb_build_object('outbox-replay-of', o.id::text) END,
       o.tracingspancontext, o.payload_raw
FROM unnest($1::uuid[], $2::uuid[]) WITH ORDINALITY AS u(id, new_id, ord)
JOIN `+src+` o ON o.id = u.id
`+where+`
ORDER BY u.ord`, pgschema.UUIDArray(ids), pgschema.UUIDArray(newIDs), !b.NewIDs, b.Request, ctids, seqs)
			if err != nil {
				return err
			}
			if int(tag.RowsAffected()) != n {
				return fmt.Errorf("replay batch: %d of %d events re-enqueued (a row changed meanwhile); nothing of this batch is applied", tag.RowsAffected(), n)
			}
		}
		cursor := r.Cursor
		if n > 0 {
			cursor = seqs[n-1]
		}
		_, err = tx.Exec(ctx, `UPDATE `+t.Qualified("_requests")+` SET cursor = $2, done = done + $3, heartbeat_at = clock_timestamp() WHERE id = $1`,
			b.Request, cursor, n)
		return err
	})
	if err != nil {
		return 0, false, err
	}
	return n, more, nil
}

// SetRequestTotal records how many events an execution found.
func (d *Driver) SetRequestTotal(ctx context.Context, t outboxdriver.Table, id string, total int64) error {
	if _, err := d.names(t); err != nil {
		return err
	}
	if _, err := d.pool.Exec(ctx, `UPDATE `+t.Qualified("_requests")+` SET total = $2 WHERE id = $1 AND total IS NULL`, id, total); err != nil {
		return d.fail(ctx, t, "request of", err)
	}
	return nil
}

// RepairDeadLetter replaces a dead letter's payload and headers and moves
// it back into the outbox, as the request's execution.
func (d *Driver) RepairDeadLetter(ctx context.Context, t outboxdriver.Table, req, executor string, epoch int64, id string, payload, headers json.RawMessage, by outboxdriver.Acting) error {
	return d.inTx(ctx, t, "repair a dead letter of", func(tx pgx.Tx) error {
		r, err := lockExecuting(ctx, tx, t, req, executor, epoch)
		if err != nil {
			return err
		}
		var oldPayload, oldHeaders *string
		var oldRaw []byte
		err = tx.QueryRow(ctx, `SELECT payload::text, payload_raw, headers::text FROM `+t.Qualified("_dead_letter")+` WHERE id = $1 FOR UPDATE`, id).
			Scan(&oldPayload, &oldRaw, &oldHeaders)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("dead letter %s (retried or discarded meanwhile): %w", id, outboxdriver.ErrNotFound)
		}
		if err != nil {
			return err
		}
		var newPayload, newHeaders string
		err = tx.QueryRow(ctx, `UPDATE `+t.Qualified("_dead_letter")+`
SET payload = coalesce($2::json, payload), payload_raw = CASE WHEN $2::json IS NULL THEN payload_raw END,
    headers = coalesce($3::jsonb, headers)
WHERE id = $1 RETURNING coalesce(payload::text, 'null'), headers::text`, id, nullJSON(payload), nullJSON(headers)).Scan(&newPayload, &newHeaders)
		if err != nil {
			return err
		}
		before := map[string]any{"headers": rawOrNull(oldHeaders)}
		if oldPayload != nil {
			before["payload"] = json.RawMessage(*oldPayload)
		} else if oldRaw != nil {
			before["payload_raw"] = string(oldRaw)
		} else {
			before["payload"] = nil
		}
		bb, _ := json.Marshal(before)
		ab, _ := json.Marshal(map[string]any{"payload": json.RawMessage(newPayload), "headers": json.RawMessage(newHeaders)})
		if err := d.requestAudit(ctx, tx, t, driverkit.RepairAudit(r, id, bb, ab)); err != nil {
			return err
		}
		moved, err := d.retryDeadLettersOn(ctx, tx, t, []string{id}, by)
		if err != nil {
			return err
		}
		if len(moved) != 1 {
			return fmt.Errorf("dead letter %s: %w", id, outboxdriver.ErrNotFound)
		}
		_, err = tx.Exec(ctx, `UPDATE `+t.Qualified("_requests")+` SET state = 'done', total = 1, done = 1, cursor = 1,
    heartbeat_at = clock_timestamp(), finished_at = clock_timestamp() WHERE id = $1`, req)
		if err != nil {
			return err
		}
		return d.requestAudit(ctx, tx, t, driverkit.RepairDoneAudit(r, id))
	})
}

func rawOrNull(s *string) json.RawMessage {
	if s == nil {
		return json.RawMessage("null")
	}
	return json.RawMessage(*s)
}

// PruneAudit deletes the audit rows of t older than before, through the
// one function the audit table's guard lets delete, and records it. The
// function runs as the table's owner, and only roles granted EXECUTE on it
// may call it (schema version 19; docs/security.md).
func (d *Driver) PruneAudit(ctx context.Context, t outboxdriver.Table, before time.Time, by outboxdriver.Acting) (int64, error) {
	if _, err := d.names(t); err != nil {
		return 0, err
	}
	var n int64
	err := d.pool.QueryRow(ctx, `SELECT `+t.Qualified("_audit_prune")+`($1, $2, $3, $4)`, before, by.Name, by.Role, by.Reason).Scan(&n)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return 0, fmt.Errorf("outboxpgx: prune the audit of %s: only the table's owner prunes the audit: run it with the owner's URL (docs/security.md): %w", t, err)
	}
	if err != nil {
		return 0, d.fail(ctx, t, "prune the audit of", err)
	}
	return n, nil
}
