package relayd

import (
	"context"
	"fmt"
	"sync"

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
}

// DefaultBudgetTurns and DefaultBudgetQuantum are NewBudget's defaults.
const (
	DefaultBudgetTurns   = 4
	DefaultBudgetQuantum = 100
)

// NewBudget returns a budget of turns publish calls in flight, each of at
// most quantum messages. Zero takes DefaultBudgetTurns and
// DefaultBudgetQuantum.
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
	return &Budget{quantum: quantum, free: turns}, nil
}

// budgetShare is one source's place in a Budget.
type budgetShare struct {
	b       *Budget
	weight  int
	waiters []chan struct{} // FIFO; closed when granted
	inRing  bool
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

// acquire waits for a turn, or for ctx.
func (s *budgetShare) acquire(ctx context.Context) error {
	b := s.b
	b.mu.Lock()
	if b.free > 0 && len(b.ring) == 0 {
		b.free--
		b.granted++
		b.mu.Unlock()
		return nil
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
		return nil
	case <-ctx.Done():
		b.mu.Lock()
		defer b.mu.Unlock()
		select {
		case <-ch: // granted meanwhile: give it back
			b.free++
			b.grantLocked()
		default:
			for i, w := range s.waiters {
				if w == ch {
					s.waiters = append(s.waiters[:i], s.waiters[i+1:]...)
					break
				}
			}
		}
		return ctx.Err()
	}
}

// release gives a turn back.
func (s *budgetShare) release() {
	b := s.b
	b.mu.Lock()
	b.free++
	b.grantLocked()
	b.mu.Unlock()
}

// grantLocked hands free turns to waiting shares in weighted round robin.
func (b *Budget) grantLocked() {
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
		ch := s.waiters[0]
		s.waiters = s.waiters[1:]
		close(ch)
		b.free--
		b.granted++
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

// Publish publishes msgs in slices of at most the budget's quantum, each
// in a turn of its own. The slices go out one after another, so messages
// of one key stay in slice order.
func (f *fairSink) Publish(ctx context.Context, msgs []sink.Message) []error {
	q := f.share.b.quantum
	if len(msgs) <= q {
		return f.turn(ctx, msgs)
	}
	errs := make([]error, 0, len(msgs))
	for len(msgs) > 0 {
		n := min(q, len(msgs))
		errs = append(errs, f.turn(ctx, msgs[:n])...)
		msgs = msgs[n:]
	}
	return errs
}

func (f *fairSink) turn(ctx context.Context, msgs []sink.Message) []error {
	if err := f.share.acquire(ctx); err != nil {
		errs := make([]error, len(msgs))
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	defer f.share.release()
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
