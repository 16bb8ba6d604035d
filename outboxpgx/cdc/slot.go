package cdc

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Check fails, with a one-line reason and what to do, when the database
// cannot serve log tailing: wal_level is not logical, the role may not
// replicate, or the table is not migrated for it. It warns, once per
// Source, when the server keeps WAL for slots without bound
// (max_slot_wal_keep_size).
func (s *Source) Check(ctx context.Context) error {
	var walLevel, keep string
	var replication, migrated, byTime bool
	err := s.pool.QueryRow(ctx, `SELECT current_setting('wal_level'), current_setting('max_slot_wal_keep_size'),
       coalesce((SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user), false),
       to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL,
       coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($3)), false)`,
		s.cn.State, s.cn.Parked, s.base.Table.Qualified("")).Scan(&walLevel, &keep, &replication, &migrated, &byTime)
	if err != nil {
		return fmt.Errorf("outboxpgx: check log tailing: %w", err)
	}
	switch {
	case walLevel != "logical":
		return fmt.Errorf("outboxpgx: log tailing needs wal_level = logical, and the server runs with %s: run ALTER SYSTEM SET wal_level = logical and restart PostgreSQL", walLevel)
	case !replication:
		return errors.New("outboxpgx: log tailing needs a role with the REPLICATION attribute: run ALTER ROLE <the relay's role> REPLICATION")
	case byTime:
		// Its rows reach the WAL as rows of its partitions, which the
		// publication would have to name (publish_via_partition_root).
		return fmt.Errorf("outboxpgx: %s is partitioned by time, and log tailing does not read partitioned tables: relay it with --source poll (docs/retention.md)", s.base.Table)
	case !migrated:
		return fmt.Errorf("outboxpgx: %s is not migrated for log tailing (no %s_cdc or %s_cdc_parked table): run `outbox migrate`", s.base.Table, s.base.Table.Name, s.base.Table.Name)
	}
	if keep == "-1" && !s.keepWarned.Swap(true) {
		s.base.Log.Warn("outboxpgx: max_slot_wal_keep_size is unbounded: a slot that stops moving (a relay down for long) keeps WAL until the disk is full; set it, e.g. ALTER SYSTEM SET max_slot_wal_keep_size = '10GB'",
			"slot", s.cfg.Slot)
	}
	return nil
}

// Setup creates what the source streams from when it is missing: the
// table's row in its _cdc companion, the publication and the replication
// slot (`outbox migrate --cdc`). It does not stream. Events written as
// logical decoding messages exist for the relay only from the slot's
// creation on: set it up before writers switch to messages. A slot that
// existed and is gone is handled as the streamer does (Mode). Setup
// ignores NoCreate.
func (s *Source) Setup(ctx context.Context) error {
	if err := s.Check(ctx); err != nil {
		return err
	}
	if _, err := s.pool.Exec(ctx, s.q.ensure, s.cfg.Slot, s.cfg.Publication); err != nil {
		return fmt.Errorf("outboxpgx: set up log tailing of %s: %w", s.base.Table, migrateHint(err, s.base.Table))
	}
	if err := s.ensurePublication(ctx, true); err != nil {
		return err
	}
	return s.ensureSlot(ctx, true, func(ctx context.Context, st slotState, args ...any) error {
		_, err := s.pool.Exec(ctx, s.q.setState[st], append([]any{s.cfg.Slot, nil, nil}, args...)...) // not under a lease
		return err
	})
}

// migrateHint adds what to do to an error about a missing _cdc table.
func migrateHint(err error, t outboxdriver.Table) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return fmt.Errorf("%w: %s is not migrated for log tailing: run `outbox migrate`", outboxdriver.ErrNotMigrated, t)
	}
	return err
}

// ensurePublication makes the publication of the table's inserts (and
// truncates, which are logged) when it is missing, and fails when it
// exists without the table (pgschema.EnsurePublication).
func (s *Source) ensurePublication(ctx context.Context, create bool) error {
	changed, err := pgschema.EnsurePublication(ctx, pgschema.PgxTx(s.pool), s.base.Table, s.cfg.Publication, create)
	if err != nil {
		return fmt.Errorf("outboxpgx: %w", err)
	}
	if changed {
		s.base.Log.Info("outboxpgx: created publication", "publication", s.cfg.Publication, "table", s.base.Table.String())
	}
	return nil
}

