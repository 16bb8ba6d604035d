package fleet

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/sink"
)

// waiting returns how many acquires wait for a turn.
func (b *Budget) waiting() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, s := range b.ring {
		n += len(s.waiters)
	}
	return n
}

// queued is a condition for testenv.Eventually: n acquires wait for a
// turn.
func queued(b *Budget, n int) func() error {
	return func() error {
		if w := b.waiting(); w != n {
			return fmt.Errorf("%d acquires wait for a turn, want %d", w, n)
		}
		return nil
	}
}

// grants records the order in which shares got their turns.
type grants struct {
	mu    sync.Mutex
	order []string
}

func (g *grants) add(name string) {
	g.mu.Lock()
	g.order = append(g.order, name)
	g.mu.Unlock()
}

func (g *grants) snapshot() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.order...)
}

// acquireAsync queues an acquire of s; the returned channel says when it
// was granted (the turn is then held until release is called).
func acquireAsync(t *testing.T, s *budgetShare, name string, g *grants, wg *sync.WaitGroup) {
	wg.Go(func() {
		if _, err := s.acquire(context.Background()); err != nil {
			t.Error(err)
			return
		}
		g.add(name)
	})
}

// A flooded source with many publishes queued does not make a source with
// one publish wait for more than its own weight in turns: the budget
// serves the sources with work in weighted round robin, not first come
// first served.
func TestBudgetServesWaitingSourcesInWeightedRoundRobin(t *testing.T) {
	b, err := NewBudget(1, 10)
	if err != nil {
		t.Fatal(err)
	}
	flood, trickle := b.share(3), b.share(1)
	if _, err := flood.acquire(context.Background()); err != nil { // holds the only turn
		t.Fatal(err)
	}
	var g grants
	var wg sync.WaitGroup
	for range 12 {
		acquireAsync(t, flood, "flood", &g, &wg)
	}
	await.Eventually(t, 10*time.Second, queued(b, 12))
	for range 2 {
		acquireAsync(t, trickle, "trickle", &g, &wg)
	}
	await.Eventually(t, 10*time.Second, queued(b, 14))
	// Hand the turn on 14 times, each time once the previous grant was
	// recorded: the share that holds it gives it back.
	holder := flood
	for i := range 14 {
		holder.release(0)
		await.Eventually(t, 10*time.Second, func() error {
			if n := len(g.snapshot()); n != i+1 {
				return fmt.Errorf("%d grants recorded, want %d", n, i+1)
			}
			return nil
		})
		if holder = flood; g.snapshot()[i] == "trickle" {
			holder = trickle
		}
	}
	wg.Wait()
	got := g.snapshot()
	want := []string{"flood", "flood", "flood", "trickle", "flood", "flood", "flood", "trickle",
		"flood", "flood", "flood", "flood", "flood", "flood"}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("grant order %v, want %v (weight 3 then 1, in turn)", got, want)
		}
	}
	if b.waiting() != 0 {
		t.Fatalf("%d still waiting", b.waiting())
	}
}

// An acquire given up (its context ended) neither takes a turn nor
// leaves one lost: the next acquire gets it.
func TestBudgetAcquireGivenUpLosesNoTurn(t *testing.T) {
	b, err := NewBudget(1, 10)
	if err != nil {
		t.Fatal(err)
	}
	s := b.share(1)
	if _, err := s.acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := s.acquire(ctx); done <- err }()
	await.Eventually(t, 10*time.Second, queued(b, 1))
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("acquire = %v, want context.Canceled", err)
	}
	s.release(0)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	if _, err := s.acquire(ctx2); err != nil {
		t.Fatalf("the freed turn was lost: %v", err)
	}
}

// countingSink records the size of every publish call and how many run at
// once.
type countingSink struct {
	mu      sync.Mutex
	calls   []int
	running int
	most    int
}

func (c *countingSink) Publish(_ context.Context, msgs []sink.Message) []error {
	c.mu.Lock()
	c.calls = append(c.calls, len(msgs))
	c.running++
	c.most = max(c.most, c.running)
	c.mu.Unlock()
	time.Sleep(time.Millisecond) // a broker round trip, so that calls overlap
	c.mu.Lock()
	c.running--
	c.mu.Unlock()
	return make([]error, len(msgs))
}

func (c *countingSink) Close() error { return nil }

// busy makes a share other than the ones a test uses take a turn, so
// that they count as competing with another source.
func busy(t *testing.T, b *Budget) {
	t.Helper()
	other := b.share(1)
	if _, err := other.acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	other.release(0)
}

