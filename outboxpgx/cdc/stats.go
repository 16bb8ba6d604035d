package outboxpgx

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/outboxdriver"
)

// slotStatusSQL reads the slots of a table's _cdc companion ($1 NULL: all
// of them, else the one named) with what pg_replication_slots says of
// each: whether it exists and is streamed, the WAL it retains, the LSN it
// confirmed and its wal_status.
func slotStatusSQL(t outboxdriver.Table) string {
	return `SELECT c.slot, c.publication, s.slot_name IS NOT NULL, coalesce(s.active, false),
       coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn), 0)::bigint,
       coalesce(s.confirmed_flush_lsn::text, ''), coalesce(s.wal_status, ''),
       CASE WHEN c.expires_at > clock_timestamp() THEN coalesce(c.owner, '') ELSE '' END
FROM ` + t.Qualified("_cdc") + ` c
LEFT JOIN pg_replication_slots s ON s.slot_name = c.slot AND s.database = current_database()
WHERE $1::text IS NULL OR c.slot = $1
ORDER BY c.slot`
}

// slotStatuses runs slotStatusSQL; slot "" reads every slot.
func slotStatuses(ctx context.Context, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, t outboxdriver.Table, slot string) ([]outboxdriver.SlotStatus, error) {
	var arg *string
	if slot != "" {
		arg = &slot
	}
	rows, err := db.Query(ctx, slotStatusSQL(t), arg)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (outboxdriver.SlotStatus, error) {
		var s outboxdriver.SlotStatus
		err := row.Scan(&s.Slot, &s.Publication, &s.Exists, &s.Active, &s.LagBytes, &s.ConfirmedLSN, &s.WALStatus, &s.Owner)
		return s, err
	})
}

// CDCStats is what a CDC source knows of its slot and its progress: the
// slot as the database sees it, and the relay's lag behind the commits it
// received.
type CDCStats struct {
	outboxdriver.SlotStatus
	// Streaming says this source streams the slot now.
	Streaming bool
	// Pending counts events received from the stream (or read from the
	// table) and not yet published or dead-lettered.
	Pending int
	// Lag is how long ago the oldest transaction with an event still
	// pending committed: commit to publish, as it stands now; 0 when
	// nothing is pending.
	Lag time.Duration
	// Republished counts the events this source published past the
	// slot's confirmed LSN before its stream ended (a lost connection or
	// lease): the next stream read them again, and they were published
	// again. Relays confirm the LSN in commit order, so events of other
	// partitions done ahead of a slower one are delivered twice then.
	Republished int
}

// Stats reads the slot from the database and the source's progress from
// memory. A slot not set up yet reads as not existing.
func (s *CDCSource) Stats(ctx context.Context) (CDCStats, error) {
	st := CDCStats{SlotStatus: outboxdriver.SlotStatus{Slot: s.cfg.Slot, Publication: s.cfg.Publication}}
	s.mu.Lock()
	st.Streaming = s.st != nil && !s.st.ended()
	st.Pending = s.queue.pending
	st.Republished = s.republish
	if len(s.queue.txns) > 0 {
		// The queue drops the transactions done at its front: the first
		// one is the oldest with an event pending.
		t := s.queue.txns[0]
		at := t.commit
		if at.IsZero() && len(t.events) > 0 {
			at = t.events[0].CreatedAt // a row read from the table
		}
		if !at.IsZero() {
			st.Lag = max(0, time.Since(at))
		}
	}
	s.mu.Unlock()
	slots, err := slotStatuses(ctx, s.pool, s.Table, s.cfg.Slot)
	if err != nil {
		return st, fmt.Errorf("outboxpgx: read replication slot %s: %w", s.cfg.Slot, migrateHint(err, s.Table))
	}
	if len(slots) == 1 {
		st.SlotStatus = slots[0]
	}
	return st, nil
}