// ensureSlot makes the slot when it is missing. A slot that existed and
// is gone (dropped, or invalidated by max_slot_wal_keep_size) is lost: in
// table mode it is made again and the rows still in the table are drained
// first; in message mode that is an error naming the LSN from which
// messages were not relayed. mark records the slot's state (the
// streamer's marks are fenced by its lease).
func (s *Source) ensureSlot(ctx context.Context, create bool, mark func(context.Context, slotState, ...any) error) error {
	var plugin, walStatus string
	var sameDB, found bool
	err := s.pool.QueryRow(ctx, pgschema.SlotLookupSQL, s.cfg.Slot).Scan(&plugin, &sameDB, &walStatus)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return fmt.Errorf("outboxpgx: look up replication slot %s: %w", s.cfg.Slot, err)
	default:
		found = true
	}
	if found && (plugin != "pgoutput" || !sameDB) {
		return fmt.Errorf("outboxpgx: replication slot %s exists but is not a pgoutput slot of this database: name another slot", s.cfg.Slot)
	}
	var created bool
	var confirmed string
	if err := s.pool.QueryRow(ctx, `SELECT slot_created, coalesce(confirmed_lsn::text, '') FROM `+s.cn.State+` WHERE slot = $1`, s.cfg.Slot).Scan(&created, &confirmed); err != nil {
		return fmt.Errorf("outboxpgx: read the state of slot %s: %w", s.cfg.Slot, err)
	}
	if found && walStatus != "lost" {
		s.lossLogged.Store(false)
		if !created {
			return mark(ctx, slotCreated)
		}
		return nil
	}
	if found || created {
		what := "was dropped"
		if found {
			what = "was invalidated (it fell behind by more than max_slot_wal_keep_size)"
		}
		from := confirmed
		if from == "" {
			from = "its creation"
		}
		if s.cfg.Mode != ModeTable {
			var now string
			if err := s.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&now); err != nil {
				now = "?"
			}
			events := "logical decoding messages"
			if s.cfg.Mode == ModeInsertDelete {
				events = "rows inserted and deleted in their transaction"
			}
			err := fmt.Errorf("outboxpgx: replication slot %s %s: events written as %s after LSN %s, up to the start of a new slot (the WAL is at %s now), were not relayed and cannot be; to stream again from then on, accept the loss with UPDATE %s SET slot_created = false WHERE slot = '%s'",
				s.cfg.Slot, what, events, from, now, s.cn.State, s.cfg.Slot)
			// Said here once: the relay's claims fail with it from now on,
			// and its outage lines repeat it only every 30 s.
			if !s.lossLogged.Swap(true) {
				s.base.Log.Error("outboxpgx: replication slot lost; not streaming", "slot", s.cfg.Slot, "err", err)
			}
			return err
		}
		s.base.Log.Error("outboxpgx: replication slot lost; making it again and relaying the rows still in the table first (no row is lost; logical decoding messages and insert+delete rows written meanwhile are)",
			"slot", s.cfg.Slot, "lost", what, "confirmed_lsn", from)
		if found {
			if _, err := s.pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, s.cfg.Slot); err != nil {
				return fmt.Errorf("outboxpgx: drop invalidated replication slot %s: %w", s.cfg.Slot, slotError(err, s.cfg.Slot))
			}
		}
	}
	if !create {
		return fmt.Errorf("outboxpgx: replication slot %s does not exist: run SELECT pg_create_logical_replication_slot('%s', 'pgoutput'), or let the relay create it", s.cfg.Slot, s.cfg.Slot)
	}
	// Not drained from now on: the new slot does not hold the rows that
	// are in the table already.
	if err := mark(ctx, slotNew); err != nil {
		return err
	}
	if _, err := s.pool.Exec(ctx, s.q.dropLists, s.cfg.Slot); err != nil {
		return fmt.Errorf("outboxpgx: slot %s: drop old drain lists: %w", s.cfg.Slot, err)
	}
	lsn, listed, err := s.createSlot(ctx)
	if err != nil {
		return err
	}
	s.base.Log.Info("outboxpgx: created replication slot", "slot", s.cfg.Slot, "lsn", lsn, "rows_to_drain", listed)
	return mark(ctx, slotListed, lsn, listed == 0)
}

// createSlot creates the slot over the replication protocol, which exports
// the snapshot the slot starts at: every transaction it shows committed is
// not in the slot's stream, every later one is. Inside that snapshot it
// lists the unpublished rows, which are exactly the rows the stream does
// not hold (stream.drain relays them). It returns the slot's consistent
// point and how many rows it listed.
func (s *Source) createSlot(ctx context.Context) (string, int64, error) {
	conn, err := pgconn.ConnectConfig(ctx, s.replConfig())
	if err != nil {
		return "", 0, fmt.Errorf("outboxpgx: create replication slot %s: %w", s.cfg.Slot, replConnError(err))
	}
	defer conn.Close(context.Background()) // the exported snapshot ends with it
	res, err := pglogrepl.CreateReplicationSlot(ctx, conn, s.cfg.Slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "EXPORT_SNAPSHOT"})
	if err != nil {
		return "", 0, fmt.Errorf("outboxpgx: create replication slot %s: %w", s.cfg.Slot, slotError(err, s.cfg.Slot))
	}
	var listed int64
	err = pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET TRANSACTION SNAPSHOT `+pgschema.QuoteLiteral(res.SnapshotName)); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, s.q.drainList, s.cfg.Slot, res.ConsistentPoint)
		listed = tag.RowsAffected()
		return err
	})
	if err != nil {
		// The slot stays, not recorded as listed: its first streamer
		// drains every unpublished row (duplicates, never a loss).
		return "", 0, fmt.Errorf("outboxpgx: replication slot %s: list the rows it does not hold: %w", s.cfg.Slot, err)
	}
	return res.ConsistentPoint, listed, nil
}

// slotError says what to do about the common failures of slot commands.
func slotError(err error, slot string) error { return pgschema.SlotError(err, slot) }
