package fleet

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/outboxkit/outbox/sink"
)

// Budget is the publish budget a Fleet's sources share: at most Turns
// publish calls are in flight at once across all of them, each of at most
// Quantum messages, and when a turn frees up it goes to the sources
// waiting for one in weighted round robin: a source of weight w gets up
// to w turns in a row, then the next waiting source gets its own. A source
// with work therefore waits for at most the other waiting sources' weights
// in turns (plus the turns already in flight), however many messages a
// flooded source has queued behind them: that is the bound on how much a
// flooded source delays the others (docs/operations.md, One relay for many
// databases).
//
// Turns bound the broker connection; they do not bound the CPU a flooded
// source's claims, deletes and publishes take from a machine it shares
// with the others (its relay, its database server, the broker). So while
// another source has been granted a turn within the busy window, a source
// of weight w holds at most w turns at a time, its publishes go out in
// slices of Quantum messages, it spends at most w × duty of the wall
// time holding turns: after a turn held for d it waits
// d × (1 − w·duty) / (w·duty) (at most 50 ms) before it asks for the next
// (a weight of 1/duty or more is never paced), and its relay claims at
// most 4 × Quantum × w events at a time with one batch in flight. A
// source alone publishes whole waves, on as many turns as it likes,
// without waiting, and claims as its relay is configured. A source
// that publishes now and then never waits (its turns are far apart); a
// flooded source drains at a fraction of its speed while others have
// work (see Pace).
//
// A Budget is safe for concurrent use. The zero value is not usable; use
// NewBudget.
type Budget struct {
	quantum int

	mu      sync.Mutex
	free    int
	ring    []*budgetShare // shares with waiters, in round-robin order
	cursor  int            // ring[cursor] is served next
	given   int            // turns ring[cursor] got in a row
	granted uint64         // turns handed out, for tests and metrics

	duty   float64       // share of the time a source may hold turns while another has work; 1: no limit
	window time.Duration // how long after its last turn a source counts as having work
	// recent are the last two distinct shares granted a turn, and when:
	// the latest grant to a share other than s is recent[0], or recent[1]
	// when recent[0] is s.
	recent   [2]*budgetShare
	recentAt [2]time.Time
}

// DefaultBudgetTurns, DefaultBudgetQuantum, DefaultBudgetDuty and
// DefaultBudgetWindow are NewBudget's defaults: what they cost a flooded
// source and spare the others is measured in
// docs/benchmarks.md#one-relay-for-many-databases.
const (
	DefaultBudgetTurns   = 4
	DefaultBudgetQuantum = 25
	DefaultBudgetDuty    = 0.2
	DefaultBudgetWindow  = 10 * time.Second
)

// NewBudget returns a budget of turns publish calls in flight, each of at
// most quantum messages while sources compete, paced by
// DefaultBudgetDuty and DefaultBudgetWindow (change them with Pace). Zero
// takes DefaultBudgetTurns and DefaultBudgetQuantum.
func NewBudget(turns, quantum int) (*Budget, error) {
	if turns == 0 {
		turns = DefaultBudgetTurns
	}
	if quantum == 0 {
		quantum = DefaultBudgetQuantum
	}
	if turns < 1 || turns > 1024 {
		return nil, fmt.Errorf("relayd: publish budget of %d turns: use 1 to 1024", turns)
	}
	if quantum < 1 || quantum > 100_000 {
		return nil, fmt.Errorf("relayd: publish quantum of %d messages: use 1 to 100000", quantum)
	}
	return &Budget{quantum: quantum, free: turns, duty: DefaultBudgetDuty, window: DefaultBudgetWindow}, nil
}

// contendedClaimQuanta is how many quanta of messages a source of weight
// 1 claims at most while the budget paces it (ClaimLimit).
const contendedClaimQuanta = 4

// claimLimit is relay.Config.ClaimLimit for s: while the budget paces s
// (another source has work), its relay claims at most
// contendedClaimQuanta × Quantum × weight events at a time, with one
// batch in flight, so that a flood's claims and deletes come in short
// bursts, as its publishes do; otherwise batchSize.
func (s *budgetShare) claimLimit(batchSize int) int {
	b := s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if s.dutyLocked() >= 1 || !s.othersBusyLocked(time.Now()) {
		return batchSize
	}
	return min(batchSize, contendedClaimQuanta*b.quantum*s.weight)
}

