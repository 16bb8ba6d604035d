package relayd

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

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

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
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
		if err := s.acquire(context.Background()); err != nil {
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
	if err := flood.acquire(context.Background()); err != nil { // holds the only turn
		t.Fatal(err)
	}
	var g grants
	var wg sync.WaitGroup
	for range 12 {
		acquireAsync(t, flood, "flood", &g, &wg)
	}
	waitFor(t, "12 flood publishes to queue", func() bool { return b.waiting() == 12 })
	for range 2 {
		acquireAsync(t, trickle, "trickle", &g, &wg)
	}
	waitFor(t, "the trickle publishes to queue", func() bool { return b.waiting() == 14 })
	// Hand the turn on 14 times, each time once the previous grant was
	// recorded.
	for i := range 14 {
		flood.release()
		waitFor(t, "a grant", func() bool { return len(g.snapshot()) == i+1 })
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
	if err := s.acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.acquire(ctx) }()
	waitFor(t, "the acquire to queue", func() bool { return b.waiting() == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("acquire = %v, want context.Canceled", err)
	}
	s.release()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	if err := s.acquire(ctx2); err != nil {
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

// A fair sink splits a wave into quanta, in order, and never has more
// publishes in flight than the budget's turns, however many sources
// publish at once.
func TestFairSinkPublishesInQuantaWithinTheBudget(t *testing.T) {
	b, err := NewBudget(2, 100)
	if err != nil {
		t.Fatal(err)
	}
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
