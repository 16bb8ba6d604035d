package pgschema

import "github.com/outboxkit/outbox/outboxdriver"

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
// confirmed and its wal_status. ScanSlotStatus reads a row.
func SlotStatusSQL(t outboxdriver.Table) string {
	return `SELECT c.slot, c.publication, s.slot_name IS NOT NULL, coalesce(s.active, false),
       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn), 0)::bigint,
       coalesce(s.confirmed_flush_lsn::text, ''), coalesce(s.wal_status, ''),
       CASE WHEN c.expires_at > clock_timestamp() THEN coalesce(c.owner, '') ELSE '' END
FROM ` + CDCNamesOf(t).State + ` c
LEFT JOIN pg_replication_slots s ON s.slot_name = c.slot AND s.database = current_database()
WHERE $1::text IS NULL OR c.slot = $1
ORDER BY c.slot`
}

// ScanSlotStatus reads a row of SlotStatusSQL with scan (a row's Scan).
func ScanSlotStatus(scan func(dest ...any) error) (outboxdriver.SlotStatus, error) {
	var s outboxdriver.SlotStatus
	err := scan(&s.Slot, &s.Publication, &s.Exists, &s.Active, &s.LagBytes, &s.ConfirmedLSN, &s.WALStatus, &s.Owner)
	return s, err
}