// maxPaceGap caps the wait after one turn: with a slow broker (a turn of
// 50 ms and more) pacing then costs a batch at most this per slice, so a
// batch of the relay's default size still ends well within its lease.
const maxPaceGap = 50 * time.Millisecond

// Pace sets the share of the wall time (0 < duty ≤ 1; 1 turns pacing
// off) a source may spend holding turns while another source was granted
// one within window (> 0). Call it before the Budget is given to a Fleet.
func (b *Budget) Pace(duty float64, window time.Duration) error {
	if !(duty > 0 && duty <= 1) {
		return fmt.Errorf("relayd: publish duty %v: use more than 0 and at most 1", duty)
	}
	if window <= 0 {
		return fmt.Errorf("relayd: busy window %s: use more than 0", window)
	}
	b.mu.Lock()
	b.duty, b.window = duty, window
	b.mu.Unlock()
	return nil
}

// budgetShare is one source's place in a Budget.
type budgetShare struct {
	b       *Budget
	weight  int
	waiters []chan struct{} // FIFO; closed when granted
	inRing  bool
	// notBefore: while another source has work, the share asks for no
	// turn before then.
	notBefore time.Time
	holding   int // turns the share holds
}

// share returns a new share of weight w (at least 1).
func (b *Budget) share(w int) *budgetShare {
	return &budgetShare{b: b, weight: max(w, 1)}
}

// setWeight changes the share's weight from its next turn on.
func (s *budgetShare) setWeight(w int) {
	s.b.mu.Lock()
	s.weight = max(w, 1)
	s.b.mu.Unlock()
}

// acquire waits for a turn, or for ctx. contended reports whether another
// source had work when the turn was granted (then the turn carries at
// most a quantum).
func (s *budgetShare) acquire(ctx context.Context) (contended bool, err error) {
	b := s.b
	b.mu.Lock()
	for {
		wait := s.paceLocked(time.Now())
		if wait <= 0 {
			break
		}
		b.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return false, ctx.Err()
		}
		b.mu.Lock()
	}
	if b.free > 0 && len(b.ring) == 0 && !s.cappedLocked(time.Now()) {
		b.free--
		b.grantedLocked(s)
		contended = s.othersBusyLocked(time.Now())
		b.mu.Unlock()
		return contended, nil
	}
	ch := make(chan struct{})
	s.waiters = append(s.waiters, ch)
	if !s.inRing {
		s.inRing = true
		b.ring = append(b.ring, s)
	}
	b.grantLocked() // a turn may be free while others wait
	b.mu.Unlock()
	select {
	case <-ch:
		b.mu.Lock()
		contended = s.othersBusyLocked(time.Now())
		b.mu.Unlock()
		return contended, nil
	case <-ctx.Done():
		b.mu.Lock()
		defer b.mu.Unlock()
		select {
		case <-ch: // granted meanwhile: give it back
			b.free++
			s.holding--
			b.grantLocked()
		default:
			for i, w := range s.waiters {
				if w == ch {
					s.waiters = append(s.waiters[:i], s.waiters[i+1:]...)
					break
				}
			}
		}
		return false, ctx.Err()
	}
}

// othersBusyLocked reports whether a share other than s was granted a
// turn within the window before now.
func (s *budgetShare) othersBusyLocked(now time.Time) bool {
	b := s.b
	i := 0
	if b.recent[0] == s {
		i = 1
	}
	return b.recent[i] != nil && now.Sub(b.recentAt[i]) <= b.window
}

// dutyLocked is the share of the time s may hold turns while another
// source has work: the budget's duty times its weight, 1 at most.
func (s *budgetShare) dutyLocked() float64 {
	return min(1, s.b.duty*float64(s.weight))
}