// While sources compete, a fair sink splits a wave into quanta, in order,
// and never has more publishes in flight than the budget's turns, however
// many sources publish at once.
func TestFairSinkPublishesInQuantaWithinTheBudget(t *testing.T) {
	b, err := NewBudget(2, 100)
	if err != nil {
		t.Fatal(err)
	}
	busy(t, b)
	inner := &countingSink{}
	var wg sync.WaitGroup
	for range 6 {
		fs := &fairSink{Sink: inner, share: b.share(1)}
		wg.Go(func() {
			msgs := make([]sink.Message, 250)
			for i := range msgs {
				msgs[i].Key = []byte{byte(i)}
			}
			errs := fs.Publish(context.Background(), msgs)
			if len(errs) != 250 {
				t.Errorf("%d results for 250 messages", len(errs))
			}
		})
	}
	wg.Wait()
	inner.mu.Lock()
	defer inner.mu.Unlock()
	if inner.most > 2 {
		t.Fatalf("%d publishes in flight at once, budget 2", inner.most)
	}
	total := 0
	for _, n := range inner.calls {
		if n > 100 {
			t.Fatalf("a publish of %d messages, quantum 100", n)
		}
		total += n
	}
	if total != 6*250 || len(inner.calls) != 6*3 {
		t.Fatalf("%d messages in %d calls, want 1500 in 18", total, len(inner.calls))
	}
}

// A source alone publishes a wave in one turn, whatever the quantum.
func TestFairSinkPublishesAWholeWaveWhenAlone(t *testing.T) {
	b, err := NewBudget(2, 100)
	if err != nil {
		t.Fatal(err)
	}
	inner := &countingSink{}
	fs := &fairSink{Sink: inner, share: b.share(1)}
	for range 2 {
		if errs := fs.Publish(context.Background(), make([]sink.Message, 250)); len(errs) != 250 {
			t.Fatalf("%d results for 250 messages", len(errs))
		}
	}
	inner.mu.Lock()
	defer inner.mu.Unlock()
	if len(inner.calls) != 2 || inner.calls[0] != 250 || inner.calls[1] != 250 {
		t.Fatalf("publish calls %v, want two of 250", inner.calls)
	}
}

// While another source has work, a source that held a turn for d waits
// d × (1 − duty) / duty before its next; alone, or once the other
// source's last turn is older than the window, it does not wait.
func TestBudgetPacesASourceWhileAnotherHasWork(t *testing.T) {
	b, err := NewBudget(4, 10)
	if err != nil {
		t.Fatal(err)
	}
	const held = 45 * time.Millisecond // under the cap of 50 ms
	if err := b.Pace(0.5, time.Hour); err != nil {
		t.Fatal(err)
	}
	flood := b.share(1)

	// Alone: no wait after a turn held for held.
	if _, err := flood.acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	flood.release(held)
	ctx, cancel := context.WithTimeout(context.Background(), held/3)
	contended, err := flood.acquire(ctx)
	cancel()
	if err != nil || contended {
		t.Fatalf("a source alone: acquire = %v, contended %v; want a turn at once, not contended", err, contended)
	}
	flood.release(held)

	// Another source takes a turn: the flood now waits out its gap (held
	// × 1 / 1 at duty 0.5).
	busy(t, b)
	released := time.Now()
	short, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	_, err = flood.acquire(short)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire during the gap = %v, want it to wait past its context's deadline", err)
	}
	contended, err = flood.acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(released); waited < held {
		t.Fatalf("the next turn came %s after the release, before the gap of %s", waited, held)
	}
	if !contended {
		t.Fatal("a turn granted while another source has work is not marked contended")
	}
	flood.release(time.Hour) // a gap of an hour, but for the cap

	// The gap is capped: the turn held for an hour costs at most 50 ms.
	capped, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err = flood.acquire(capped)
	cancel()
	if err != nil {
		t.Fatalf("after a turn held for an hour, the next: %v (the gap is not capped)", err)
	}
	flood.release(time.Hour) // a gap of an hour, were the other source busy and no cap

	// The other source's last turn is older than the window: no wait.
	if err := b.Pace(0.5, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	await.Eventually(t, 10*time.Second, func() error {
		b.mu.Lock()
		defer b.mu.Unlock()
		if flood.othersBusyLocked(time.Now()) {
			return errors.New("the other source's turn is not older than the window")
		}
		return nil
	})
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := flood.acquire(ctx); err != nil {
		t.Fatalf("after the window: %v", err)
	}
}

