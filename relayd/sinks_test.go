package relayd_test

import (
	"context"
	"io"
	"sync/atomic"
	"testing"

	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/natssink"
	"github.com/outboxkit/outbox/sink/stdoutsink"
)

// natsSink opens the JetStream sink of the test's stream at url, as a
// program that embeds the relay for NATS does.
func natsSink(t testing.TB, ctx context.Context, url, stream string) sink.Sink {
	t.Helper()
	s, err := natssink.DialStream(ctx, url, &natssink.Config{Stream: stream, NoCreateStream: true})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// trackedSink is a sink that writes nowhere and records whether it was
// closed.
type trackedSink struct {
	sink.Sink
	closed atomic.Bool
}

func newTrackedSink() *trackedSink { return &trackedSink{Sink: stdoutsink.New(io.Discard)} }

func (s *trackedSink) Close() error {
	s.closed.Store(true)
	return s.Sink.Close()
}
