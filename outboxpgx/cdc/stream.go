package cdc

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// stream is one run of a CDC source's streamer under one lease epoch: it
// makes the publication and slot when missing, drains the rows a new slot
// does not hold, then reads the slot's stream into the queue and confirms
// what the source says it may.
type stream struct {
	src    *Source
	epoch  int64
	cancel context.CancelFunc
	done   chan struct{}
	err    error // why it ended; read after done

	// drained says the rows a new slot does not hold were relayed (or
	// there were none to relay); the reader records it once they are.
	drained bool

	// sent is the LSN last sent in a standby status update, next when the
	// next one is due (the reader's).
	sent pglogrepl.LSN
	next time.Time

	kickMu     sync.Mutex
	kicked     bool
	recvCancel context.CancelFunc
	room       chan struct{} // signalled when events are done
}

func (st *stream) ended() bool {
	select {
	case <-st.done:
		return true
	default:
		return false
	}
}

// kick makes the reader send a standby status update now (the LSN to
// confirm moved) instead of at its next interval.
func (st *stream) kick() {
	st.kickMu.Lock()
	st.kicked = true
	if st.recvCancel != nil {
		st.recvCancel()
	}
	st.kickMu.Unlock()
	st.roomy()
}

// roomy wakes a reader waiting for room in the queue: events are done.
func (st *stream) roomy() {
	select {
	case st.room <- struct{}{}:
	default:
	}
}

// receiving registers the cancel func of the reader's receive; it reports
// false (and registers nothing) when a kick came meanwhile.
func (st *stream) receiving(cancel context.CancelFunc) bool {
	st.kickMu.Lock()
	defer st.kickMu.Unlock()
	if st.kicked {
		st.kicked = false
		return false
	}
	st.recvCancel = cancel
	return true
}

func (st *stream) received() {
	st.kickMu.Lock()
	st.recvCancel = nil
	st.kicked = false
	st.kickMu.Unlock()
}

// resetLocked forgets the queued events: the stream they came from is
// gone. Batches claimed before record nothing in memory. s.mu is held.
func (s *Source) resetLocked() {
	if n := s.queue.reset(); n > 0 {
		s.republish += n
		s.base.Log.Info("outboxpgx: the stream starts again from the slot's confirmed LSN; events published past it will be published again",
			"slot", s.cfg.Slot, "republish", n)
	}
	s.gen++
	s.target = 0
}

// startStream starts streaming under lease l. s.mu is held.
func (s *Source) startStream(l outboxdriver.Lease) {
	ctx, cancel := context.WithCancel(context.Background())
	st := &stream{src: s, epoch: l.Epoch, cancel: cancel, done: make(chan struct{}), room: make(chan struct{}, 1)}
	s.resetLocked()
	s.st = st
	go func() {
		err := st.run(ctx)
		if ctx.Err() != nil {
			err = nil // stopped
		} else if err == nil {
			err = errors.New("outboxpgx: the replication stream ended")
		}
		if err != nil {
			s.base.Log.Error("outboxpgx: log tailing stopped", "slot", s.cfg.Slot, "err", err)
		}
		st.err = err
		close(st.done)
		s.signal()
	}()
}

// stopStream stops the stream, if any, and waits for it.
func (s *Source) stopStream() {
	s.mu.Lock()
	st := s.st
	s.st = nil
	if st != nil {
		s.resetLocked()
	}
	s.mu.Unlock()
	if st != nil {
		st.cancel()
		<-st.done
	}
}

// current reports whether st is still the source's stream. s.mu is held.
func (st *stream) current() bool { return st.src.st == st }

var errStopped = errors.New("stream stopped")

