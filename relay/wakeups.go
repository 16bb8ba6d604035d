package relay

import (
	"context"
	"time"

	"github.com/outboxkit/outbox/internal/backoff"
	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/outboxdriver"
)

// minWait is the first wait after the relay caught up. Waits then double up
// to PollInterval, so a writer whose transaction committed just as the relay
// went idle (and so sent no wake-up) waits milliseconds, not a poll interval.
const minWait = time.Millisecond

// The relay leaves the wake-up registry while events come fast enough that
// claiming back to back finds them: once its claims average leaveFlow
// events (a moving average, weight flowWeight, over the main loop's
// claims, empty ones counting 0). Out of it, an empty claim is followed
// by waits of minWait doubling up to maxSteadyWait and further claims;
// it rejoins when a wait would be longer, or once the average fell below
// rejoinFlow. docs/benchmarks.md#latency has the measurements behind
// these values.
const (
	flowWeight    = 0.2
	leaveFlow     = 3
	rejoinFlow    = 1.5
	maxSteadyWait = 2 * time.Millisecond
)

// wakeups is the main loop's wake-up state machine: whether the relay is
// registered for wake-ups (while it is, writers send one with their
// commit), how long it waits after a claim that found nothing, and whether
// a flow of events keeps it out of the registry.
//
// Having caught up, the relay registers and looks once more, then waits:
// minWait doubling up to the poll interval, or the whole poll interval
// when the source wakes it on commit (Source.WakesOnCommit). A
// registration lasts three poll intervals and is renewed once one has
// passed. A full batch (a backlog) or a steady flow (see leaveFlow) takes
// the relay out of the registry.
type wakeups struct {
	src   outboxdriver.Source
	db    *backoff.Outage // registrations are calls of the database
	poll  time.Duration
	wakes bool // the source's Wait returns soon after a commit

	wait      time.Duration // the next wait after an empty claim
	idle      bool          // registered for wake-ups
	idleSince time.Time     // when the registration was last renewed
	// fresh says the relay registered anew (it was not registered): the
	// wait after the look that follows is short (relook), for the events
	// of writers whose view of the registry did not show it yet.
	fresh bool
	// flow is a moving average of the events per claim of this loop
	// (empty claims count as 0); steady says the relay left the wake-up
	// registry because of it, not because of a backlog.
	flow   float64
	steady bool
}

func newWakeups(src outboxdriver.Source, poll time.Duration, db *backoff.Outage) *wakeups {
	return &wakeups{src: src, db: db, poll: poll, wakes: src.WakesOnCommit(), wait: minWait}
}

// step is what the main loop does after a clean batch short of full.
type step int

const (
	carryOn     step = iota // as after any batch
	claimAgain              // claim at once: the registration was renewed
	awaitWakeup             // wait for a wake-up, up to the poll interval
)

// observe folds a claim of n events into the flow average.
func (s *wakeups) observe(n int) {
	s.flow = s.flow*(1-flowWeight) + float64(n)*flowWeight
}

// relook is the wait after a new registration and the look that follows
// it: writers that send the wake-up themselves act on a view of the
// registry up to driverkit.WakeViewMaxAge old, so an event they
// committed meanwhile sent none; one more look, that long and a margin
// later, finds it (a writer whose view is older wakes the relay).
const relook = driverkit.WakeViewMaxAge + 5*time.Millisecond

// register (re)registers the relay for wake-ups for three poll intervals;
// it is renewed after one.
func (s *wakeups) register(ctx context.Context) {
	if err := s.src.SetIdle(ctx, 3*s.poll); err != nil && ctx.Err() == nil {
		s.db.Fail("wake-up registration", err) // polling meanwhile
	}
	s.fresh = !s.idle
	s.idle, s.idleSince = true, time.Now()
}

// empty takes a claim that found nothing and returns how long to wait for
// work before the next claim, or ok false when the relay has just
// registered for wake-ups and claims again at once.
func (s *wakeups) empty(ctx context.Context) (d time.Duration, ok bool) {
	s.observe(0)
	if s.steady && s.flow >= rejoinFlow && s.wait <= maxSteadyWait {
		// Out of the registry while events come fast: a gap is likely
		// short, so look again soon rather than rejoin.
		d = s.wait
		s.wait *= 2
		return d, true
	}
	s.steady = false
	if !s.idle || time.Since(s.idleSince) > s.poll {
		// Register as idle (writers then send a wake-up), then look once
		// more: a row committed before the registration sent no wake-up.
		s.register(ctx)
		return 0, false
	}
	if s.wakes {
		// A commit wakes the wait: no need to look again sooner than the
		// poll interval, but for a new registration's relook.
		s.wait = s.poll
		if s.fresh {
			s.fresh = false
			return min(relook, s.poll), true
		}
	}
	d = s.wait
	s.wait = min(s.wait*2, s.poll)
	return d, true
}

// claimed takes a claim of n > 0 events; full says it filled the batch.
func (s *wakeups) claimed(ctx context.Context, n int, full bool) {
	s.observe(n)
	s.wait = minWait
	// Stay registered for wake-ups while batches come back short and few:
	// leaving and rejoining would cost two round trips a wake-up. A full
	// batch means a backlog, and claims that keep finding several events
	// mean a flow the relay keeps up with by claiming back to back: leave,
	// so that the writers are spared the NOTIFY (which makes every
	// notifying commit in the cluster wait for the one before it).
	if s.idle && (full || (s.wakes && s.flow >= leaveFlow)) {
		s.idle, s.steady = false, !full
		if err := s.src.SetIdle(ctx, 0); err != nil && ctx.Err() == nil {
			s.db.Fail("wake-up registration", err) // it expires by itself
		}
	}
}

// caughtUp takes a batch short of full that was published and recorded
// cleanly: the relay caught up as of its claim. Still registered with a
// source that wakes on commit, whatever committed since has sent a
// wake-up, so the relay waits for it rather than spend a claim on finding
// nothing (awaitWakeup), unless the registration had lapsed: it is then
// renewed and the relay looks once more (claimAgain).
func (s *wakeups) caughtUp(ctx context.Context) step {
	if !s.idle || !s.wakes {
		return carryOn
	}
	if time.Since(s.idleSince) > s.poll {
		s.register(ctx)
		return claimAgain
	}
	if s.fresh {
		// Registered anew: writers that had not seen it yet sent no
		// wake-up; the look after next empty claim waits only relook.
		return carryOn
	}
	return awaitWakeup
}
