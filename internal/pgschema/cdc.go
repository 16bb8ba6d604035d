package pgschema

import (
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// CDCNames are the qualified, quoted names of the companions of an outbox
// table that log tailing uses (migrations 4 and on).
type CDCNames struct {
	// State is the _cdc table: a row per replication slot, with its lease
	// and what the slot confirmed.
	State string
	// Parked is the _cdc_parked table: events of aggregates held behind a
	// dead letter, and delayed ones, written out of the stream.
	Parked string
	// Drain is the _cdc_drain table: the rows a new slot does not hold.
	Drain string
	// Fence, Mark and Write are the functions _cdc_fence (records a
	// batch's outcome under the slot's lease), _cdc_mark (records rows
	// published or dead-lettered) and _cdc_write (insert + delete).
	Fence, Mark, Write string
	// Emit is the function _cdc_emit (message mode, version 23), Slot the
	// function _cdc_slot both it and Write call: they refuse to write
	// while no slot of the table's exists.
	Emit, Slot string
}

// CDCNamesOf returns the names of t's log-tailing companions.
func CDCNamesOf(t outboxdriver.Table) CDCNames {
	return CDCNames{
		State:  t.Qualified("_cdc"),
		Parked: t.Qualified("_cdc_parked"),
		Drain:  t.Qualified("_cdc_drain"),
		Fence:  t.Qualified("_cdc_fence"),
		Mark:   t.Qualified("_cdc_mark"),
		Write:  t.Qualified("_cdc_write"),
		Emit:   t.Qualified("_cdc_emit"),
		Slot:   t.Qualified("_cdc_slot"),
	}
}

// SlotStatusSQL reads the slots of t's _cdc companion ($1 NULL: all of
// them, else the one named) with what pg_replication_slots says of each:
// whether it exists and is streamed, the WAL it retains, the LSN it
// confirmed and the WAL past it, its wal_status, and what its streamer
// last recorded of its backlog (schema version 22; read through the row's
// JSON, so that the statement works on older schemas too, where it reads
// NULL). ScanSlotStatus reads a row.
func SlotStatusSQL(t outboxdriver.Table) string {
	return `SELECT c.slot, c.publication, s.slot_name IS NOT NULL, coalesce(s.active, false),
       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn), 0)::bigint,
       coalesce(s.confirmed_flush_lsn::text, ''), coalesce(s.wal_status, ''),
       CASE WHEN c.expires_at > clock_timestamp() THEN coalesce(c.owner, '') ELSE '' END,
       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn), 0)::bigint,
       b.mode, b.events, b.oldest, b.at,
       extract(epoch FROM clock_timestamp() - b.at)::float8,
       extract(epoch FROM clock_timestamp() - b.oldest)::float8
FROM ` + CDCNamesOf(t).State + ` c
CROSS JOIN LATERAL (SELECT j->>'backlog_mode' AS mode, (j->>'backlog_events')::bigint AS events,
                           (j->>'backlog_oldest_commit')::timestamptz AS oldest,
                           (j->>'backlog_recorded_at')::timestamptz AS at
                    FROM (SELECT to_jsonb(c) AS j) r) b
LEFT JOIN pg_replication_slots s ON s.slot_name = c.slot AND s.database = current_database()
WHERE $1::text IS NULL OR c.slot = $1
ORDER BY c.slot`
}

// ScanSlotStatus reads a row of SlotStatusSQL with scan (a row's Scan).
func ScanSlotStatus(scan func(dest ...any) error) (outboxdriver.SlotStatus, error) {
	var s outboxdriver.SlotStatus
	var (
		mode              *string
		events            *int64
		oldest, at        *time.Time
		recAge, oldestAge *float64
	)
	err := scan(&s.Slot, &s.Publication, &s.Exists, &s.Active, &s.LagBytes, &s.ConfirmedLSN, &s.WALStatus, &s.Owner,
		&s.UnconfirmedBytes, &mode, &events, &oldest, &at, &recAge, &oldestAge)
	if err != nil || at == nil {
		return s, err
	}
	b := &outboxdriver.SlotBacklog{RecordedAt: at.UTC(), RecordAge: seconds(recAge)}
	if mode != nil {
		b.Mode = *mode
	}
	if events != nil {
		b.Events = *events
	}
	b.Stale = b.RecordAge > BacklogStaleAfter
	switch {
	case oldest != nil:
		// The oldest event pending when recorded: still pending, unless
		// published since, which a fresh record would say.
		b.OldestCommit, b.OldestAge = oldest.UTC(), seconds(oldestAge)
	case b.Stale && b.Mode != "table":
		// Nothing was pending at the last record, and the streamer
		// records no more: what was written since has waited at most
		// about that long (as far as the streamer had decoded then). In
		// table mode the table's rows say it.
		b.OldestAge, b.OldestEstimated = b.RecordAge, true
	}
	s.Backlog = b
	return s, nil
}

// BacklogRecordEvery is how often a slot's streamer records its backlog
// into the _cdc companion (schema version 22).
const BacklogRecordEvery = time.Second

// BacklogStaleAfter is how old a streamer's record of its backlog may
// be before it is reported stale: the streamer stopped (or cannot reach
// the database), and events written since are not counted.
const BacklogStaleAfter = 5 * BacklogRecordEvery

// seconds is a duration of secs seconds (0 for NULL or negative).
func seconds(secs *float64) time.Duration {
	if secs == nil || *secs <= 0 {
		return 0
	}
	return time.Duration(*secs * float64(time.Second))
}