// run sets up and reads the stream until ctx ends or it fails.
func (st *stream) run(ctx context.Context) error {
	s := st.src
	if err := s.ensurePublication(ctx, !s.cfg.NoCreate); err != nil {
		return err
	}
	if err := s.ensureSlot(ctx, !s.cfg.NoCreate, st.fenced); err != nil {
		return err
	}
	var drained bool
	var dead, listed string
	if err := s.pool.QueryRow(ctx, s.q.row, s.cfg.Slot).Scan(&drained, &dead, &listed); err != nil {
		return fmt.Errorf("outboxpgx: read the state of slot %s: %w", s.cfg.Slot, err)
	}
	deadLSN, err := pglogrepl.ParseLSN(dead)
	if err != nil {
		return fmt.Errorf("outboxpgx: slot %s: dead_lsn %q: %w", s.cfg.Slot, dead, err)
	}
	if err := st.loadHeld(ctx, deadLSN); err != nil {
		return err
	}
	st.drained = drained
	if !drained {
		if err := st.drain(ctx, listed); err != nil {
			return err
		}
	}
	var until pglogrepl.LSN // read without streaming until the slot confirmed it
	for {
		conn, err := st.connect(ctx, until == 0)
		if err != nil {
			return err
		}
		err = st.read(ctx, conn, until)
		st.close(conn)
		var unstream *unstreamError
		switch {
		case errors.As(err, &unstream):
			// The stream reads on from the confirmed LSN, without streaming
			// of transactions in progress: the server sends the transaction
			// again, whole, at its commit, with its subtransactions'
			// rollbacks applied.
			s.base.Log.Info("outboxpgx: a streamed transaction with messages had a subtransaction rolled back; reading it again, whole", "slot", s.cfg.Slot, "commit_lsn", unstream.end.String())
			if err := st.settle(ctx); err != nil {
				return nil
			}
			until = unstream.end
		case errors.Is(err, errRestream):
			until = 0 // confirmed past it, nothing queued: streaming again
		default:
			return err
		}
	}
}

// unstreamError says a streamed transaction (ending at end) cannot be told
// apart from its rolled-back subtransactions: the stream must be read
// again without streaming until it is done (decoder.streamCommit).
type unstreamError struct{ end pglogrepl.LSN }

func (e *unstreamError) Error() string {
	return "read again without streaming up to " + e.end.String()
}

// errRestream says a stream read without streaming is past the
// transaction that needed it.
var errRestream = errors.New("read again with streaming")

