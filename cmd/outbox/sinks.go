package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/kafkasink"
	"github.com/outboxkit/outbox/sink/natssink"
	"github.com/outboxkit/outbox/sink/stdoutsink"
)

// sinkFlags are the broker-specific options of `outbox relay`.
type sinkFlags struct {
	url          string
	natsStream   string
	natsSubjects []string
	natsNoCreate bool
}

const sinkSchemes = "nats://host:port, kafka://host:port[,host:port] or stdout:"

// openSink connects to the broker named by --sink (or OUTBOX_SINK).
func (f *sinkFlags) open(ctx context.Context, log *slog.Logger) (sink.Sink, error) {
	raw := f.url
	if raw == "" {
		raw = os.Getenv("OUTBOX_SINK")
	}
	if raw == "" {
		return nil, fmt.Errorf("no sink: pass --sink %s, or set OUTBOX_SINK", sinkSchemes)
	}
	scheme, _, ok := strings.Cut(raw, ":")
	if !ok {
		return nil, fmt.Errorf("--sink %q has no scheme: use %s", redact(raw), sinkSchemes)
	}
	switch strings.ToLower(scheme) {
	case "nats", "tls":
		s, err := natssink.Dial(ctx, raw, &natssink.Config{
			Stream: f.natsStream, Subjects: f.natsSubjects, NoCreateStream: f.natsNoCreate, Logger: log,
		})
		if err != nil {
			return nil, err
		}
		if err := s.EnsureStream(ctx); err != nil {
			s.Close()
			return nil, err
		}
		return s, nil
	case "kafka":
		return kafkasink.Dial(ctx, raw, &kafkasink.Config{Logger: log})
	case "stdout":
		if raw != "stdout:" && raw != "stdout://" {
			return nil, fmt.Errorf("--sink %q: the stdout sink takes no address; write stdout:", raw)
		}
		return stdoutsink.New(os.Stdout), nil
	default:
		return nil, fmt.Errorf("--sink %q: unknown scheme %q: use %s", redact(raw), scheme, sinkSchemes)
	}
}
