package cdc

import (
	"strings"

	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

type queries struct {
	ensure, acquire, renew, release, fence, row string
	// acquireVersions and renewVersions are acquire and renew that also
	// record the streamer's schema version and release ($4 and $5 on
	// acquire, $5 and $6 on renew), with the lease's times and epoch
	// (schema version 25, pgschema.CDCVersionsSince).
	acquireVersions, renewVersions                                string
	deadLetter, deadLetterSeqs, mark, isDeadLetter, held, cleanup string
	// unhold releases the aggregates held behind events ($1); holdDead
	// holds aggregates behind their dead letters ($1), as the polling
	// source does.
	unhold, holdDead string
	// setState records a change of the slot's state: under the lease ($2
	// relay, $3 epoch), or, with both NULL, unfenced (Setup).
	setState [5]string
	// drainList lists the rows a new slot's stream does not hold ($1 slot,
	// $2 its consistent point), inside the snapshot the slot exported;
	// dropLists drops the lists of a slot that are not the one it drains.
	drainList, dropLists string
	// park writes events to the parked table; parkedCounts counts them
	// per aggregate; unpark reads the first of some aggregates' in order;
	// unparked deletes the ones published or dead-lettered. parkNoDelay
	// and unparkNoDelay are park and unpark for a parked table without
	// deliver_at (before schema version 14).
	park, parkedCounts, unpark, unparked string
	parkNoDelay, unparkNoDelay           string
	// backlog records the streamer's backlog under its lease ($4 mode,
	// $5 events, $6 the oldest one's commit time; schema version 22).
	backlog string
}

// parkSQL writes events to the parked table, with their deliver_at
// (schema version 14) when delays is set.
func parkSQL(parked string, delays bool) string {
	col, val, arg, name := ", deliver_at", ", u.da", ", $15::timestamptz[]", ", da"
	if !delays {
		col, val, arg, name = "", "", "", ""
	}
	return `INSERT INTO ` + parked + ` (id, aggregatetype, aggregateid, type, payload, payload_raw, headers,
    tracingspancontext, seq, created_at, bad, is_row, xid, lsn` + col + `)
SELECT u.id, u.at, u.aid, u.ty, u.p, u.raw, u.h, u.tc, u.seq, u.ca, u.bad, u.isrow, u.xid, u.lsn::pg_lsn` + val + `
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::text[], $8::text[],
            $9::bigint[], $10::timestamptz[], $11::text[], $12::boolean[], $13::bigint[], $14::text[]` + arg + `)
  WITH ORDINALITY AS u(id, at, aid, ty, p, raw, h, tc, seq, ca, bad, isrow, xid, lsn` + name + `, i)
ORDER BY u.i
ON CONFLICT (id) DO NOTHING`
}

// unparkSQL reads, per aggregate asked for ($1 types, $2 ids): how many
// events it has parked, when its first parked event not yet due is due
// (NULL: none waits; always NULL without delays, before schema version
// 14), and its events before that one, at most $3, in the order parked
// (none: one row whose event columns are NULL).
func unparkSQL(parked string, delays bool) string {
	stop, due := `min(pos) FILTER (WHERE deliver_at > now())`, `w.deliver_at`
	if !delays {
		stop, due = `NULL::bigint`, `NULL::timestamptz`
	}
	return `SELECT a.t, a.id, c.total, ` + due + `,
       p.id::text, p.aggregatetype, p.aggregateid, p.type, p.payload, p.payload_raw, p.headers,
       p.tracingspancontext, p.seq, p.created_at, p.bad, p.is_row, p.xid
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS a(t, id, i)
CROSS JOIN LATERAL (SELECT count(*) AS total, ` + stop + ` AS stop
                    FROM ` + parked + ` WHERE aggregatetype = a.t AND aggregateid = a.id) c
LEFT JOIN LATERAL (SELECT ` + strings.TrimPrefix(due, "w.") + ` FROM ` + parked + ` WHERE aggregatetype = a.t AND aggregateid = a.id AND pos = c.stop) w ON true
LEFT JOIN LATERAL (SELECT * FROM ` + parked + ` WHERE aggregatetype = a.t AND aggregateid = a.id
                   AND pos < coalesce(c.stop, 9223372036854775807) ORDER BY pos LIMIT $3) p ON true
ORDER BY a.i, p.pos`
}

// slotState is a change of a slot's state in the _cdc companion.
type slotState int

const (
	slotDrained slotState = iota // the rows the slot does not hold were relayed
	slotCreated                  // the slot exists: missing, it is lost
	slotNew                      // a new slot: the table's rows are to be drained
	slotOwned                    // changes nothing: checks the lease
	slotListed                   // the rows to drain are listed ($4 the slot's consistent point, $5 none: drained)
)

func newQueries(t outboxdriver.Table) queries {
	n, c := pgschema.NamesOf(t), pgschema.CDCNamesOf(t)
	cdc, parked := c.State, c.Parked
	q := queries{
		unhold:        pgschema.UnholdSQL(n),
		holdDead:      pgschema.HoldDeadSQL(n, false),
		park:          parkSQL(parked, true),
		parkNoDelay:   parkSQL(parked, false),
		parkedCounts:  `SELECT aggregatetype, aggregateid, count(*) FROM ` + parked + ` GROUP BY 1, 2`,
		unpark:        unparkSQL(parked, true),
		unparkNoDelay: unparkSQL(parked, false),
		unparked:      `DELETE FROM ` + parked + ` WHERE id = ANY($1::uuid[])`,
		ensure:        pgschema.EnsureCDCRowSQL(t),
		acquire: `UPDATE ` + cdc + `
SET owner = $2, epoch = epoch + 1, expires_at = clock_timestamp() + $3 * interval '1 millisecond', updated_at = now()
WHERE slot = $1 AND (owner IS NULL OR expires_at <= clock_timestamp())
RETURNING epoch`,
		renew: `UPDATE ` + cdc + ` SET expires_at = clock_timestamp() + $4 * interval '1 millisecond'
WHERE slot = $1 AND owner = $2 AND epoch = $3
RETURNING epoch`,
		acquireVersions: `UPDATE ` + cdc + `
SET owner = $2, epoch = epoch + 1, expires_at = clock_timestamp() + $3 * interval '1 millisecond', updated_at = now(),
    schema_version = $4, release = $5, leased_at = clock_timestamp(), renewed_at = clock_timestamp(), recorded_epoch = epoch + 1
WHERE slot = $1 AND (owner IS NULL OR expires_at <= clock_timestamp())
RETURNING epoch`,
		renewVersions: `UPDATE ` + cdc + ` SET expires_at = clock_timestamp() + $4 * interval '1 millisecond',
    schema_version = $5, release = $6, renewed_at = clock_timestamp(), recorded_epoch = epoch
WHERE slot = $1 AND owner = $2 AND epoch = $3
RETURNING epoch`,
		release: `UPDATE ` + cdc + ` SET owner = NULL, expires_at = '-infinity' WHERE slot = $1 AND owner = $2 AND epoch = $3`,
		fence:   `SELECT ` + c.Fence + `($1, $2, $3, $4::pg_lsn, $5::pg_lsn)`,
		row:     `SELECT drained, dead_lsn::text, coalesce(drain_lsn::text, '') FROM ` + cdc + ` WHERE slot = $1`,
		setState: [5]string{
			slotDrained: `UPDATE ` + cdc + ` SET drained = true WHERE slot = $1`,
			slotCreated: `UPDATE ` + cdc + ` SET slot_created = true WHERE slot = $1`,
			slotNew:     `UPDATE ` + cdc + ` SET drained = false, confirmed_lsn = NULL, drain_lsn = NULL WHERE slot = $1`,
			slotOwned:   `UPDATE ` + cdc + ` SET updated_at = now() WHERE slot = $1`,
			slotListed:  `UPDATE ` + cdc + ` SET slot_created = true, drain_lsn = $4::pg_lsn, drained = $5 WHERE slot = $1`,
		},
		drainList: `INSERT INTO ` + c.Drain + ` (slot, lsn, id)
SELECT $1, $2::pg_lsn, id FROM ` + n.Table + ` WHERE published_at IS NULL`,
		dropLists: `DELETE FROM ` + c.Drain + ` d WHERE d.slot = $1 AND NOT EXISTS (
    SELECT 1 FROM ` + cdc + ` c WHERE c.slot = d.slot AND NOT c.drained AND c.drain_lsn = d.lsn)`,
		deadLetter: `INSERT INTO ` + n.DeadLetter + ` (id, aggregatetype, aggregateid, type, payload, seq, created_at,
    headers, tracingspancontext, payload_raw, attempts, last_error, held)
SELECT u.id, u.at, u.aid, u.ty, u.p::json, u.seq, u.ca, coalesce(u.h::jsonb, '{}'::jsonb), u.tc, u.raw, u.att, u.err, u.hold
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::timestamptz[],
            $8::text[], $9::text[], $10::bytea[], $11::integer[], $12::text[], $13::boolean[])
  AS u(id, at, aid, ty, p, seq, ca, h, tc, raw, att, err, hold)
ON CONFLICT (id) DO NOTHING`,
		// The seq of each dead letter held under the ids $1.
		deadLetterSeqs: `SELECT id::text, seq FROM ` + n.DeadLetter + ` WHERE id = ANY($1::uuid[])`,
		mark:           `SELECT ` + c.Mark + `($1::uuid[], $2::bigint[], $3, $4::bigint[])`,
		// Whether each event ($1, inserted by transaction $2, 32 bits) is
		// in the dead-letter table, and whether its transaction is visible
		// yet: PostgreSQL sends a transaction a moment before other
		// sessions see it, and until then the dead letter an operator's
		// retry moved back is still there to see (the full xid as in
		// cdc_mark_fn).
		isDeadLetter: `WITH s AS (SELECT pg_current_snapshot() AS snap), t AS (SELECT snap, pg_snapshot_xmax(snap)::text::bigint AS top FROM s)
SELECT c.id::text,
       EXISTS (SELECT 1 FROM ` + n.DeadLetter + ` d WHERE d.id = c.id),
       c.x = 0 OR pg_visible_in_snapshot((CASE
           WHEN (((t.top >> 32) << 32) | c.x) < t.top THEN ((t.top >> 32) << 32) | c.x
           ELSE (((t.top >> 32) - 1) << 32) | c.x END)::text::xid8, t.snap)
FROM unnest($1::uuid[], $2::bigint[]) AS c(id, x), t`,
		backlog: `UPDATE ` + cdc + ` SET backlog_mode = $4, backlog_events = $5, backlog_oldest_commit = $6, backlog_recorded_at = now()
WHERE slot = $1 AND owner = $2 AND epoch = $3`,
		held:    `SELECT aggregatetype, aggregateid, event_id::text FROM ` + n.Held + ` WHERE reason = 'dead-lettered'`,
		cleanup: pgschema.CleanupSQL(n.Table, `published_at < clock_timestamp() - $1 * interval '1 millisecond'`, "$2"),
	}
	for i, sql := range q.setState {
		// A stale streamer changes nothing.
		q.setState[i] = sql + ` AND ($2::text IS NULL OR (owner = $2 AND epoch = $3::bigint AND expires_at > clock_timestamp()))`
	}
	return q
}
