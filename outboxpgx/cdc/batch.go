package cdc

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// batch is a claim of a CDC source: events held in memory, marked
// claimed until the outcome is recorded.
type batch struct {
	driverkit.BatchState
	src    *Source
	events []*event
	gen    int
	epoch  int64
}

// Finish records the outcome in one implicit transaction, fenced by the
// slot's lease: published rows are deleted (or marked, with retention
// keep), dead letters are written to the dead-letter table (and their rows
// removed), and the LSN the slot may confirm is recorded. Only once that
// committed does the stream confirm it. Retries wait in memory. If the
// lease was lost, nothing is recorded and Finish wraps ErrLeaseLost.
func (b *batch) Finish(ctx context.Context, out outboxdriver.Outcome) error {
	if ok, err := b.StartFinish(); !ok {
		return err
	}
	s := b.src
	byID := make(map[string][]*event, len(b.events))
	for _, e := range b.events {
		byID[e.ID] = append(byID[e.ID], e)
	}
	plan := driverkit.PlanOf(out)
	// A dead letter is kept under its event's id: an event whose id the
	// dead letters hold for another event (a reused id; or two events of
	// the batch with one id) is kept, retried a minute later, not dropped.
	kept, err := s.deadLetterClashes(ctx, &plan, byID)
	if err != nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		return b.abandonLocked(err, nil)
	}
	var finished []*event
	var rowIDs []string
	var rowXids, rowSeqs []int64
	var unhold []string
	var unparked []string
	s.mu.Lock()
	for _, id := range plan.Published {
		for _, e := range byID[id] {
			finished = append(finished, e)
			if e.row {
				rowIDs, rowXids, rowSeqs = append(rowIDs, id), append(rowXids, e.xid()), append(rowSeqs, e.Seq)
			}
			if e.tx.front {
				unparked = append(unparked, id)
			}
			if s.queue.held[e.key()] == id {
				unhold = append(unhold, id)
			}
		}
	}
	var dead []*event
	var deadErr []string
	var deadHold []bool
	var deadRows []string
	var deadXids, deadSeqs []int64
	var deadLSN pglogrepl.LSN
	var holdIDs []string
	hold := map[aggKey]string{}
	for _, f := range plan.DeadLetters {
		for _, e := range byID[f.ID] {
			if kept[e] {
				continue
			}
			finished = append(finished, e)
			dead = append(dead, e)
			deadErr = append(deadErr, driverkit.ErrorText(f.Err))
			deadHold = append(deadHold, f.Hold && !e.orphan)
			if f.Hold && !e.orphan {
				holdIDs = append(holdIDs, f.ID)
				hold[e.key()] = f.ID
			}
			if e.row {
				deadRows, deadXids, deadSeqs = append(deadRows, f.ID), append(deadXids, e.xid()), append(deadSeqs, e.Seq)
			}
			if e.tx.front {
				unparked = append(unparked, f.ID)
			}
			deadLSN = max(deadLSN, e.tx.lsn)
		}
	}
	var lsn pglogrepl.LSN
	var park []*event
	sameGen := b.gen == s.gen
	if sameGen {
		// The aggregates held from now on park the stream's events behind
		// their dead letters in the same transaction.
		if len(hold) > 0 {
			park = s.queue.parkable(hold, time.Now())
			deadLSN = max(deadLSN, parkedLSN(park))
		}
		if m := s.queue.markIf(slices.Concat(finished, park)); m > s.queue.mark {
			lsn = m
		}
	}
	s.mu.Unlock()

	var pb pgx.Batch
	pb.Queue(s.q.fence, s.cfg.Slot, s.base.Cfg.RelayName, b.epoch, lsnArg(lsn), lsnArg(deadLSN))
	if len(unparked) > 0 {
		pb.Queue(s.q.unparked, pgschema.UUIDArray(unparked))
	}
	if len(rowIDs) > 0 {
		pb.Queue(s.q.mark, pgschema.UUIDArray(rowIDs), rowXids, s.base.Cfg.Retention == outboxdriver.RetentionKeep, rowSeqs)
	}
	if len(unhold) > 0 {
		pb.Queue(s.q.unhold, pgschema.UUIDArray(unhold))
	}
	if len(dead) > 0 {
		pb.Queue(s.q.deadLetter, deadArgs(dead, deadErr, deadHold)...)
		if len(deadRows) > 0 {
			pb.Queue(s.q.mark, pgschema.UUIDArray(deadRows), deadXids, false, deadSeqs)
		}
		if len(holdIDs) > 0 {
			pb.Queue(s.q.holdDead, pgschema.UUIDArray(holdIDs))
		}
		if len(plan.Flow) > 0 {
			pb.Queue(s.q.unhold, pgschema.UUIDArray(plan.Flow))
		}
	}
	if len(park) > 0 {
		s.queuePark(ctx, &pb, park)
	}
	// One implicit transaction: the statements of a batch sent without
	// BEGIN commit together or not at all. A transaction the stream sent
	// may not be visible for a moment yet (cq.mark): then again.
	err = s.pool.SendBatch(ctx, &pb).Close()
	for wait := time.Millisecond; notVisible(err) && wait < 2*time.Second; wait *= 2 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		// A fresh batch: a sent one keeps the statements it prepared on
		// its connection, and the pool may hand out another.
		var again pgx.Batch
		for _, q := range pb.QueuedQueries {
			again.Queue(q.SQL, q.Arguments...)
		}
		err = s.pool.SendBatch(ctx, &again).Close()
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	current := b.gen == s.gen
	if err != nil {
		return b.abandonLocked(err, park)
	}
	if len(park) > 0 {
		s.parkedLocked(b.gen, park)
	}
	if !current {
		return nil // the stream restarted meanwhile: it replays these events
	}
	for _, e := range finished {
		s.queue.done(e)
	}
	for _, f := range plan.DeadLetters {
		if f.Hold {
			for _, e := range byID[f.ID] {
				if !e.orphan {
					s.queue.held[e.key()] = f.ID
				}
			}
		}
	}
	for _, id := range unhold {
		for _, e := range byID[id] {
			if s.queue.held[e.key()] == id {
				delete(s.queue.held, e.key())
			}
		}
	}
	now := time.Now()
	for _, f := range plan.Retries {
		for _, e := range byID[f.ID] {
			s.queue.retry(e, now.Add(f.RetryAfter))
		}
	}
	for e := range kept {
		s.queue.retry(e, now.Add(driverkit.DeadLetterClashDelay))
	}
	for _, e := range b.events {
		s.queue.release(e) // neither published nor failed: untouched
	}
	if s.queue.advance() {
		s.target = max(s.target, s.queue.mark)
		if s.st != nil {
			s.st.kick()
		}
	}
	if s.st != nil && len(finished) > 0 {
		s.st.roomy()
		if s.queue.drainLeft == 0 && slices.ContainsFunc(finished, func(e *event) bool { return e.tx.drain }) {
			s.st.kick() // the reader records the slot drained
		}
	}
	s.signal()
	return nil
}

