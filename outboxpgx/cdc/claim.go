package cdc

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// numPartitions is how many partitions a CDC source presents its slot as
// (the most lanes a relay may have). One lease, the slot's, covers them
// all: whoever holds it holds every one, with the same epoch. Each
// aggregate hashes into one of them, so that the relay's lanes
// (relay.Config.Lanes) keep batches of different aggregates in flight at
// once while it works off a backlog, as they do for polling, and an
// aggregate's events never are in two batches at once.
const numPartitions = 64

// partitionOf is the partition of aggregate k.
func partitionOf(k aggKey) int {
	h := fnv.New32a()
	h.Write([]byte(k.typ))
	h.Write([]byte{0})
	h.Write([]byte(k.id))
	return int(h.Sum32() % numPartitions)
}

// Claim hands out up to limit events of the leased partitions whose
// transactions have committed, in commit order, none of an aggregate whose
// earlier event is still in flight (in this or another batch), waiting for
// a retry or held behind a dead letter. Under a lease
// it does not stream yet, it starts the stream (which first creates what
// is missing) and returns what is decoded so far, often nothing.
//
// Once a stream failed, claims fail until log tailing works again: a
// claim that finds the stream ended starts it again and waits (up to
// restartWait) until the new one reads, streaming from the slot or
// reading the table, and fails with the error that ended the stream
// meanwhile. A claim passes only when the database answered the stream's
// set-up, not from memory while it is down: the relay judges an outage by
// the claims (docs/operations.md, Logs during outages). The claim that
// finds a stream ended that did read returns why at once, and the next one
// starts it again.
func (s *Source) Claim(ctx context.Context, leases []outboxdriver.Lease, limit int) (outboxdriver.Batch, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("outboxpgx: claim limit %d must be positive", limit)
	}
	b := &batch{src: s, BatchState: driverkit.NewBatchState("outboxpgx", leases)}
	if len(leases) == 0 {
		return b, nil
	}
	l := leases[0]
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errors.New("outboxpgx: claim: the CDC source is closed")
	}
	st := s.st
	if st != nil && st.epoch != l.Epoch {
		s.mu.Unlock()
		s.stopStream() // streamed under an older lease
		s.mu.Lock()
		st = s.st
	}
	if st != nil && st.ended() {
		wasUp := st.isUp()
		if st.err != nil {
			s.failed = st.err
		}
		s.st = nil
		s.resetLocked()
		if wasUp && st.err != nil {
			// A stream that read broke: say why, once; the next claim
			// starts it again.
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
		if err := st.awaitUp(ctx, failed); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	if s.st != st {
		s.mu.Unlock()
		return b, nil // stopped meanwhile
	}
	gen := s.gen
	s.mu.Unlock()
	if err := s.park(ctx, gen, l.Epoch); err != nil {
		return nil, err
	}
	if err := s.unpark(ctx, gen); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if gen != s.gen {
		s.mu.Unlock()
		return b, nil // the stream restarted meanwhile
	}
	evs := s.queue.claim(limit, time.Now(), partitionsOf(leases))
	b.gen, b.epoch = s.gen, l.Epoch
	check := s.needsCheck(evs)
	s.mu.Unlock()
	if len(check) > 0 {
		var err error
		if evs, err = s.skipDeadLetters(ctx, b.gen, evs, check); err != nil {
			s.mu.Lock()
			if b.gen == s.gen {
				for _, e := range evs {
					s.queue.release(e)
				}
			}
			s.mu.Unlock()
			return nil, err
		}
	}
	b.events = evs
	if len(evs) > 0 {
		b.Open()
		b.Recs = make([]outboxdriver.Record, len(evs))
		for i, e := range evs {
			b.Recs[i] = e.record()
		}
	}
	return b, nil
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

// needsCheck returns the events of evs that may be in the dead-letter
// table already: replayed after a restart from before the last dead
// letter, or the dead letter an aggregate is held behind. s.mu is held.
func (s *Source) needsCheck(evs []*event) []*event {
	var out []*event
	for _, e := range evs {
		if (e.tx.lsn != 0 && e.tx.lsn <= s.deadLSN) || s.queue.held[e.key()] == e.ID {
			out = append(out, e)
		}
	}
	return out
}

// skipDeadLetters drops from evs, as done, the events of check that are in
// the dead-letter table: they were dead-lettered before (the stream
// replays them), or an aggregate is held behind them and an operator has
// not retried them yet. An event of check whose transaction is not visible
// yet cannot be told (an operator's retry moves the dead letter back in
// that transaction): it goes back to the queue with the later events of
// its aggregate in evs, to be claimed again.
func (s *Source) skipDeadLetters(ctx context.Context, gen int, evs, check []*event) ([]*event, error) {
	ids, xids := make([]string, len(check)), make([]int64, len(check))
	for i, e := range check {
		ids[i], xids[i] = e.ID, e.xid()
	}
	rows, err := s.pool.Query(ctx, s.q.isDeadLetter, pgschema.UUIDArray(ids), xids)
	if err != nil {
		return evs, fmt.Errorf("outboxpgx: claim: look up dead letters: %w", err)
	}
	isDead, unseen := map[string]bool{}, map[string]bool{}
	var (
		id            string
		dead, visible bool
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &dead, &visible}, func() error {
		isDead[id], unseen[id] = dead, !visible
		return nil
	})
	if err != nil {
		return evs, fmt.Errorf("outboxpgx: claim: look up dead letters: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen != s.gen {
		return nil, nil // the stream restarted: it replays them
	}
	kept := evs[:0]
	later := map[aggKey]bool{}
	for _, e := range evs {
		switch k := e.key(); {
		case unseen[e.ID] || later[k]:
			s.queue.release(e)
			later[k] = true
		case isDead[e.ID]:
			s.queue.done(e)
		default:
			kept = append(kept, e)
		}
	}
	if s.queue.advance() {
		s.target = max(s.target, s.queue.mark)
	}
	if s.st != nil {
		s.st.roomy()
	}
	return kept, nil
}