// Pace refuses a duty or window it cannot use.
func TestBudgetPaceRefusesBadValues(t *testing.T) {
	b, err := NewBudget(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		duty   float64
		window time.Duration
	}{{0, time.Second}, {-0.1, time.Second}, {1.5, time.Second}, {0.5, 0}, {0.5, -time.Second}} {
		if err := b.Pace(c.duty, c.window); err == nil {
			t.Errorf("Pace(%v, %s) accepted", c.duty, c.window)
		}
	}
	if err := b.Pace(1, time.Second); err != nil {
		t.Errorf("Pace(1, 1s) (pacing off): %v", err)
	}
}

// While the budget paces and another source has work, a source holds one
// turn at a time: its second publish waits for its first, even with turns
// free, and gets the turn once the first is released.
func TestBudgetGivesAPacedSourceOneTurnAtATime(t *testing.T) {
	b, err := NewBudget(4, 10)
	if err != nil {
		t.Fatal(err)
	}
	flood := b.share(1)
	busy(t, b)
	if _, err := flood.acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	go func() { _, err := flood.acquire(context.Background()); second <- err }()
	await.Eventually(t, 10*time.Second, queued(b, 1))
	// Three turns are free, and still the second waits.
	trickle := b.share(1)
	if _, err := trickle.acquire(context.Background()); err != nil {
		t.Fatalf("another source with turns free: %v", err)
	}
	trickle.release(0)
	if b.waiting() != 1 {
		t.Fatalf("%d waiting, want the flood's second acquire still waiting", b.waiting())
	}
	flood.release(0)
	select {
	case err := <-second:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the second acquire was not granted after the first turn was released")
	}
	flood.release(0)

	// Not paced: both turns at once.
	if err := b.Pace(1, time.Hour); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := flood.acquire(ctx)
		cancel()
		if err != nil {
			t.Fatalf("unpaced, a second turn held at once: %v", err)
		}
	}
}

// Under pacing a source's weight still counts: a source of weight 2 holds
// two turns at once, and a weight of 1/duty or more is never paced.
func TestBudgetPacingScalesWithWeight(t *testing.T) {
	b, err := NewBudget(4, 10)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Pace(0.25, time.Hour); err != nil {
		t.Fatal(err)
	}
	heavy, full := b.share(2), b.share(4)
	busy(t, b)
	for range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := heavy.acquire(ctx)
		cancel()
		if err != nil {
			t.Fatalf("weight 2, turns held at once: %v", err)
		}
	}
	third := make(chan error, 1)
	go func() { _, err := heavy.acquire(context.Background()); third <- err }()
	await.Eventually(t, 10*time.Second, queued(b, 1))
	heavy.release(0)
	if err := <-third; err != nil {
		t.Fatal(err)
	}
	heavy.release(0)
	heavy.release(0)

	// Weight 4 at duty 0.25: not paced, however long its last turn.
	if _, err := full.acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	full.release(time.Hour) // paced, this would be a gap of 50 ms (the cap)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	if _, err := full.acquire(ctx); err != nil {
		t.Fatalf("weight 4 at duty 0.25 was paced: %v", err)
	}
}

// While the budget paces a source, its relay claims at most 4 quanta
// times its weight at a time (relay.Config.ClaimLimit); alone, unpaced or
// once the others' turns are older than the window, the relay's own
// batch size.
func TestBudgetShrinksAPacedSourcesClaims(t *testing.T) {
	b, err := NewBudget(4, 25)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Pace(0.2, time.Hour); err != nil {
		t.Fatal(err)
	}
	flood, heavy, full := b.share(1), b.share(2), b.share(5)
	if got := flood.claimLimit(500); got != 500 {
		t.Fatalf("alone: claim limit %d, want the batch size 500", got)
	}
	busy(t, b)
	for _, c := range []struct {
		name       string
		s          *budgetShare
		batch, out int
	}{
		{"weight 1", flood, 500, 100},
		{"weight 2", heavy, 500, 200},
		{"weight 1, a batch below the limit", flood, 60, 60},
		{"weight 5 at duty 0.2 (never paced)", full, 500, 500},
	} {
		if got := c.s.claimLimit(c.batch); got != c.out {
			t.Errorf("%s, another source busy: claim limit %d of a batch of %d, want %d", c.name, got, c.batch, c.out)
		}
	}
	if err := b.Pace(0.2, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	await.Eventually(t, 10*time.Second, func() error {
		if n := flood.claimLimit(500); n != 500 {
			return fmt.Errorf("claim limit %d of 500: the other source's turn is not older than the window", n)
		}
		return nil
	})
	if err := b.Pace(1, time.Hour); err != nil {
		t.Fatal(err)
	}
	busy(t, b)
	if got := flood.claimLimit(500); got != 500 {
		t.Fatalf("pacing off, another source busy: claim limit %d, want 500", got)
	}
}