// Release makes the batch's events claimable again, untouched.
func (b *batch) Release(context.Context) {
	if !b.StartRelease() {
		return
	}
	s := b.src
	s.mu.Lock()
	if b.gen == s.gen {
		for _, e := range b.events {
			s.queue.release(e)
		}
	}
	s.mu.Unlock()
	s.signal()
}

// Pauses reads the pauses in force through the batch's source: a batch
// of log tailing holds no connection while its events are published.
func (b *batch) Pauses(ctx context.Context) ([]outboxdriver.Pause, error) {
	return b.src.Pauses(ctx)
}

// notVisible reports whether err says that rows of a transaction the
// stream sent are not visible yet.
func notVisible(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Hint == "outbox-not-visible"
}

// lsnArg is an LSN as a pg_lsn argument; 0 is NULL.
func lsnArg(l pglogrepl.LSN) any {
	if l == 0 {
		return nil
	}
	return l.String()
}

// deadArgs are the arguments of the dead-letter insert.
func deadArgs(evs []*event, errs []string, hold []bool) []any {
	n := len(evs)
	ids, ats, aids, tys := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	ps, hs, tcs := make([]*string, n), make([]*string, n), make([]*string, n)
	seqs, atts := make([]int64, n), make([]int32, n)
	cas := make([]time.Time, n)
	raws := make([][]byte, n)
	for i, e := range evs {
		ids[i], ats[i], aids[i], tys[i] = e.ID, pgText(e.AggregateType), pgText(e.AggregateID), pgText(e.Type)
		ps[i], raws[i], tcs[i] = pgschema.NullText(e.Payload), e.RawPayload, pgschema.NullText([]byte(pgText(e.TraceContext)))
		if len(e.HeadersJSON) > 0 && e.bad == nil {
			hs[i] = pgschema.NullText(e.HeadersJSON)
		}
		seqs[i], atts[i], cas[i] = e.Seq, int32(e.attempts+1), e.CreatedAt
	}
	return []any{pgschema.UUIDArray(ids), ats, aids, tys, ps, seqs, cas, hs, tcs, raws, atts, errs, hold}
}

// pgText makes s storable as PostgreSQL text: valid UTF-8, no NUL.
func pgText(s string) string {
	return strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "?")
}

// abandonLocked makes the batch's events, and extra, claimable again
// after its outcome could not be recorded, and wraps err. s.mu is held.
func (b *batch) abandonLocked(err error, extra []*event) error {
	s := b.src
	if b.gen == s.gen {
		for _, e := range slices.Concat(b.events, extra) {
			s.queue.release(e)
		}
	}
	s.signal()
	return finishError("finish a batch of", len(b.events), err)
}

// deadLetterClashes asks the dead-letter table for the seqs under the ids
// of plan's dead letters and returns the events that must not go there
// (driverkit.ClashingEvents); an id all of whose events are kept leaves
// plan's Hold and Flow. It logs the ids it keeps.
func (s *Source) deadLetterClashes(ctx context.Context, plan *driverkit.Plan, byID map[string][]*event) (map[*event]bool, error) {
	if len(plan.DeadLetters) == 0 {
		return nil, nil
	}
	ids := make([]string, 0, len(plan.DeadLetters))
	for _, f := range plan.DeadLetters {
		ids = append(ids, f.ID)
	}
	rows, err := s.pool.Query(ctx, s.q.deadLetterSeqs, pgschema.UUIDArray(ids))
	if err != nil {
		return nil, err
	}
	held := map[string][]int64{}
	for rows.Next() {
		var id string
		var seq int64
		if err := rows.Scan(&id, &seq); err != nil {
			rows.Close()
			return nil, err
		}
		held[id] = append(held[id], seq)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	kept, keptIDs, whole := driverkit.ClashingEvents(ids, held, byID, func(e *event) int64 { return e.Seq })
	plan.DropHoldAndFlow(whole)
	driverkit.LogClashes(s.base.Log, s.base.Table, keptIDs)
	return kept, nil
}