// settle forgets the queued events so that the stream can read them again:
// it waits until the events are done (for a few seconds; the rest come
// again, duplicates), and always until the rows read from the table are,
// which do not come again.
func (st *stream) settle(ctx context.Context) error {
	s := st.src
	patience := time.NewTimer(5 * time.Second)
	defer patience.Stop()
	impatient := false
	for {
		s.mu.Lock()
		if !st.current() {
			s.mu.Unlock()
			return errStopped
		}
		if s.queue.drainLeft == 0 && (s.queue.pending == 0 || impatient) {
			s.resetLocked()
			s.mu.Unlock()
			return nil
		}
		s.mu.Unlock()
		select {
		case <-st.room:
		case <-patience.C:
			impatient = true
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// close closes the replication connection and waits (a little) until the
// server has let go of the slot, so that a standby or `migrate --down`
// finds it free.
func (st *stream) close(conn *pgconn.PgConn) {
	s := st.src
	pid := conn.PID()
	conn.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		var busy bool
		err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND active_pid = $2)`, s.cfg.Slot, pid).Scan(&busy)
		if err != nil || !busy {
			return
		}
		t := time.NewTimer(5 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
}

// loadHeld loads the aggregates held behind dead letters, how many events
// of each aggregate are parked, and the LSN up to which replayed events may
// be dead letters or parked already.
func (st *stream) loadHeld(ctx context.Context, deadLSN pglogrepl.LSN) error {
	s := st.src
	rows, err := s.pool.Query(ctx, s.q.held)
	if err != nil {
		return fmt.Errorf("outboxpgx: read held aggregates: %w", err)
	}
	held := map[aggKey]string{}
	var k aggKey
	var id string
	if _, err := pgx.ForEachRow(rows, []any{&k.typ, &k.id, &id}, func() error { held[k] = id; return nil }); err != nil {
		return fmt.Errorf("outboxpgx: read held aggregates: %w", err)
	}
	if rows, err = s.pool.Query(ctx, s.q.parkedCounts); err != nil {
		return fmt.Errorf("outboxpgx: count parked events: %w", err)
	}
	parked := map[aggKey]int{}
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&k.typ, &k.id, &n}, func() error { parked[k] = n; return nil }); err != nil {
		return fmt.Errorf("outboxpgx: count parked events: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !st.current() {
		return errStopped
	}
	s.queue.held, s.queue.parked = held, parked
	s.deadLSN = deadLSN
	return nil
}

// ensurePublication makes the publication of the table's inserts (and
// truncates, which are logged) when it is missing, and fails when it
// exists without the table.
func (s *Source) ensurePublication(ctx context.Context, create bool) error {
	var exists, hasTable, truncates bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1),
       EXISTS (SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3),
       coalesce((SELECT pubtruncate FROM pg_publication WHERE pubname = $1), false)`,
		s.cfg.Publication, s.base.Table.Schema, s.base.Table.Name).Scan(&exists, &hasTable, &truncates)
	if err != nil {
		return fmt.Errorf("outboxpgx: look up publication %s: %w", s.cfg.Publication, err)
	}
	switch {
	case exists && hasTable && !truncates && create:
		// Made before TRUNCATE was published: the relay logs a TRUNCATE of
		// the table it is told of.
		if _, err := s.pool.Exec(ctx, `ALTER PUBLICATION `+outboxdriver.QuoteIdent(s.cfg.Publication)+` SET (publish = 'insert, truncate')`); err != nil {
			return fmt.Errorf("outboxpgx: publish TRUNCATE in publication %s: %w", s.cfg.Publication, err)
		}
		return nil
	case exists && hasTable:
		return nil
	case exists:
		return fmt.Errorf("outboxpgx: publication %s does not publish %s: run ALTER PUBLICATION %s ADD TABLE %s, or name another publication",
			s.cfg.Publication, s.base.Table, outboxdriver.QuoteIdent(s.cfg.Publication), s.base.Table.Qualified(""))
	case !create:
		return fmt.Errorf("outboxpgx: publication %s does not exist: run CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert, truncate'), or let the relay create it",
			s.cfg.Publication, outboxdriver.QuoteIdent(s.cfg.Publication), s.base.Table.Qualified(""))
	}
	_, err = s.pool.Exec(ctx, `CREATE PUBLICATION `+outboxdriver.QuoteIdent(s.cfg.Publication)+` FOR TABLE `+s.base.Table.Qualified("")+` WITH (publish = 'insert, truncate')`)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42710" {
		return nil // made meanwhile
	}
	if err != nil {
		return fmt.Errorf("outboxpgx: create publication %s: %w", s.cfg.Publication, err)
	}
	s.base.Log.Info("outboxpgx: created publication", "publication", s.cfg.Publication, "table", s.base.Table.String())
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
	err := s.pool.QueryRow(ctx, `SELECT coalesce(plugin, ''), database = current_database(), coalesce(wal_status, '')
FROM pg_replication_slots WHERE slot_name = $1`, s.cfg.Slot).Scan(&plugin, &sameDB, &walStatus)
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
			return fmt.Errorf("outboxpgx: replication slot %s %s: events written as %s after LSN %s, up to the start of a new slot (the WAL is at %s now), were not relayed and cannot be; to stream again from then on, accept the loss with UPDATE %s SET slot_created = false WHERE slot = '%s'",
				s.cfg.Slot, what, events, from, now, s.cn.State, s.cfg.Slot)
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

// fenced records a change of the slot's state under the lease; it fails
// with ErrLeaseLost when the lease is gone.
func (st *stream) fenced(ctx context.Context, state slotState, args ...any) error {
	s := st.src
	tag, err := s.pool.Exec(ctx, s.q.setState[state], append([]any{s.cfg.Slot, s.base.Cfg.RelayName, st.epoch}, args...)...)
	if err != nil {
		return fmt.Errorf("outboxpgx: slot %s: %w", s.cfg.Slot, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("outboxpgx: slot %s: %w: another relay streams it now", s.cfg.Slot, outboxdriver.ErrLeaseLost)
	}
	return nil
}

// slotError says what to do about the common failures of slot commands.
func slotError(err error, slot string) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch {
	case pgErr.Code == "55000" && strings.Contains(pgErr.Message, "wal_level"):
		return fmt.Errorf("log tailing needs wal_level = logical: run ALTER SYSTEM SET wal_level = logical and restart PostgreSQL (%s)", pgErr.Message)
	case pgErr.Code == "42501":
		return fmt.Errorf("the relay's role may not replicate: run ALTER ROLE <the relay's role> REPLICATION (%s)", pgErr.Message)
	case pgErr.Code == "53400":
		return fmt.Errorf("no replication slot is free: raise max_replication_slots, or drop an unused slot (%s)", pgErr.Message)
	case pgErr.Code == "55006":
		return fmt.Errorf("replication slot %s is busy: another process streams from it (%s)", slot, pgErr.Message)
	}
	return err
}

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

// waitRoom waits until the queue holds fewer than MaxPending events and
// returns how many more it may take.
func (st *stream) waitRoom(ctx context.Context) (int, error) {
	s := st.src
	for {
		s.mu.Lock()
		if !st.current() {
			s.mu.Unlock()
			return 0, errStopped
		}
		room := s.cfg.MaxPending - s.queue.pending
		s.mu.Unlock()
		if room > 0 {
			return room, nil
		}
		select {
		case <-st.room:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// push queues a committed transaction and wakes the relay.
func (st *stream) push(t *txn) error {
	s := st.src
	s.mu.Lock()
	if !st.current() {
		s.mu.Unlock()
		return errStopped
	}
	s.queue.push(t)
	if s.queue.advance() && s.leased && time.Now().Before(s.leaseUntil) {
		// Transactions without events of this table at the front: nothing
		// to wait for.
		s.target = max(s.target, s.queue.mark)
	}
	s.mu.Unlock()
	if len(t.events) > 0 {
		s.signal()
	}
	return nil
}

// replConfig is the configuration of a replication connection.
func (s *Source) replConfig() *pgconn.Config {
	cfg := s.pool.Config().ConnConfig.Config.Copy()
	cfg.RuntimeParams["replication"] = "database"
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "outbox"
	}
	// The text forms the decoder reads.
	cfg.RuntimeParams["datestyle"] = "ISO"
	cfg.RuntimeParams["timezone"] = "UTC"
	cfg.RuntimeParams["bytea_output"] = "hex"
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	return cfg
}

// replConnError says what to do when a replication connection is refused
// for want of the REPLICATION attribute.
func replConnError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return fmt.Errorf("log tailing needs a role with the REPLICATION attribute: run ALTER ROLE <the relay's role> REPLICATION (%s)", pgErr.Message)
	}
	return fmt.Errorf("open the replication connection: %w", err)
}

// connect opens the replication connection and starts streaming from the
// slot's confirmed LSN. A stale streamer still connected to the slot (its
// lease expired, and this relay holds it now) is terminated first.
func (st *stream) connect(ctx context.Context, streaming bool) (*pgconn.PgConn, error) {
	s := st.src
	conn, err := pgconn.ConnectConfig(ctx, s.replConfig())
	if err != nil {
		return nil, fmt.Errorf("outboxpgx: %w", replConnError(err))
	}
	// Only under the lease: a relay whose lease expired must not stop the
	// new owner's stream.
	if err := st.fenced(ctx, slotOwned); err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	if err := st.takeOver(ctx); err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	// From the LSN recorded with the last batch's outcome: the slot's own
	// confirmed LSN may lag it (the relay stopped or died before it sent
	// it), and what is recorded is done; the server starts from the later
	// of the two.
	var from string
	if err := s.pool.QueryRow(ctx, `SELECT coalesce(confirmed_lsn, '0/0')::text FROM `+s.cn.State+` WHERE slot = $1`, s.cfg.Slot).Scan(&from); err != nil {
		conn.Close(context.Background())
		return nil, fmt.Errorf("outboxpgx: read the state of slot %s: %w", s.cfg.Slot, err)
	}
	start, err := pglogrepl.ParseLSN(from)
	if err != nil {
		conn.Close(context.Background())
		return nil, fmt.Errorf("outboxpgx: slot %s: confirmed_lsn %q: %w", s.cfg.Slot, from, err)
	}
	err = pglogrepl.StartReplication(ctx, conn, s.cfg.Slot, start, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{
			"proto_version '2'",
			"streaming '" + strconv.FormatBool(streaming) + "'",
			"publication_names '" + outboxdriver.QuoteIdent(s.cfg.Publication) + "'",
			"messages 'true'",
		},
	})
	if err != nil {
		conn.Close(context.Background())
		return nil, fmt.Errorf("outboxpgx: start streaming slot %s: %w", s.cfg.Slot, slotError(err, s.cfg.Slot))
	}
	return conn, nil
}

