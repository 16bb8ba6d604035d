package cdc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

	// up is closed once the stream reads: it streams from the slot, or
	// reads the rows a new slot does not hold. The database answered
	// every step before.
	up     chan struct{}
	upOnce sync.Once

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

// markUp records that the stream reads: it no longer fails, and claims
// pass again after a stream that failed.
func (st *stream) markUp() {
	st.upOnce.Do(func() {
		s := st.src
		s.mu.Lock()
		if st.current() {
			s.failed = nil
		}
		s.mu.Unlock()
		close(st.up)
	})
}

// awaitUp waits, after a stream failed (failed is its error), until st
// reads, and returns nil; or until st ends, and returns why; or for at
// most restartWait, and returns failed: claims fail while log tailing
// does not work, so that the relay sees one outage rather than a failure
// and a success at every restart.
func (st *stream) awaitUp(ctx context.Context, failed error) error {
	t := time.NewTimer(restartWait)
	defer t.Stop()
	select {
	case <-st.up:
		return nil
	case <-st.done:
		select {
		case <-st.up: // up, then ended: the next claim returns why
			return nil
		default:
		}
		return st.err
	case <-t.C:
		return failed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// restartWait bounds how long a claim waits for a stream started after a
// failure to read (or to fail): at most the relay's backoff, so that claims
// go on at its pace while a restart takes long (a drain, a stale streamer
// to stop).
const restartWait = time.Second

// isUp reports whether the stream read.
func (st *stream) isUp() bool {
	select {
	case <-st.up:
		return true
	default:
		return false
	}
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
	st := &stream{src: s, epoch: l.Epoch, cancel: cancel, done: make(chan struct{}), up: make(chan struct{}), room: make(chan struct{}, 1)}
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
			// The next claim returns err: the relay logs it, once per
			// outage.
			s.base.Log.Debug("outboxpgx: log tailing stopped", "slot", s.cfg.Slot, "err", err)
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

// run sets up and reads the stream until ctx ends or it fails. Meanwhile
// it records the backlog about every second (recordBacklog).
func (st *stream) run(ctx context.Context) error {
	s := st.src
	rctx, cancel := context.WithCancel(ctx)
	recorded := make(chan struct{})
	go func() {
		defer close(recorded)
		st.recordBacklog(rctx)
	}()
	defer func() {
		cancel()
		<-recorded
	}()
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
		st.markUp()
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

// recordBacklog records, every pgschema.BacklogRecordEvery until ctx ends
// or the stream is no longer the source's, the events decoded and not
// done that are not rows of the table, and the commit time of the oldest
// of them, in the slot's row of the _cdc table (under the stream's
// epoch: a stale streamer records nothing), for `outbox status`, the
// console and the metrics of every relay (docs/cdc.md). One small UPDATE
// a second, apart from the stream: the reader never waits for it.
func (st *stream) recordBacklog(ctx context.Context) {
	s := st.src
	tick := time.NewTicker(pgschema.BacklogRecordEvery)
	defer tick.Stop()
	for {
		s.mu.Lock()
		cur := st.current()
		n, oldest := s.queue.wal, s.queue.oldestWAL()
		s.mu.Unlock()
		if !cur {
			return
		}
		if s.recordsBacklog(ctx) {
			var at any
			if !oldest.IsZero() {
				at = oldest
			}
			_, err := s.pool.Exec(ctx, s.q.backlog, s.cfg.Slot, s.base.Cfg.RelayName, st.epoch, s.cfg.Mode.String(), n, at)
			if err != nil && ctx.Err() == nil {
				// The next tick tries again; `outbox status` says the
				// record is stale meanwhile.
				s.base.Log.Debug("outboxpgx: record the backlog of the replication slot", "slot", s.cfg.Slot, "err", err)
			}
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}

// recordsBacklog reports whether the _cdc table has the backlog columns
// (schema version 22).
func (s *Source) recordsBacklog(ctx context.Context) bool {
	return s.backlog.Has(func() (bool, error) {
		var has bool
		err := s.pool.QueryRow(ctx, pgschema.HasColumnSQL, s.cn.State, "backlog_events").Scan(&has)
		return has, err
	}, func() {
		s.base.Log.Warn("outboxpgx: the _cdc table has no backlog columns (schema before version 22): `outbox status` and the backlog metrics do not count the events decoded from the WAL until `outbox migrate` adds them", "table", s.base.Table.String())
	})
}
