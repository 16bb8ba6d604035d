package cdc

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// ErrPendingInSlot is wrapped by Drop's refusal of a slot that still holds
// events only the WAL has (message and insert + delete mode): dropping it
// would lose them.
var ErrPendingInSlot = errors.New("outboxpgx: the replication slot holds events not yet relayed")

// DropOptions configure Drop.
type DropOptions struct {
	// Force drops the slot even when, in message or insert + delete mode,
	// it holds events not yet relayed, which are then lost.
	Force bool
}

// Drop removes what Setup made, while the table stays: the replication
// slot (which stops pinning WAL), its row in the table's _cdc companion and
// its drain list, and the publication when it publishes this table alone
// and no other slot of the table's uses it. A relay or Setup makes them
// again; in table mode the next slot's relay publishes the rows still in
// the table first, and from schema version 23 writers in message and
// insert + delete mode are refused until then (outboxpgx.ErrNoSlot).
//
// Drop refuses while a relay streams the slot. In message and insert +
// delete mode it first reads, without consuming, what the slot holds past
// its confirmed position, and refuses (wrapping ErrPendingInSlot, with the
// count) when that includes events of the table, or when it cannot read
// the slot (an invalidated one), unless o.Force. It returns how many such
// events it found.
func (s *Source) Drop(ctx context.Context, o DropOptions) (pending int, err error) {
	var exists, active bool
	err = s.pool.QueryRow(ctx, `SELECT true, active FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()`,
		s.cfg.Slot).Scan(&exists, &active)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("outboxpgx: look up replication slot %s: %w", s.cfg.Slot, err)
	}
	if active {
		return 0, fmt.Errorf("outboxpgx: replication slot %s is streamed by a relay: stop the relays with --source cdc on %s first", s.cfg.Slot, s.base.Table)
	}
	if exists && s.cfg.Mode != ModeTable {
		if pending, err = s.pendingInSlot(ctx); err != nil {
			if !o.Force {
				return 0, fmt.Errorf("%w (a slot that cannot be read, an invalidated one say, is dropped with Force)", err)
			}
			// Forced: what it held is lost either way; count none.
			s.base.Log.Warn("outboxpgx: could not read what the slot holds; dropping it as forced", "slot", s.cfg.Slot, "err", err)
			pending = 0
		}
		if pending > 0 && !o.Force {
			return pending, fmt.Errorf("%w: %d event(s) of %s written as %s are in the WAL past the slot's confirmed position and nowhere else: start a relay with --source cdc to publish them first, or force the drop and lose them",
				ErrPendingInSlot, pending, s.base.Table, s.cfg.Mode)
		}
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return pending, fmt.Errorf("outboxpgx: drop log tailing of %s: %w", s.base.Table, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var othersUse, onlyThis bool
	err = tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+s.cn.State+` WHERE publication = $2 AND slot <> $1),
       coalesce((SELECT NOT p.puballtables AND (SELECT count(*) FROM pg_publication_tables t WHERE t.pubname = p.pubname) = 1
                 FROM pg_publication p WHERE p.pubname = $2), false)`,
		s.cfg.Slot, s.cfg.Publication).Scan(&othersUse, &onlyThis)
	if err != nil {
		return pending, fmt.Errorf("outboxpgx: drop log tailing of %s: %w", s.base.Table, migrateHint(err, s.base.Table))
	}
	if _, err := tx.Exec(ctx, `DELETE FROM `+s.cn.State+` WHERE slot = $1`, s.cfg.Slot); err != nil {
		return pending, fmt.Errorf("outboxpgx: drop log tailing of %s: %w", s.base.Table, err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM `+s.cn.Drain+` WHERE slot = $1`, s.cfg.Slot); err != nil {
		return pending, fmt.Errorf("outboxpgx: drop log tailing of %s: %w", s.base.Table, err)
	}
	if !othersUse && onlyThis {
		if _, err := tx.Exec(ctx, `DROP PUBLICATION IF EXISTS `+outboxdriver.QuoteIdent(s.cfg.Publication)); err != nil {
			return pending, fmt.Errorf("outboxpgx: drop publication %s: %w", s.cfg.Publication, err)
		}
	}
	if exists {
		// In the transaction: a relay that makes the slot again meanwhile
		// fails to, and nothing is half done.
		if _, err := tx.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, s.cfg.Slot); err != nil {
			return pending, fmt.Errorf("outboxpgx: drop replication slot %s: %w", s.cfg.Slot, slotError(err, s.cfg.Slot))
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return pending, fmt.Errorf("outboxpgx: drop log tailing of %s: %w", s.base.Table, err)
	}
	s.base.Log.Info("outboxpgx: dropped log tailing", "table", s.base.Table.String(), "slot", s.cfg.Slot, "publication_dropped", !othersUse && onlyThis)
	return pending, nil
}

// pendingInSlot counts the events of the table the slot holds past its
// confirmed position: the messages with the table's prefix and the rows
// inserted into it (its publication names it alone, or the inserts of
// other tables are counted too: an upper bound). It decodes without
// consuming (pg_logical_slot_peek_binary_changes), from the slot's
// confirmed position to the WAL's end.
func (s *Source) pendingInSlot(ctx context.Context) (int, error) {
	rows, err := s.pool.Query(ctx, `SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
    'proto_version', '1', 'publication_names', $2, 'messages', 'true')`, s.cfg.Slot, s.cfg.Publication)
	if err != nil {
		return 0, fmt.Errorf("outboxpgx: read what replication slot %s holds: %w", s.cfg.Slot, slotError(err, s.cfg.Slot))
	}
	prefix := []byte(pgschema.MessagePrefix(s.base.Table))
	n := 0
	var data []byte
	_, err = pgx.ForEachRow(rows, []any{&data}, func() error {
		if isTableChange(data, prefix) {
			n++
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("outboxpgx: read what replication slot %s holds: %w", s.cfg.Slot, err)
	}
	return n, nil
}

// isTableChange reports whether data, a pgoutput message, is an insert
// (the publication's table) or a logical decoding message with prefix.
func isTableChange(data, prefix []byte) bool {
	if len(data) == 0 {
		return false
	}
	switch data[0] {
	case 'I':
		return true
	case 'M':
		// 'M', flags (1), LSN (8), prefix (NUL-terminated), length (4), content.
		if len(data) < 10 {
			return false
		}
		rest := data[10:]
		end := bytes.IndexByte(rest, 0)
		return end >= 0 && bytes.Equal(rest[:end], prefix)
	}
	return false
}