// takeOver terminates the process still streaming the slot, if any: this
// relay holds the lease, so that one is a stale streamer (or a stranger),
// and it must not confirm anything any more. It waits until the slot is
// free.
func (st *stream) takeOver(ctx context.Context) error {
	s := st.src
	deadline := time.Now().Add(10 * time.Second)
	for warned := false; ; {
		var pid int32
		err := s.pool.QueryRow(ctx, `SELECT coalesce(active_pid, 0) FROM pg_replication_slots WHERE slot_name = $1`, s.cfg.Slot).Scan(&pid)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && pid == 0) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("outboxpgx: look up replication slot %s: %w", s.cfg.Slot, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("outboxpgx: replication slot %s is busy: process %d streams from it and could not be stopped", s.cfg.Slot, pid)
		}
		if !warned {
			s.base.Log.Warn("outboxpgx: replication slot is streamed by another process; this relay holds its lease and stops it", "slot", s.cfg.Slot, "pid", pid)
			warned = true
			if _, err := s.pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
				return fmt.Errorf("outboxpgx: replication slot %s is busy: process %d streams from it: %w", s.cfg.Slot, pid, err)
			}
		}
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

// read decodes the stream into the queue until ctx ends or the stream
// fails, and sends a standby status update with the LSN the source may
// confirm whenever it moved, or at least every StatusInterval.
//
// until, when not 0, says the stream was started without streaming of
// transactions in progress, to be read so until the slot confirmed until
// and nothing is queued: then read returns errRestream.
func (st *stream) read(ctx context.Context, conn *pgconn.PgConn, until pglogrepl.LSN) error {
	s := st.src
	d := &decoder{ctx: ctx, src: s, rels: map[uint32]*relation{}, types: pgtype.NewMap(), spills: map[uint32]*spill{},
		part: max(1, min(partSize, s.cfg.MaxPending))}
	defer d.close()
	d.emit = func(t *txn, part bool) error { return st.emit(ctx, conn, t, part) }
	st.next = time.Now()
	// The receive's context, with the deadline of the next status update:
	// made again only when that deadline moves or a kick or the deadline
	// ended it, not for every message (a timer each, a tenth of the
	// reader's CPU in a drain).
	var (
		rctx    context.Context
		rcancel context.CancelFunc = func() {}
		rnext   time.Time
	)
	defer func() { rcancel() }()
	for {
		if ctx.Err() != nil {
			return nil
		}
		s.mu.Lock()
		if !st.current() {
			s.mu.Unlock()
			return nil
		}
		full := s.queue.pending >= s.cfg.MaxPending
		idle := len(s.queue.txns) == 0
		s.mu.Unlock()
		if err := st.markDrained(ctx); err != nil {
			return err
		}
		if err := st.status(ctx, conn); err != nil {
			return err
		}
		if until != 0 && idle && st.sent >= until && d.between() {
			return errRestream
		}
		if full && d.cur == nil {
			// Enough in memory: read on once the relay caught up a little.
			if err := st.waitRoomOrStatus(ctx); err != nil {
				return nil
			}
			continue
		}
		if rctx == nil || rctx.Err() != nil || !rnext.Equal(st.next) {
			rcancel()
			rctx, rcancel = context.WithDeadline(ctx, st.next)
			rnext = st.next
		}
		if !st.receiving(rcancel) {
			continue
		}
		msg, err := conn.ReceiveMessage(rctx)
		st.received()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if pgconn.Timeout(err) || errors.Is(err, context.Canceled) {
				continue // time for a status update, or a kick
			}
			return fmt.Errorf("outboxpgx: stream slot %s: %w", s.cfg.Slot, err)
		}
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			if len(m.Data) == 0 {
				continue
			}
			switch m.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.Data[1:])
				if err != nil {
					return fmt.Errorf("outboxpgx: stream slot %s: %w", s.cfg.Slot, err)
				}
				st.idle(ka.ServerWALEnd, d.between())
				if ka.ReplyRequested {
					st.next = time.Time{}
				}
			case pglogrepl.XLogDataByteID:
				x, err := pglogrepl.ParseXLogData(m.Data[1:])
				if err != nil {
					return fmt.Errorf("outboxpgx: stream slot %s: %w", s.cfg.Slot, err)
				}
				if err := d.decode(x.WALData); err != nil {
					if errors.Is(err, errStopped) || ctx.Err() != nil {
						return nil
					}
					return fmt.Errorf("outboxpgx: stream slot %s at %s: %w", s.cfg.Slot, x.WALStart, err)
				}
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("outboxpgx: stream slot %s: %w", s.cfg.Slot, slotError(pgconn.ErrorResponseToPgError(m), s.cfg.Slot))
		case *pgproto3.CopyDone:
			return fmt.Errorf("outboxpgx: stream slot %s: the server ended the stream", s.cfg.Slot)
		}
	}
}

