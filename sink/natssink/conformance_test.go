package natssink

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox/internal/faultproxy"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/sinktest"
)

// conformanceEnv is one conformance test's namespace: a stream of its own
// on subjects "<prefix>.>", a direct connection to read it back, and a fault
// proxy that the sink's connection goes through.
type conformanceEnv struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	stream string
	prefix string
	proxy  *faultproxy.Proxy
}

func newConformanceEnv(t *testing.T) *conformanceEnv {
	t.Helper()
	nc, js := testenv.JetStream(t)
	u, err := url.Parse(testenv.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	id := testenv.Hex(t)
	e := &conformanceEnv{nc: nc, js: js, stream: "C_" + id, prefix: "c" + id, proxy: proxy}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, e.stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("delete stream %s: %v", e.stream, err)
		}
	})
	return e
}

// TestConformance runs the sink conformance suite against the real NATS
// server. The sink dials through a fault proxy (Outage cuts it) and owns
// its connection; EnsureStream creates the test's file-backed stream.
func TestConformance(t *testing.T) {
	env := sinktest.PerTest(newConformanceEnv)
	sinktest.Run(t, sinktest.Harness{
		New: func(t *testing.T) sink.Sink {
			e := env(t)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := Dial(ctx, "nats://"+e.proxy.Addr(), &Config{Stream: e.stream, Subjects: []string{e.prefix + ".>"}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			if err := s.EnsureStream(ctx); err != nil {
				t.Fatal(err)
			}
			return s
		},
		Dest: func(t *testing.T, name string) string { return env(t).prefix + "." + name },
		Read: func(t *testing.T, dests []string, want int) []sinktest.Received {
			e := env(t)
			st, err := e.js.Stream(context.Background(), e.stream)
			if err != nil {
				t.Fatalf("stream %s: %v", e.stream, err)
			}
			var got []sinktest.Received
			// Up to 5s for want messages; the suite judges what arrived.
			_ = await.Poll(5*time.Second, func() error {
				got = got[:0]
				for _, m := range testenv.StreamMessages(t, st) {
					if !slices.Contains(dests, m.Subject) {
						continue
					}
					got = append(got, sinktest.Received{
						ID:          m.Header.Get(jetstream.MsgIDHeader),
						Destination: m.Subject,
						Value:       m.Data,
						Headers:     m.Header,
					})
				}
				if len(got) < want {
					return fmt.Errorf("%d of %d messages arrived", len(got), want)
				}
				return nil
			})
			return got
		},
		DedupeKey: true,
		KeyHeader: KeyHeader,
		TooLarge: func(t *testing.T, dest string) *sink.Message {
			return &sink.Message{Destination: dest, Key: []byte("k"), Value: make([]byte, env(t).nc.MaxPayload()+1)}
		},
		Outage: func(t *testing.T) func() {
			p := env(t).proxy
			p.Cut()
			return p.Restore
		},
	})
}
