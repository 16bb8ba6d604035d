package sinktest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/sinktest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// memBroker is an in-memory broker with a size limit, de-duplication by id
// and a switch that makes it unreachable.
type memBroker struct {
	mu   sync.Mutex
	down bool
	msgs []sinktest.Received
	ids  map[string]bool
}

const memMaxValue = 1 << 20

// memSink publishes to a memBroker, passing the key as the header "key".
type memSink struct {
	b      *memBroker
	mu     sync.Mutex
	closed bool
}

var errClosed = errors.New("memsink: closed")

func (s *memSink) Publish(ctx context.Context, msgs []sink.Message) []error {
	errs := make([]error, len(msgs))
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	for i := range msgs {
		m := &msgs[i]
		switch {
		case closed:
			errs[i] = errClosed
		case ctx.Err() != nil:
			errs[i] = fmt.Errorf("memsink: %w", ctx.Err())
		case len(m.Value) > memMaxValue:
			errs[i] = sink.Permanent(errors.New("memsink: too large"))
		default:
			errs[i] = s.b.store(m)
		}
	}
	return errs
}

func (b *memBroker) store(m *sink.Message) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.down {
		return sink.Unavailable(errors.New("memsink: broker unreachable"))
	}
	if b.ids[m.ID] {
		return nil
	}
	b.ids[m.ID] = true
	hs := map[string][]string{}
	if _, ok := m.Header("id"); !ok {
		hs["id"] = []string{m.ID}
	}
	for _, h := range m.Headers {
		hs[h.Key] = append(hs[h.Key], h.Value)
	}
	if _, ok := hs["key"]; !ok && len(m.Key) > 0 {
		hs["key"] = []string{string(m.Key)}
	}
	b.msgs = append(b.msgs, sinktest.Received{ID: m.ID, Destination: m.Destination, Value: slices.Clone(m.Value), Headers: hs})
	return nil
}

func (s *memSink) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	return nil
}

// TestSuiteOnMemorySink runs the suite on a sink that follows the contract,
// so that every check, including Dedupe and Outage, runs without a broker.
func TestSuiteOnMemorySink(t *testing.T) {
	broker := sinktest.PerTest(func(*testing.T) *memBroker { return &memBroker{ids: map[string]bool{}} })
	sinktest.Run(t, sinktest.Harness{
		New:  func(t *testing.T) sink.Sink { return &memSink{b: broker(t)} },
		Dest: func(t *testing.T, name string) string { return "mem." + name },
		Read: func(t *testing.T, dests []string, want int) []sinktest.Received {
			b := broker(t)
			b.mu.Lock()
			defer b.mu.Unlock()
			var got []sinktest.Received
			for _, r := range b.msgs {
				if slices.Contains(dests, r.Destination) {
					got = append(got, r)
				}
			}
			return got
		},
		DedupeKey: true,
		KeyHeader: "key",
		TooLarge: func(t *testing.T, dest string) *sink.Message {
			return &sink.Message{Destination: dest, Value: make([]byte, memMaxValue+1)}
		},
		Outage: func(t *testing.T) func() {
			b := broker(t)
			b.mu.Lock()
			b.down = true
			b.mu.Unlock()
			return func() {
				b.mu.Lock()
				b.down = false
				b.mu.Unlock()
			}
		},
	})
}

func TestPerTest(t *testing.T) {
	n := 0
	get := sinktest.PerTest(func(*testing.T) int { n++; return n })
	t.Run("a", func(t *testing.T) {
		first, again := get(t), get(t)
		if first != 1 || again != 1 {
			t.Fatalf("get returned %d, then %d, want 1 twice: not kept per test", first, again)
		}
	})
	t.Run("b", func(t *testing.T) {
		if get(t) != 2 {
			t.Fatal("shared across tests")
		}
	})
}
