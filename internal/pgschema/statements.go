package pgschema

import (
	"errors"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/outboxdriver"
)

// The statements and arguments the pgx driver's polling source and log
// tailing (package outboxpgx/cdc) share.

// HasColumnSQL reports whether table $1 (qualified and quoted) has column
// $2.
const HasColumnSQL = `SELECT EXISTS (SELECT 1 FROM pg_attribute
WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped)`

// CleanupSQL deletes, from table, the oldest limit published rows that
// match where. They are found by ctid (a TID scan), which names a row
// only within one table: table must not be partitioned (on a table
// partitioned by time the polling source cleans up the default partition,
// a plain table). Checking where again on the rows found would make it
// safe there, but lets the planner read the published_at index instead of
// the TIDs, every call from the start: 2,500 rows/s instead of 230,000.
func CleanupSQL(table, where, limit string) string {
	return `DELETE FROM ` + table + ` WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM ` + table + `
    WHERE ` + where + `
    ORDER BY published_at
    LIMIT ` + limit + `))`
}

// UnholdSQL releases the aggregates held behind the events $1 (uuid[]).
func UnholdSQL(n driverkit.Names) string {
	return `DELETE FROM ` + n.Held + ` WHERE event_id = ANY($1::uuid[])`
}

// HoldDeadSQL holds the aggregates of the dead letters $1 (uuid[]) behind
// them, or records that an aggregate held behind one of them (retrying)
// is now held behind its dead letter.
//
// With justMoved, only dead letters this transaction wrote count: an
// event the dead letters did not take because they hold another with its
// id (the polling source's deadLetter statement) must not hold that other
// event's aggregate.
func HoldDeadSQL(n driverkit.Names, justMoved bool) string {
	moved := ""
	if justMoved {
		moved = ` AND dead_lettered_at >= now()`
	}
	return `INSERT INTO ` + n.Held + ` (aggregatetype, aggregateid, seq, event_id, reason)
SELECT aggregatetype, aggregateid, seq, id, 'dead-lettered' FROM ` + n.DeadLetter + ` WHERE id = ANY($1::uuid[])` + moved + `
ON CONFLICT (aggregatetype, aggregateid) DO UPDATE SET reason = excluded.reason, held_at = now()
WHERE ` + n.Held + `.event_id = excluded.event_id`
}

// UUIDArray returns ids as binary UUIDs, which pgx sends as a uuid[]
// without first trying (and failing) other encodings of a string; ids
// that do not parse are passed on as text for the server to judge.
func UUIDArray(ids []string) any {
	out := make([][16]byte, len(ids))
	for i, id := range ids {
		u, err := uuid.Parse(id)
		if err != nil {
			return ids
		}
		out[i] = u
	}
	return out
}

// NullText maps nil or empty to SQL NULL, anything else to text.
func NullText(b []byte) *string {
	if len(b) == 0 {
		return nil
	}
	s := string(b)
	return &s
}

// DuplicateID returns err as the *outboxdriver.DuplicateIDError of a write
// of rows into t when it is PostgreSQL's unique violation on t (the key on
// id, schema version 26), err otherwise. It reads pgx's error and, through
// SQLState, any driver's.
func DuplicateID(err error, t outboxdriver.Table, rows []outboxdriver.Row) error {
	if err == nil {
		return nil
	}
	t = t.WithDefaults()
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		dup := pgErr.Code == uniqueViolation && pgErr.TableName == t.Name && pgErr.SchemaName == t.Schema
		return driverkit.DuplicateID(err, dup, pgErr.Detail, t, rows)
	}
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) && coded.SQLState() == uniqueViolation && strings.Contains(err.Error(), t.Name+"_pkey") {
		return driverkit.DuplicateID(err, true, err.Error(), t, rows)
	}
	return err
}

// uniqueViolation is PostgreSQL's SQLSTATE of a unique violation.
const uniqueViolation = "23505"
