package cdc

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// drain queues the rows that were in the table when the slot was made (the
// slot's stream holds only what commits after it), page by page in seq
// order, as transactions without an LSN ahead of everything the stream
// brings: the stream starts once they are read, its events of the same
// aggregates wait behind them, and the slot confirms nothing until they
// are done (held ones included: they stay in the table, and a restart
// reads them again). listed is the slot's consistent point when the rows
// were listed at its creation (createSlot): then it reads exactly those,
// each of which the stream does not hold. Else (a slot made by hand, or
// before the list existed) it reads every unpublished row, and rows
// committed while it reads may come again from the stream: duplicates,
// never a loss.
//
// Every page reads one snapshot, taken after the slot was made: a row is
// either in it (read here) or committed after it (only in the stream,
// which comes after every row read here). Pages with snapshots of their
// own would skip a row whose seq an earlier page passed before its
// transaction committed, and a later row of its aggregate read by a later
// page would go out first. The snapshot is held (a read-only transaction)
// until the last page was read. The reader marks the slot drained once
// every row was published or dead-lettered (markDrained).
func (st *stream) drain(ctx context.Context, listed string) error {
	s := st.src
	s.base.Log.Info("outboxpgx: relaying the rows already in the table before streaming", "slot", s.cfg.Slot, "listed", listed != "")
	sql := `SELECT id::text, aggregatetype, aggregateid, type, payload::text, payload_raw, headers::text,
       coalesce(tracingspancontext, ''), created_at, seq,
       (to_jsonb(o) ->> 'deliver_at')::timestamptz
FROM ` + s.names.Table + ` o WHERE published_at IS NULL AND seq > $1
  AND ($3::pg_lsn IS NULL OR EXISTS (SELECT 1 FROM ` + s.cn.Drain + ` d
                                     WHERE d.slot = $4 AND d.lsn = $3::pg_lsn AND d.id = o.id))
ORDER BY seq LIMIT $2`
	var list *string
	if listed != "" {
		list = &listed
	}
	snap, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("outboxpgx: drain %s: %w", s.base.Table, err)
	}
	defer snap.Rollback(context.WithoutCancel(ctx))
	st.markUp() // reads the table
	var last int64 = -1 << 63
	for {
		room, err := st.waitRoom(ctx)
		if err != nil {
			return err
		}
		t := &txn{drain: true}
		rows, err := snap.Query(ctx, sql, last, min(drainPage, room), list, s.cfg.Slot)
		if err != nil {
			return fmt.Errorf("outboxpgx: drain %s: %w", s.base.Table, err)
		}
		for rows.Next() {
			e := &event{row: true}
			var payload, headers *string
			var deliverAt *time.Time
			if err := rows.Scan(&e.ID, &e.AggregateType, &e.AggregateID, &e.Type, &payload, &e.RawPayload, &headers, &e.TraceContext, &e.CreatedAt, &e.Seq, &deliverAt); err != nil {
				rows.Close()
				return fmt.Errorf("outboxpgx: drain %s: %w", s.base.Table, err)
			}
			if deliverAt != nil {
				s.delay(ctx, e, *deliverAt)
			}
			if payload != nil {
				e.Payload, e.RawPayload = []byte(*payload), nil
			}
			if headers != nil {
				e.HeadersJSON = []byte(*headers)
			}
			t.events = append(t.events, e)
			last = e.Seq
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("outboxpgx: drain %s: %w", s.base.Table, err)
		}
		if len(t.events) > 0 {
			if err := st.push(t); err != nil {
				return err
			}
		}
		if len(t.events) < min(drainPage, room) {
			break
		}
	}
	if err := snap.Rollback(ctx); err != nil {
		return fmt.Errorf("outboxpgx: drain %s: %w", s.base.Table, err)
	}
	return st.markDrained(ctx)
}

// markDrained records that the slot is drained once no row read from the
// table is pending.
func (st *stream) markDrained(ctx context.Context) error {
	s := st.src
	if st.drained {
		return nil
	}
	s.mu.Lock()
	left := s.queue.drainLeft
	s.mu.Unlock()
	if left > 0 {
		return nil
	}
	if err := st.fenced(ctx, slotDrained); err != nil {
		return err
	}
	if _, err := s.pool.Exec(ctx, s.q.dropLists, s.cfg.Slot); err != nil {
		s.base.Log.Warn("outboxpgx: could not drop the drained slot's list of rows (dropped at its next drain)", "slot", s.cfg.Slot, "err", err)
	}
	st.drained = true
	s.base.Log.Info("outboxpgx: relayed the rows that were in the table before the slot", "slot", s.cfg.Slot)
	return nil
}
