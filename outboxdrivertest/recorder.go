package outboxdrivertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxkit/outbox/sink"
)

// recorder is the broker of the end-to-end cases: it acknowledges every
// message at once and records it, in the order it acknowledged them, so
// that the suite needs nothing but the database. Every relay of a case
// publishes to it through a sink of its own (recorder.sink).
type recorder struct {
	mu       sync.Mutex
	got      []delivery
	distinct map[string]bool
	// changed is closed, and replaced, whenever got grows.
	changed chan struct{}
}

// delivery is one message the recorder acknowledged.
type delivery struct {
	// ID is the message's id; HeaderID the value of its "id" header.
	ID, HeaderID string
	Destination  string
	Key          string
	Value        []byte
	// At is when the recorder acknowledged it.
	At time.Time
}

func newRecorder() *recorder {
	return &recorder{distinct: map[string]bool{}, changed: make(chan struct{})}
}

// record acknowledges msgs, in slice order.
func (r *recorder) record(msgs []sink.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	for i := range msgs {
		m := &msgs[i]
		hid, _ := m.Header("id")
		r.got = append(r.got, delivery{ID: m.ID, HeaderID: hid, Destination: m.Destination, Key: string(m.Key), Value: bytes.Clone(m.Value), At: now})
		r.distinct[m.ID] = true
	}
	close(r.changed)
	r.changed = make(chan struct{})
}

// deliveries returns every message acknowledged so far, in order.
func (r *recorder) deliveries() []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]delivery(nil), r.got...)
}

// counts returns how many messages, and how many distinct ids, the
// recorder acknowledged.
func (r *recorder) counts() (msgs, distinct int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got), len(r.distinct)
}

// waitDistinct waits until the recorder has acknowledged at least n
// distinct ids, and fails the test when timeout passes first.
func (r *recorder) waitDistinct(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		have, changed := len(r.distinct), r.changed
		r.mu.Unlock()
		if have >= n {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("after %s the sink had acknowledged %d distinct events, want at least %d", timeout, have, n)
		}
	}
}

// sink returns a sink.Sink that publishes to the recorder until it is
// closed.
func (r *recorder) sink() *recordingSink { return &recordingSink{rec: r} }

// recordingSink is one relay's sink onto a recorder. Like a broker's
// sink, it fails every message, transiently, once its context is done
// or it is closed.
type recordingSink struct {
	rec    *recorder
	closed atomic.Bool
}

var _ sink.Sink = (*recordingSink)(nil)

var errSinkClosed = errors.New("outboxdrivertest: sink closed")

// Publish records msgs and acknowledges each of them.
func (s *recordingSink) Publish(ctx context.Context, msgs []sink.Message) []error {
	if s.closed.Load() {
		return sink.Results(len(msgs), errSinkClosed)
	}
	if err := ctx.Err(); err != nil {
		return sink.Results(len(msgs), fmt.Errorf("outboxdrivertest: publish: %w", err))
	}
	s.rec.record(msgs)
	return make([]error, len(msgs))
}

// Close makes later publishes fail. It is idempotent.
func (s *recordingSink) Close() error {
	s.closed.Store(true)
	return nil
}