// cappedLocked reports whether s may not take another turn now: while
// the budget paces and another source has work, a source holds at most
// its weight in turns at a time, so a flood's lanes take turns with each
// other rather than all at once.
func (s *budgetShare) cappedLocked(now time.Time) bool {
	return s.dutyLocked() < 1 && s.holding >= s.weight && s.othersBusyLocked(now)
}

// paceLocked returns how long s must wait before it asks for a turn.
func (s *budgetShare) paceLocked(now time.Time) time.Duration {
	if s.dutyLocked() >= 1 || !now.Before(s.notBefore) || !s.othersBusyLocked(now) {
		return 0
	}
	return s.notBefore.Sub(now)
}

// grantedLocked counts a turn granted to s.
func (b *Budget) grantedLocked(s *budgetShare) {
	b.granted++
	s.holding++
	if b.recent[0] != s {
		b.recent[1], b.recentAt[1] = b.recent[0], b.recentAt[0]
		b.recent[0] = s
	}
	b.recentAt[0] = time.Now()
}

// release gives back a turn that was held for held, and sets when s may
// ask for its next one while others have work.
func (s *budgetShare) release(held time.Duration) {
	b := s.b
	b.mu.Lock()
	if duty := s.dutyLocked(); duty < 1 {
		gap := min(time.Duration(float64(held)*(1-duty)/duty), maxPaceGap)
		next := time.Now().Add(gap)
		if next.After(s.notBefore) {
			s.notBefore = next
		}
	}
	b.free++
	s.holding--
	b.grantLocked()
	b.mu.Unlock()
}

// grantLocked hands free turns to waiting shares in weighted round robin.
func (b *Budget) grantLocked() {
	now := time.Now()
	capped := 0 // shares passed over in a row for holding their one turn
	for b.free > 0 && len(b.ring) > 0 {
		if b.cursor >= len(b.ring) {
			b.cursor, b.given = 0, 0
		}
		s := b.ring[b.cursor]
		if len(s.waiters) == 0 {
			// Nothing left to wait for: out of the ring.
			s.inRing = false
			b.ring = append(b.ring[:b.cursor], b.ring[b.cursor+1:]...)
			b.given = 0
			continue
		}
		if s.cappedLocked(now) {
			// Its next turn comes when it releases the one it holds.
			if capped++; capped >= len(b.ring) {
				return
			}
			b.cursor++
			b.given = 0
			continue
		}
		capped = 0
		ch := s.waiters[0]
		s.waiters = s.waiters[1:]
		close(ch)
		b.free--
		b.grantedLocked(s)
		b.given++
		if b.given >= s.weight {
			b.cursor++
			b.given = 0
		}
	}
}

// fairSink publishes through a sink shared by a fleet's sources, one
// budget turn per Quantum messages.
type fairSink struct {
	sink.Sink
	share *budgetShare
}

// Publish publishes msgs in turns: the whole wave in one turn while no
// other source has work, else in slices of at most the budget's quantum,
// each in a turn of its own. The slices go out one after another, so
// messages of one key stay in slice order.
func (f *fairSink) Publish(ctx context.Context, msgs []sink.Message) []error {
	var errs []error
	for len(msgs) > 0 {
		contended, err := f.share.acquire(ctx)
		if err != nil {
			for range msgs {
				errs = append(errs, err)
			}
			return errs
		}
		n := len(msgs)
		if contended {
			n = min(n, f.share.b.quantum)
		}
		out := f.turn(ctx, msgs[:n])
		if errs == nil && n == len(msgs) {
			return out
		}
		errs = append(errs, out...)
		msgs = msgs[n:]
	}
	return errs
}

// turn publishes msgs in a turn acquired for them, and gives it back.
func (f *fairSink) turn(ctx context.Context, msgs []sink.Message) []error {
	start := time.Now()
	defer func() { f.share.release(time.Since(start)) }()
	return f.Sink.Publish(ctx, msgs)
}

// Close leaves the shared sink open: the fleet closes it once no source
// uses it.
func (f *fairSink) Close() error { return nil }

// System passes on the shared sink's messaging system, for tracing.
func (f *fairSink) System() string {
	if s, ok := f.Sink.(sink.Systemer); ok {
		return s.System()
	}
	return ""
}
