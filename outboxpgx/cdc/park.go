package cdc

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Parking (docs/cdc.md#parking). The stream's events of an aggregate held
// behind a dead letter (poison policy hold) cannot be published, and the
// slot may not confirm past them while they exist only in memory: a
// message or an insert+delete row exists nowhere but in the WAL. So they
// are parked: written to the table's _cdc_parked companion, fenced by the
// slot's lease, after which they are done and the slot confirms past them.
// Once the aggregate is no longer held (its dead letter retried and
// published, discarded, or released), its parked events are read back in
// the order they were parked (unpark) and claimed before any of the
// stream's events of the aggregate, which meanwhile are parked behind
// them; each is deleted from the parked table in the transaction that
// records it published or dead-lettered.

// park writes the stream's parkable events to the parked table under the
// slot's lease (epoch), and marks them done: the slot may then confirm past
// them. gen is the stream the caller saw.
func (s *Source) park(ctx context.Context, gen int, epoch int64) error {
	s.mu.Lock()
	if gen != s.gen {
		s.mu.Unlock()
		return nil
	}
	evs := s.queue.parkable(nil, time.Now())
	if len(evs) == 0 {
		s.mu.Unlock()
		return nil
	}
	var lsn pglogrepl.LSN
	if m := s.queue.markIf(evs); m > s.queue.mark {
		lsn = m
	}
	s.mu.Unlock()
	var pb pgx.Batch
	pb.Queue(s.q.fence, s.cfg.Slot, s.base.Cfg.RelayName, epoch, lsnArg(lsn), lsnArg(parkedLSN(evs)))
	s.queuePark(ctx, &pb, evs)
	err := s.pool.SendBatch(ctx, &pb).Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if gen == s.gen {
			for _, e := range evs {
				s.queue.release(e)
			}
		}
		return finishError("park", len(evs), err)
	}
	s.parkedLocked(gen, evs)
	return nil
}

// parkedLocked records in memory that evs were parked. s.mu is held.
func (s *Source) parkedLocked(gen int, evs []*event) {
	// The database holds them whatever stream this is: never count fewer.
	s.queue.parks++
	for _, e := range evs {
		k := e.key()
		if s.queue.parked[k] == 0 && !e.deliverAt.IsZero() {
			s.queue.parkedUntil[k] = e.deliverAt // first in line, and not due
		}
		s.queue.parked[k]++
	}
	if gen != s.gen {
		return
	}
	for _, e := range evs {
		s.queue.done(e)
	}
	if s.queue.advance() {
		s.target = max(s.target, s.queue.mark)
		if s.st != nil {
			s.st.kick()
		}
	}
	if s.st != nil {
		s.st.roomy()
		if s.queue.drainLeft == 0 {
			s.st.kick() // the reader may record the slot drained
		}
	}
}

