package relay

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// leaseState is the set of partitions the relay leases, shared by the lease
// keeper (which changes it) and the batch loop (which claims under it).
type leaseState struct {
	mu     sync.Mutex
	owned  []outboxdriver.Lease
	lastOK time.Time // last successful upkeep
	// validUntil is when the leases run out by this process's clock: the
	// start of the round that last renewed them plus the TTL. Past it the
	// batch loop claims nothing, so a relay that was paused (SIGSTOP, a
	// long GC, a frozen VM) past its TTL does not publish from a claim
	// (or, with log tailing, a buffered stream) another relay now owns.
	validUntil time.Time
	wake       context.CancelFunc // interrupts the loop's wait
	// inFlight is read-held by every batch from its claim to its outcome;
	// the keeper takes it before releasing a lease, so a batch never
	// loses its lease to a rebalance.
	inFlight sync.RWMutex
}

// snapshot returns the leases the relay may claim under now: none once
// they ran out by the local clock without a renewal.
func (s *leaseState) snapshot() []outboxdriver.Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !time.Now().Before(s.validUntil) {
		return nil
	}
	return slices.Clone(s.owned)
}

// owns returns the leases held, whether or not they ran out: what the
// relay releases when it stops.
func (s *leaseState) owns() []outboxdriver.Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.owned)
}

// set records the leases the relay holds; renewed is when the round that
// renewed or acquired them started (zero: a round that failed before).
func (s *leaseState) set(owned []outboxdriver.Lease, renewed time.Time, ttl time.Duration, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.owned = owned
	if !renewed.IsZero() {
		s.validUntil = renewed.Add(ttl)
	}
	if ok {
		s.lastOK = time.Now()
	}
}

func (s *leaseState) ready(ttl time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.lastOK.IsZero() && time.Since(s.lastOK) < ttl
}

// setWake registers the cancel func of the loop's current wait.
func (s *leaseState) setWake(c context.CancelFunc) {
	s.mu.Lock()
	s.wake = c
	s.mu.Unlock()
}

func (s *leaseState) wakeLoop() {
	s.mu.Lock()
	if s.wake != nil {
		s.wake()
	}
	s.mu.Unlock()
}

// manageLeases keeps the relay registered and its fair share of partitions
// leased, every third of the lease TTL, until ctx ends. After a round that
// failed it tries again sooner, as the database outage's backoff says (at
// most breakerMax), so that leases are renewed, or taken again, within
// about a second of the database's return.
func (r *Relay) manageLeases(ctx context.Context) {
	every := r.cfg.LeaseTTL / 3
	for {
		start := time.Now()
		next := every
		if ok, retry := r.upkeep(ctx); !ok {
			next = min(every, retry)
		}
		sleep(ctx, time.Until(start.Add(next)))
		if ctx.Err() != nil {
			return
		}
	}
}

// upkeep runs one round: heartbeat, renew, then release the partitions
// above the fair share or acquire up to it. The fair share is the ceiling
// of partitions / live relays, so a newcomer gets partitions as soon as the
// others have shed theirs. It reports whether the round reached the
// database at every step and, when not, how long to wait before the next.
// Failures go to the database's outage tracker, which logs them.
func (r *Relay) upkeep(ctx context.Context) (ok bool, retry time.Duration) {
	ttl := r.cfg.LeaseTTL
	fail := func(err error) (bool, time.Duration) {
		if ctx.Err() != nil {
			return false, 0
		}
		return false, r.db.Fail(opUpkeep, err)
	}
	start := time.Now() // the database dates the renewed leases later than this
	relays, partitions, err := r.src.Heartbeat(ctx, ttl)
	if err != nil {
		return fail(err)
	}
	if compatible, err := r.checkSchema(ctx); err != nil {
		return fail(err)
	} else if !compatible {
		// It stays registered, so that outbox migrate, status and the
		// console list it with its version; relays that work with the
		// table leave it out of their share.
		r.db.OK()
		return true, 0
	}
	owned := r.leases.owns()
	var kept []outboxdriver.Lease
	if len(owned) > 0 {
		if kept, err = r.src.Renew(ctx, owned, ttl); err != nil {
			return fail(err)
		}
	}
	r.db.OK()
	if lost := len(owned) - len(kept); lost > 0 {
		r.log.Warn("relay: leases lost to another relay", "lost", lost)
	}
	share := (partitions + max(relays, 1) - 1) / max(relays, 1)
	switch {
	case len(kept) > share:
		extra := kept[share:]
		kept = kept[:share]
		r.leases.set(kept, start, ttl, false) // stop claiming them first
		r.leases.inFlight.Lock()
		err := r.src.Release(ctx, extra, false)
		r.leases.inFlight.Unlock()
		if err != nil && ctx.Err() == nil {
			r.db.Fail("lease release", err) // they expire by themselves
		}
		r.log.Info("relay: released partitions for other relays", "released", len(extra), "owned", len(kept), "relays", relays)
	case len(kept) < share:
		got, err := r.src.Acquire(ctx, share-len(kept), ttl)
		if err != nil {
			r.leases.set(kept, start, ttl, false)
			return fail(err)
		}
		if len(got) > 0 {
			kept = append(kept, got...)
			slices.SortFunc(kept, func(a, b outboxdriver.Lease) int { return a.Partition - b.Partition })
			r.log.Info("relay: acquired partitions", "acquired", len(got), "owned", len(kept), "relays", relays)
			r.leases.set(kept, start, ttl, true)
			r.stage(StageAcquired, len(got))
			r.leases.wakeLoop()
			r.metrics.PartitionsOwned(len(kept))
			return true, 0
		}
	}
	r.leases.set(kept, start, ttl, true)
	r.metrics.PartitionsOwned(len(kept))
	r.cleanup(ctx, kept)
	return true, 0
}

// maxCleanupRounds bounds one upkeep's cleanup; the rest waits for the next.
const maxCleanupRounds = 10

// cleanup deletes kept published rows past CleanupAfter, batch by batch.
func (r *Relay) cleanup(ctx context.Context, leases []outboxdriver.Lease) {
	if r.cfg.CleanupAfter <= 0 {
		return
	}
	for range maxCleanupRounds {
		n, err := r.src.Cleanup(ctx, leases, r.cfg.CleanupAfter, r.cfg.CleanupBatch)
		if err != nil {
			if ctx.Err() == nil {
				r.db.Fail("cleanup", err) // tried again at the next upkeep
			}
			return
		}
		if n < r.cfg.CleanupBatch {
			return
		}
	}
}