// status sends a standby status update when the LSN to confirm moved or
// the interval passed.
func (st *stream) status(ctx context.Context, conn *pgconn.PgConn) error {
	s := st.src
	s.mu.Lock()
	target := s.target
	s.mu.Unlock()
	if now := time.Now(); target > st.sent || !now.Before(st.next) {
		pos := max(target, st.sent)
		if err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pos}); err != nil {
			return fmt.Errorf("outboxpgx: send standby status of slot %s: %w", s.cfg.Slot, err)
		}
		st.sent, st.next = pos, now.Add(s.cfg.StatusInterval)
	}
	return nil
}

// waitRoomOrStatus waits until events are done or a status update is due.
func (st *stream) waitRoomOrStatus(ctx context.Context) error {
	t := time.NewTimer(time.Until(st.next))
	defer t.Stop()
	select {
	case <-st.room:
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// emit queues a committed transaction, or a part of one (part: more of it
// follows). A part waits for room in the queue first, sending status
// updates meanwhile: the server waits in the middle of the transaction
// until the relay caught up.
func (st *stream) emit(ctx context.Context, conn *pgconn.PgConn, t *txn, part bool) error {
	s := st.src
	for part {
		s.mu.Lock()
		if !st.current() {
			s.mu.Unlock()
			return errStopped
		}
		full := s.queue.pending >= s.cfg.MaxPending
		s.mu.Unlock()
		if !full {
			break
		}
		if err := st.status(ctx, conn); err != nil {
			return err
		}
		if err := st.waitRoomOrStatus(ctx); err != nil {
			return errStopped
		}
	}
	return st.push(t)
}

// idle confirms the server's WAL end from a keepalive when nothing is
// pending (every event received so far is done, and no transaction is
// half read): the slot then keeps no WAL for an idle outbox on a busy
// database. Only under a lease the local clock says is still held. A
// streamed transaction still in progress does not stop it: it commits
// after that LSN, so after a restart the server sends it again, whole.
func (st *stream) idle(walEnd pglogrepl.LSN, between bool) {
	s := st.src
	s.mu.Lock()
	defer s.mu.Unlock()
	if between && st.current() && s.queue.pending == 0 && len(s.queue.txns) == 0 && s.leased && time.Now().Before(s.leaseUntil) {
		s.target = max(s.target, walEnd)
	}
}

// partSize is the most events of one transaction handed to the queue at
// once (at most MaxPending): a larger transaction goes in parts.
const partSize = 1000

// decoder turns pgoutput messages (protocol version 2, streaming on) into
// transactions of events, handed to emit in commit order.
type decoder struct {
	ctx   context.Context // the stream's
	src   *Source
	rels  map[uint32]*relation
	types *pgtype.Map
	// emit queues a committed transaction, or a part of one (part true:
	// more of it follows).
	emit func(t *txn, part bool) error
	part int // partSize, at most MaxPending

	cur *txn      // the transaction being read (Begin to Commit)
	at  time.Time // the commit time of cur

	// inStream says a chunk of a streamed transaction is being read
	// (Stream Start to Stream Stop); spills holds the spill file of each
	// streamed transaction with events of the table, by its xid.
	inStream bool
	streamed uint32
	spills   map[uint32]*spill
	// seen is the table's columns as last seen, so that a change of them
	// (DDL) is logged.
	seen []string
}

// commitAt is the commit time of the transaction being read; zero in a
// streamed one (the spill file's replay fills it in).
func (d *decoder) commitAt() time.Time {
	if d.inStream {
		return time.Time{}
	}
	return d.at
}

// relation is what the decoder knows of a relation: whether it is the
// outbox table, and where its columns are.
type relation struct {
	ours bool
	col  map[string]int
}

// between reports whether no transaction is half read.
func (d *decoder) between() bool { return d.cur == nil && !d.inStream }

// close removes the spill files.
func (d *decoder) close() {
	for xid, sp := range d.spills {
		sp.close()
		delete(d.spills, xid)
	}
}

// decode handles one pgoutput message.
func (d *decoder) decode(data []byte) error {
	msg, err := pglogrepl.ParseV2(data, d.inStream)
	if err != nil {
		return err
	}
	s := d.src
	switch m := msg.(type) {
	case *pglogrepl.RelationMessageV2:
		d.relation(&m.RelationMessage)
	case *pglogrepl.BeginMessage:
		d.cur, d.at = &txn{xid: m.Xid, lsn: m.FinalLSN, commit: m.CommitTime}, m.CommitTime
	case *pglogrepl.InsertMessageV2:
		r := d.rels[m.RelationID]
		if r == nil || !r.ours {
			return nil
		}
		return d.add(m.Xid, d.row(r, m.Tuple))
	case *pglogrepl.LogicalDecodingMessageV2:
		if !m.Transactional || m.Prefix != s.prefix {
			if m.Prefix == s.prefix && !m.Transactional {
				s.base.Log.Warn("outboxpgx: ignored a non-transactional message with the outbox's prefix: write events with pg_logical_emit_message(true, ...)", "lsn", m.LSN.String())
			}
			return nil
		}
		return d.add(m.Xid, d.message(&m.LogicalDecodingMessage))
	case *pglogrepl.CommitMessage:
		t := d.cur
		d.cur = nil
		if t == nil {
			return nil
		}
		t.end = m.TransactionEndLSN
		return d.emit(t, false)
	case *pglogrepl.StreamStartMessageV2:
		d.inStream, d.streamed = true, m.Xid
		if sp := d.spills[m.Xid]; sp != nil && m.FirstSegment == 1 {
			sp.close() // left from before: the transaction starts anew
			delete(d.spills, m.Xid)
		}
	case *pglogrepl.StreamStopMessageV2:
		d.inStream = false
	case *pglogrepl.StreamAbortMessageV2:
		sp := d.spills[m.Xid]
		switch {
		case sp == nil:
		case m.SubXid == m.Xid || m.SubXid == 0:
			sp.close()
			delete(d.spills, m.Xid)
		default:
			sp.aborted[m.SubXid] = true
			// pgoutput tags a streamed message with the top-level
			// transaction, not with the subtransaction that wrote it: which
			// of them were rolled back cannot be told.
			sp.tainted = sp.tainted || sp.messages > 0
		}
	case *pglogrepl.StreamCommitMessageV2:
		return d.streamCommit(m)
	case *pglogrepl.TruncateMessageV2:
		for _, id := range m.RelationIDs {
			if r := d.rels[id]; r != nil && r.ours {
				s.base.Log.Warn("outboxpgx: ignored a TRUNCATE of the outbox table: truncated rows that were not relayed yet are gone", "table", s.base.Table.String())
				break
			}
		}
	}
	return nil
}

// relation records a relation's columns; a change of the outbox table's
// (DDL) is logged once and otherwise ignored: events are read by column
// name.
func (d *decoder) relation(m *pglogrepl.RelationMessage) {
	s := d.src
	r := &relation{ours: m.Namespace == s.base.Table.Schema && m.RelationName == s.base.Table.Name, col: map[string]int{}}
	names := make([]string, len(m.Columns))
	for i, c := range m.Columns {
		r.col[c.Name] = i
		names[i] = c.Name
	}
	d.rels[m.RelationID] = r
	if !r.ours {
		return
	}
	if d.seen != nil && !slices.Equal(d.seen, names) {
		s.base.Log.Warn("outboxpgx: the outbox table's columns changed (DDL); ignored, events are read by column name",
			"table", s.base.Table.String(), "columns", strings.Join(names, ","))
	}
	d.seen = names
}

// add adds an event written by (sub)transaction xid: to the spill file of
// the streamed transaction being read, or to the transaction being read,
// which goes to the queue in parts once it is large.
func (d *decoder) add(xid uint32, e *event) error {
	if d.inStream {
		sp := d.spills[d.streamed]
		if sp == nil {
			var err error
			if sp, err = newSpill(d.src.cfg.SpillDir); err != nil {
				return err
			}
			d.spills[d.streamed] = sp
		}
		if !e.row {
			sp.messages++
		}
		return sp.add(xid, e)
	}
	if d.cur == nil {
		return nil
	}
	d.cur.events = append(d.cur.events, e)
	if len(d.cur.events) < d.part {
		return nil
	}
	t := d.cur
	d.cur = &txn{xid: t.xid, lsn: t.lsn, commit: t.commit}
	return d.emit(t, true)
}

// streamCommit hands a streamed transaction to the queue, read back from
// its spill file in parts.
func (d *decoder) streamCommit(m *pglogrepl.StreamCommitMessageV2) error {
	sp := d.spills[m.Xid]
	delete(d.spills, m.Xid)
	t := &txn{xid: m.Xid, lsn: m.CommitLSN, commit: m.CommitTime}
	if sp != nil && sp.tainted {
		sp.close()
		return &unstreamError{end: m.TransactionEndLSN}
	}
	if sp != nil {
		defer sp.close()
		err := sp.replay(m.CommitTime, func(e *event) error {
			t.events = append(t.events, e)
			if len(t.events) < d.part {
				return nil
			}
			part := t
			t = &txn{xid: m.Xid, lsn: m.CommitLSN, commit: m.CommitTime}
			return d.emit(part, true)
		})
		if err != nil {
			return err
		}
	}
	t.end = m.TransactionEndLSN
	return d.emit(t, false)
}

// errDelayedCDC dead-letters a row whose deliver_at is still ahead when
// the log-tailing relay reads it and the table's parked events have no
// deliver_at to wait on (a schema before version 14). The dead letter
// keeps the event; under the poison policy hold its aggregate's later
// events wait behind it, so its order holds until an operator retries it.
var errDelayedCDC = errors.New("deliver_at is still ahead and the log-tailing relay cannot park it (the table's schema is before version 14: run outbox migrate); retry this one when it is due")

// delay sets e to wait for at when that is ahead (docs/delayed.md): it is
// parked until then with its aggregate's later events (queue.parkable).
// Before schema version 14 it is dead-lettered instead (errDelayedCDC).
func (s *Source) delay(ctx context.Context, e *event, at time.Time) {
	switch {
	case !at.After(time.Now()):
	case s.parksDelays(ctx):
		e.deliverAt = at
	default:
		e.bad = errDelayedCDC
	}
}

// parksDelays reports whether the parked table has deliver_at (schema
// version 14), so that delayed events can be parked until due.
func (s *Source) parksDelays(ctx context.Context) bool {
	return s.delays.Has(func() (bool, error) {
		var has bool
		err := s.pool.QueryRow(ctx, pgschema.HasColumnSQL, s.cn.Parked, "deliver_at").Scan(&has)
		return has, err
	}, func() {
		s.base.Log.Warn("outboxpgx: the parked table has no deliver_at column (schema before version 14): delayed events are dead-lettered until `outbox migrate` adds it", "table", s.base.Table.String())
	})
}

// row decodes an INSERT into the outbox table.
func (d *decoder) row(r *relation, tup *pglogrepl.TupleData) *event {
	e := &event{row: true, CreatedAt: d.commitAt()}
	get := func(name string) ([]byte, bool) {
		i, ok := r.col[name]
		if !ok || tup == nil || i >= len(tup.Columns) {
			return nil, false
		}
		c := tup.Columns[i]
		if c.DataType != pglogrepl.TupleDataTypeText {
			return nil, false
		}
		return c.Data, true
	}
	str := func(name string) string { b, _ := get(name); return string(b) }
	e.ID, e.AggregateType, e.AggregateID, e.Type = str("id"), str("aggregatetype"), str("aggregateid"), str("type")
	e.TraceContext = str("tracingspancontext")
	if b, ok := get("seq"); ok {
		e.Seq, _ = strconv.ParseInt(string(b), 10, 64)
	}
	if b, ok := get("created_at"); ok {
		var at time.Time
		if err := d.types.Scan(pgtype.TimestamptzOID, pgtype.TextFormatCode, b, &at); err == nil {
			e.CreatedAt = at
		}
	}
	if b, ok := get("deliver_at"); ok {
		var at time.Time
		if err := d.types.Scan(pgtype.TimestamptzOID, pgtype.TextFormatCode, b, &at); err == nil {
			d.src.delay(d.ctx, e, at)
		}
	}
	if b, ok := get("payload"); ok {
		e.Payload = b
	} else if b, ok := get("payload_raw"); ok {
		raw, err := hex.DecodeString(strings.TrimPrefix(string(b), `\x`))
		if err != nil {
			e.bad = fmt.Errorf("payload_raw is not hex bytea text: %v", err)
		}
		e.RawPayload = raw
	}
	if b, ok := get("headers"); ok {
		e.HeadersJSON = b
	}
	return e
}

// message decodes a logical decoding message with the outbox's prefix.
func (d *decoder) message(m *pglogrepl.LogicalDecodingMessage) *event {
	content := bytes.Clone(m.Content)
	ev, err := decodeMessage(content)
	e := &ev
	e.Seq, e.CreatedAt = int64(m.LSN), d.commitAt()
	if err != nil {
		// Dead-lettered with the content as its raw payload.
		e.bad = fmt.Errorf("the message at LSN %s is %w", m.LSN, err)
		e.Payload, e.RawPayload, e.HeadersJSON = nil, content, nil
		if e.ID == "" {
			e.ID = uuid.NewSHA1(uuid.NameSpaceOID, []byte(d.src.prefix+"@"+m.LSN.String())).String()
		}
		e.orphan = outboxdriver.CheckAggregateID(e.AggregateID) != nil || strings.TrimSpace(e.AggregateType) == ""
	}
	return e
}