// unpark reads back the first parked events of the aggregates that have
// some and are no longer held, unless some of theirs are in memory
// already, and queues them ahead of the stream's.
func (s *Source) unpark(ctx context.Context, gen int) error {
	s.mu.Lock()
	if gen != s.gen {
		s.mu.Unlock()
		return nil
	}
	room := s.cfg.MaxPending - s.queue.frontLeft
	now := time.Now()
	var typs, ids []string
	for k, n := range s.queue.parked {
		// An aggregate whose first parked event is delayed waits for it
		// (parkedUntil) without being asked for.
		if _, held := s.queue.held[k]; n > 0 && !held && s.queue.unparking[k] == 0 && !now.Before(s.queue.parkedUntil[k]) {
			typs, ids = append(typs, k.typ), append(ids, k.id)
		}
	}
	parks := s.queue.parks
	s.mu.Unlock()
	if len(typs) == 0 || room <= 0 {
		return nil
	}
	per := max(1, min(drainPage, room/len(typs)))
	sql := s.q.unparkNoDelay
	if s.parksDelays(ctx) {
		sql = s.q.unpark
	}
	rows, err := s.pool.Query(ctx, sql, typs, ids, per)
	if err != nil {
		return fmt.Errorf("outboxpgx: read parked events: %w", err)
	}
	t := &txn{}
	totals := map[aggKey]int{}
	waits := map[aggKey]time.Time{}
	for rows.Next() {
		var k aggKey
		var total int
		var due *time.Time
		var id, typ, aid, ty, payload, headers, tc, bad *string
		var raw []byte
		var seq, xid *int64
		var createdAt *time.Time
		var isRow *bool
		if err := rows.Scan(&k.typ, &k.id, &total, &due, &id, &typ, &aid, &ty, &payload, &raw, &headers,
			&tc, &seq, &createdAt, &bad, &isRow, &xid); err != nil {
			rows.Close()
			return fmt.Errorf("outboxpgx: read parked events: %w", err)
		}
		totals[k] = total
		if due != nil {
			waits[k] = *due
		}
		if id == nil {
			continue // none of the aggregate's is due
		}
		e := &event{ID: *id, AggregateType: *typ, AggregateID: *aid, Type: *ty, RawPayload: raw, TraceContext: *tc,
			Seq: *seq, CreatedAt: *createdAt, row: *isRow, pxid: uint32(*xid)}
		if payload != nil {
			e.Payload, e.RawPayload = []byte(*payload), nil
		}
		if headers != nil {
			e.HeadersJSON = []byte(*headers)
		}
		if *bad != "" {
			e.bad = errors.New(*bad)
		}
		t.events = append(t.events, e)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("outboxpgx: read parked events: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen != s.gen {
		return nil
	}
	for i := range typs {
		k := aggKey{typs[i], ids[i]}
		// What the table holds, unless more were parked while the query
		// ran: never count fewer than there are.
		if parks == s.queue.parks {
			s.queue.parked[k] = totals[k]
		} else {
			s.queue.parked[k] = max(s.queue.parked[k], totals[k])
		}
		if at, ok := waits[k]; ok {
			s.queue.parkedUntil[k] = at
		} else {
			delete(s.queue.parkedUntil, k)
		}
		if s.queue.parked[k] == 0 {
			delete(s.queue.parked, k)
			delete(s.queue.parkedUntil, k)
		}
	}
	if len(t.events) > 0 {
		s.queue.pushFront(t)
		s.signal()
	}
	return nil
}

// parkedLSN is the newest commit of evs: replays up to it check whether
// their events are done already (needsCheck).
func parkedLSN(evs []*event) pglogrepl.LSN {
	var l pglogrepl.LSN
	for _, e := range evs {
		l = max(l, e.tx.lsn)
	}
	return l
}

// queuePark queues the park insert of evs on pb: with their deliver_at
// when the parked table has it (schema version 14).
func (s *Source) queuePark(ctx context.Context, pb *pgx.Batch, evs []*event) {
	args := parkArgs(evs)
	if !s.parksDelays(ctx) {
		pb.Queue(s.q.parkNoDelay, args[:len(args)-1]...)
		return
	}
	pb.Queue(s.q.park, args...)
}

// parkArgs are the arguments of the park insert, deliver_at last.
func parkArgs(evs []*event) []any {
	n := len(evs)
	ids, ats, aids, tys := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	ps, hs, tcs, bads := make([]*string, n), make([]*string, n), make([]string, n), make([]string, n)
	raws := make([][]byte, n)
	seqs, xids := make([]int64, n), make([]int64, n)
	cas := make([]time.Time, n)
	rows := make([]bool, n)
	lsns := make([]string, n)
	dues := make([]pgtype.Timestamptz, n)
	for i, e := range evs {
		dues[i] = pgtype.Timestamptz{Time: e.deliverAt, Valid: !e.deliverAt.IsZero()}
		ids[i], ats[i], aids[i], tys[i] = e.ID, pgText(e.AggregateType), pgText(e.AggregateID), pgText(e.Type)
		switch {
		case e.Payload != nil && storable(e.Payload):
			ps[i] = pgschema.NullText(e.Payload)
		case e.Payload != nil:
			raws[i] = e.Payload // published the same; only a dead letter would tell
		default:
			raws[i] = e.RawPayload
		}
		if len(e.HeadersJSON) > 0 && storable(e.HeadersJSON) {
			hs[i] = pgschema.NullText(e.HeadersJSON)
		}
		tcs[i] = pgText(e.TraceContext)
		if e.bad != nil {
			bads[i] = pgText(e.bad.Error())
		}
		seqs[i], cas[i], rows[i], xids[i] = e.Seq, e.CreatedAt, e.row, e.xid()
		lsns[i] = e.tx.lsn.String()
	}
	return []any{pgschema.UUIDArray(ids), ats, aids, tys, ps, raws, hs, tcs, seqs, cas, bads, rows, xids, lsns, dues}
}

// storable reports whether b can be stored as PostgreSQL text as it is.
func storable(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, c := range b {
		if c == 0 {
			return false
		}
	}
	return true
}

// finishError wraps the error of a fenced write of n events (what: the
// kind of write), saying when the lease was lost.
func finishError(what string, n int, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Hint == "outbox-lease-lost" {
		return fmt.Errorf("outboxpgx: %s %d events: %w: %s", what, n, outboxdriver.ErrLeaseLost, pgErr.Message)
	}
	return fmt.Errorf("outboxpgx: %s %d events: %w", what, n, err)
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
