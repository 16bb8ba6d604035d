package cdc

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Stats is what a CDC source knows of its slot and its progress: the
// slot as the database sees it, and the relay's lag behind the commits it
// received.
type Stats struct {
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
func (s *Source) Stats(ctx context.Context) (Stats, error) {
	st := Stats{SlotStatus: outboxdriver.SlotStatus{Slot: s.cfg.Slot, Publication: s.cfg.Publication}}
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
	rows, err := s.pool.Query(ctx, pgschema.SlotStatusSQL(s.base.Table), s.cfg.Slot)
	var slots []outboxdriver.SlotStatus
	if err == nil {
		slots, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (outboxdriver.SlotStatus, error) {
			return pgschema.ScanSlotStatus(row.Scan)
		})
	}
	if err != nil {
		return st, fmt.Errorf("outboxpgx: read replication slot %s: %w", s.cfg.Slot, migrateHint(err, s.base.Table))
	}
	if len(slots) == 1 {
		st.SlotStatus = slots[0]
	}
	return st, nil
}
