package cdc

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/mysqlbinlog"
	"github.com/outboxkit/outbox/outboxdriver"
)

// restartWait bounds how long a claim waits for a stream started after a
// failure to read (or to fail).
const restartWait = time.Second

// Claim hands out up to limit events whose transactions have committed,
// in commit order, none of an aggregate whose earlier event is still in
// flight, waiting for a retry or held behind a dead letter. Under a
// lease it does not stream yet, it starts the stream and returns what is
// read so far, often nothing. While streaming fails, claims fail: a
// claim that finds the stream ended returns why (once it had read) and
// the next starts it again.
func (s *Source) Claim(ctx context.Context, leases []outboxdriver.Lease, limit int) (outboxdriver.Batch, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("outboxmysql: claim limit %d must be positive", limit)
	}
	b := &batch{src: s, BatchState: driverkit.NewBatchState("outboxmysql", leases)}
	if len(leases) == 0 {
		return b, nil
	}
	l := leases[0]
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errors.New("outboxmysql: claim: the binlog source is closed")
	}
	if s.st != nil && s.st.epoch != l.Epoch {
		s.mu.Unlock()
		s.stopStream() // streamed under an older lease
		s.mu.Lock()
	}
	st := s.st
	if st != nil && st.ended() {
		wasUp := st.isUp()
		if st.err != nil {
			s.failed = st.err
		}
		s.st = nil
		s.resetLocked()
		if wasUp && st.err != nil {
			s.mu.Unlock()
			return nil, st.err
		}
		st = nil
	}
	if st == nil {
		s.startStream(l)
		st = s.st
		if s.failed == nil {
			s.mu.Unlock()
			return b, nil
		}
	}
	failed := s.failed
	s.mu.Unlock()
	if failed != nil {
		t := time.NewTimer(restartWait)
		select {
		case <-st.up:
			s.mu.Lock()
			if s.st == st {
				s.failed = nil
			}
			s.mu.Unlock()
		case <-st.done:
			t.Stop()
			if !st.isUp() {
				return nil, st.err
			}
		case <-t.C:
			return nil, failed
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
		t.Stop()
	}
	s.mu.Lock()
	if s.st != st {
		s.mu.Unlock()
		return b, nil
	}
	evs := s.queue.claim(limit, time.Now(), partitionsOf(leases))
	gen, until := s.gen, s.replayUntil
	s.mu.Unlock()
	if s.cfg.Mode == ModeTable && until.File != "" {
		var err error
		if evs, err = s.skipDone(ctx, gen, evs, until); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen != s.gen {
		return b, nil // the stream restarted meanwhile
	}
	b.gen, b.epoch, b.events = s.gen, l.Epoch, evs
	if len(evs) > 0 {
		b.Open()
		b.Recs = make([]outboxdriver.Record, len(evs))
		for i, e := range evs {
			b.Recs[i] = e.rec
		}
	}
	return b, nil
}

// skipDone drops from evs, as done, the events read again after a
// restart (of transactions up to until, the last owner's high-water mark)
// whose rows are no longer unpublished in the table: published or
// dead-lettered before the restart. Those transactions committed long
// before, so their rows are visible.
func (s *Source) skipDone(ctx context.Context, gen int, evs []*event, until mysqlbinlog.Position) ([]*event, error) {
	var check []*event
	for _, e := range evs {
		if e.tx != nil && e.tx.end.File != "" && !after(e.tx.end, until) {
			check = append(check, e)
		}
	}
	if len(check) == 0 {
		return evs, nil
	}
	pending := map[string]bool{}
	for c := range chunks(check) {
		args := make([]any, len(c))
		for i, e := range c {
			args[i] = e.rec.ID
		}
		rows, err := s.db.QueryContext(ctx, `SELECT id FROM `+s.n.Table+` WHERE published_at IS NULL AND id IN (`+placeholders(len(c))+`)`, args...)
		if err == nil {
			for rows.Next() {
				var id string
				if err = rows.Scan(&id); err != nil {
					break
				}
				pending[id] = true
			}
			err = errors.Join(err, rows.Err(), rows.Close())
		}
		if err != nil {
			s.mu.Lock()
			if gen == s.gen {
				for _, e := range evs {
					s.queue.release(e)
				}
			}
			s.mu.Unlock()
			return nil, fmt.Errorf("outboxmysql: claim: look up replayed rows: %w", err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen != s.gen {
		return nil, nil
	}
	kept := evs[:0]
	skipped := 0
	for _, e := range evs {
		if !pending[e.rec.ID] && e.tx != nil && e.tx.end.File != "" && !after(e.tx.end, until) {
			s.queue.done(e)
			skipped++
			continue
		}
		kept = append(kept, e)
	}
	if skipped > 0 {
		s.queue.advance()
		if s.st != nil {
			s.st.roomy()
		}
	}
	return kept, nil
}

// partitionsOf returns which partitions leases name; nil when they name
// all.
func partitionsOf(leases []outboxdriver.Lease) *[numPartitions]bool {
	if len(leases) >= numPartitions {
		return nil
	}
	var in [numPartitions]bool
	for _, l := range leases {
		if l.Partition >= 0 && l.Partition < numPartitions {
			in[l.Partition] = true
		}
	}
	return &in
}

// batch is a claim of a binlog source: events held in memory, claimed
// until the outcome is recorded.
type batch struct {
	driverkit.BatchState
	src    *Source
	events []*event
	gen    int
	epoch  int64
}

// Finish records the outcome in one transaction, fenced by the lease:
// published rows are marked (or deleted, per retention) in table mode,
// dead letters written (and their rows removed), holds recorded, and the
// saved position moved past the transactions now wholly done. Retries
// wait in memory. If the lease was lost, nothing is recorded and Finish
// wraps ErrLeaseLost.
func (b *batch) Finish(ctx context.Context, out outboxdriver.Outcome) error {
	if len(b.events) == 0 {
		b.Release(ctx)
		return nil
	}
	if ok, err := b.StartFinish(); !ok {
		return err
	}
	s := b.src
	byID := make(map[string][]*event, len(b.events))
	for _, e := range b.events {
		byID[e.rec.ID] = append(byID[e.rec.ID], e)
	}
	plan := driverkit.PlanOf(out)
	// A dead letter is kept under its event's id: an event whose id the
	// dead letters hold for another event (a reused id; or two events of
	// the batch with one id) is kept, retried a minute later, not dropped.
	kept, err := b.deadLetterClashes(ctx, &plan, byID)
	if err != nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		return b.abandonLocked(err)
	}
	var finished []*event
	for _, id := range plan.Published {
		finished = append(finished, byID[id]...)
	}
	for _, f := range plan.DeadLetters {
		for _, e := range byID[f.ID] {
			if !kept[e] {
				finished = append(finished, e)
			}
		}
	}
	s.mu.Lock()
	current := b.gen == s.gen
	var mark mysqlbinlog.Position
	var gtid string
	if current {
		mark, gtid = s.queue.markIf(finished)
	}
	s.mu.Unlock()

	err = driverkit.InTx(ctx, s.db, &sql.TxOptions{Isolation: sql.LevelReadCommitted}, func(tx *sql.Tx) error {
		if err := s.fence(ctx, tx, b.epoch); err != nil {
			return err
		}
		return b.record(ctx, tx, plan, byID, kept, mark, gtid)
	})

	s.mu.Lock()
	defer s.mu.Unlock()
	current = b.gen == s.gen
	if err != nil {
		return b.abandonLocked(err)
	}
	if mark.File != "" && after(mark, s.saved.pos) {
		s.saved = savedPos{mark, gtid}
	}
	if !current {
		return nil // the stream restarted meanwhile: it reads these events again
	}
	for _, e := range finished {
		s.queue.done(e)
		if s.queue.held[e.key()] == e.rec.ID {
			delete(s.queue.held, e.key())
		}
	}
	for _, f := range plan.DeadLetters {
		if f.Hold {
			for _, e := range byID[f.ID] {
				if !kept[e] {
					s.queue.held[e.key()] = f.ID
				}
			}
		}
	}
	now := time.Now()
	for _, f := range plan.Retries {
		for _, e := range byID[f.ID] {
			e.rec.Attempts++
			e.due = now.Add(f.RetryAfter)
		}
	}
	for e := range kept {
		e.rec.Attempts++
		e.due = now.Add(driverkit.DeadLetterClashDelay)
	}
	for _, e := range b.events {
		s.queue.release(e)
	}
	s.queue.advance()
	if s.st != nil {
		s.st.roomy()
	}
	s.signal()
	return nil
}

// record runs the outcome's statements in tx.
func (b *batch) record(ctx context.Context, tx *sql.Tx, plan driverkit.Plan, byID map[string][]*event, kept map[*event]bool, mark mysqlbinlog.Position, gtid string) error {
	s := b.src
	n := &s.n
	exec := func(q string, args ...any) error {
		_, err := tx.ExecContext(ctx, q, args...)
		return err
	}
	table := s.cfg.Mode == ModeTable
	for ids := range chunks(plan.Published) {
		in, args := placeholders(len(ids)), strs(ids)
		if table {
			var err error
			if s.base.Cfg.Retention == outboxdriver.RetentionKeep {
				err = exec(`UPDATE `+n.Table+` SET published_at = UTC_TIMESTAMP(6), last_error = NULL, next_attempt_at = NULL WHERE id IN (`+in+`)`, args...)
			} else {
				err = exec(`DELETE FROM `+n.Table+` WHERE id IN (`+in+`)`, args...)
			}
			if err != nil {
				return err
			}
		}
		if err := exec(`DELETE FROM `+n.Held+` WHERE event_id IN (`+in+`)`, args...); err != nil {
			return err
		}
	}
	var deadIDs []string
	for _, f := range plan.DeadLetters {
		i := slices.IndexFunc(byID[f.ID], func(e *event) bool { return !kept[e] })
		if i < 0 {
			continue // every event with the id is kept
		}
		deadIDs = append(deadIDs, f.ID)
		for _, e := range byID[f.ID][i : i+1] {
			headers := e.headers
			if headers == nil || e.rec.HeadersErr != nil {
				headers = []byte("{}")
			}
			var payload any
			if e.payload != nil {
				payload = string(e.payload)
			}
			// Once only (an event read again after a crash may be
			// dead-lettered already under its seq; deadLetterClashes kept
			// an event whose id is held under another), without the UPDATE privilege an
			// ON DUPLICATE KEY UPDATE needs: the relay's grants give
			// SELECT and INSERT (internal/grants), and the lease's row
			// lock keeps any other streamer out of this transaction.
			if err := exec(`INSERT INTO `+n.DeadLetter+` (id, aggregatetype, aggregateid, type, payload, seq, created_at,
    headers, tracingspancontext, payload_raw, attempts, last_error, held)
SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? FROM DUAL WHERE NOT EXISTS (SELECT 1 FROM `+n.DeadLetter+` WHERE id = ?)`,
				e.rec.ID, e.rec.AggregateType, e.rec.AggregateID, e.rec.Type, payload, e.rec.Seq, e.rec.CreatedAt,
				string(headers), nullString(e.rec.TraceContext), e.raw, e.rec.Attempts+1, driverkit.ErrorText(f.Err), f.Hold, e.rec.ID); err != nil {
				return err
			}
			if f.Hold {
				if err := exec(`INSERT INTO `+n.Held+` (aggregatetype, aggregateid, seq, event_id, reason) VALUES (?, ?, ?, ?, 'dead-lettered')
ON DUPLICATE KEY UPDATE event_id = VALUES(event_id), seq = VALUES(seq), reason = VALUES(reason), held_at = UTC_TIMESTAMP(6)`,
					e.rec.AggregateType, e.rec.AggregateID, e.rec.Seq, e.rec.ID); err != nil {
					return err
				}
			}
		}
	}
	if len(deadIDs) > 0 && table {
		for c := range chunks(deadIDs) {
			if err := exec(`DELETE FROM `+n.Table+` WHERE id IN (`+placeholders(len(c))+`)`, strs(c)...); err != nil {
				return err
			}
		}
	}
	for c := range chunks(plan.Flow) {
		if err := exec(`DELETE FROM `+n.Held+` WHERE event_id IN (`+placeholders(len(c))+`)`, strs(c)...); err != nil {
			return err
		}
	}
	var hwm mysqlbinlog.Position
	for _, es := range byID {
		for _, e := range es {
			if e.tx != nil && e.tx.end.File != "" && after(e.tx.end, hwm) {
				hwm = e.tx.end
			}
		}
	}
	if hwm.File != "" && (len(plan.Published) > 0 || len(plan.DeadLetters) > 0) {
		if err := s.saveHWM(ctx, tx, hwm); err != nil {
			return err
		}
	}
	if mark.File != "" {
		return s.save(ctx, tx, mark, gtid)
	}
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

// Pauses reads the pauses in force: a batch holds no connection.
func (b *batch) Pauses(ctx context.Context) ([]outboxdriver.Pause, error) {
	return b.src.Pauses(ctx)
}

const chunk = 1000

func placeholders(n int) string { return strings.TrimSuffix(strings.Repeat("?, ", n), ", ") }

func strs(xs []string) []any {
	out := make([]any, len(xs))
	for i, x := range xs {
		out[i] = x
	}
	return out
}

func chunks[T any](xs []T) func(yield func([]T) bool) {
	return func(yield func([]T) bool) {
		for len(xs) > 0 {
			n := min(len(xs), chunk)
			if !yield(xs[:n]) {
				return
			}
			xs = xs[n:]
		}
	}
}

// abandonLocked makes the batch's events claimable again after its
// outcome could not be recorded, and wraps err. s.mu is held.
func (b *batch) abandonLocked(err error) error {
	s := b.src
	if b.gen == s.gen {
		for _, e := range b.events {
			s.queue.release(e)
		}
	}
	s.signal()
	return fmt.Errorf("outboxmysql: finish batch of %d: %w", len(b.events), err)
}

// deadLetterClashes asks the dead-letter table for the seqs under the ids
// of plan's dead letters and returns the events that must not go there
// (driverkit.ClashingEvents); an id all of whose events are kept leaves
// plan's Hold and Flow. It logs the ids it keeps.
func (b *batch) deadLetterClashes(ctx context.Context, plan *driverkit.Plan, byID map[string][]*event) (map[*event]bool, error) {
	if len(plan.DeadLetters) == 0 {
		return nil, nil
	}
	s := b.src
	ids := driverkit.FailureIDs(plan.DeadLetters)
	held := map[string][]int64{}
	for c := range chunks(ids) {
		rows, err := s.db.QueryContext(ctx, `SELECT id, seq FROM `+s.n.DeadLetter+` WHERE id IN (`+placeholders(len(c))+`)`, strs(c)...)
		if err != nil {
			return nil, err
		}
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
	}
	kept, keptIDs, whole := driverkit.ClashingEvents(ids, held, byID, func(e *event) int64 { return e.rec.Seq })
	plan.DropHoldAndFlow(whole)
	driverkit.LogClashes(s.base.Log, s.base.Table, keptIDs)
	return kept, nil
}
