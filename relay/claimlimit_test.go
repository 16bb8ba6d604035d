package relay_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/sink"
)

// widths records the largest publish call and the most calls in flight at
// once.
type widths struct {
	sink.Sink
	inFlight, maxInFlight, maxSize atomic.Int64
}

func (w *widths) Publish(ctx context.Context, msgs []sink.Message) []error {
	n := w.inFlight.Add(1)
	defer w.inFlight.Add(-1)
	raise(&w.maxInFlight, n)
	raise(&w.maxSize, int64(len(msgs)))
	time.Sleep(time.Millisecond) // a broker's answer takes a while: lanes would overlap here
	return w.Sink.Publish(ctx, msgs)
}

func raise(v *atomic.Int64, n int64) {
	for {
		old := v.Load()
		if n <= old || v.CompareAndSwap(old, n) {
			return
		}
	}
}

// interleaved is n events of each of aggs aggregates, the k-th event of
// every aggregate before any (k+1)-th: a claim of m events holds one of
// each of min(m, aggs) aggregates, and its first wave publishes them all.
func interleaved(round, aggs, n int) []outbox.Event {
	var evs []outbox.Event
	for k := range n {
		for a := range aggs {
			evs = append(evs, event(fmt.Sprintf("r%d-a%d", round, a), k))
		}
	}
	return evs
}

// While Config.ClaimLimit answers less than the batch size, the relay
// claims no more than it says and keeps one batch in flight: its lanes
// stand down. Once it answers the batch size again, the relay claims whole
// batches. Nothing is lost or reordered either way.
func TestClaimLimitShrinksClaimsToOneBatchInFlight(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const aggs, perAgg, batch = 40, 10, 50
	var limit atomic.Int64
	limit.Store(10)
	w := &widths{}
	e.write(t, true, interleaved(1, aggs, perAgg)...)
	e.start(t, func(s sink.Sink) sink.Sink { w.Sink = s; return w }, relay.Config{
		BatchSize: batch, Lanes: 4,
		ClaimLimit: func(b int) int {
			if b != batch {
				t.Errorf("ClaimLimit asked with %d, want the batch size %d", b, batch)
			}
			return int(limit.Load())
		},
	})
	testenv.WaitStreamMsgs(t, e.stream, aggs*perAgg, 30*time.Second)
	if got := w.maxSize.Load(); got > 10 {
		t.Errorf("with a claim limit of 10, a publish of %d messages", got)
	}
	if got := w.maxInFlight.Load(); got != 1 {
		t.Errorf("with a claim limit below the batch size, %d publishes in flight at once, want 1", got)
	}

	// The hook's answer counts at every claim: the batch size again.
	limit.Store(0) // out of range: the batch size
	w.maxSize.Store(0)
	e.write(t, true, interleaved(2, aggs, perAgg)...)
	testenv.WaitStreamMsgs(t, e.stream, 2*aggs*perAgg, 30*time.Second)
	if got := w.maxSize.Load(); got <= 10 {
		t.Errorf("without a claim limit, the largest publish held %d messages; want whole batches' waves (up to %d)", got, aggs)
	}
	e.waitBacklog(t, 0, 30*time.Second)

	next := map[string]int{}
	for _, p := range decode(t, testenv.StreamMessages(t, e.stream)) {
		if p.N != next[p.Agg] {
			t.Fatalf("aggregate %s: event %d arrived where %d was due", p.Agg, p.N, next[p.Agg])
		}
		next[p.Agg]++
	}
	if len(next) != 2*aggs {
		t.Fatalf("%d aggregates arrived, want %d", len(next), 2*aggs)
	}
}
