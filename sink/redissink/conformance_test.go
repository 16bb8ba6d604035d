package redissink

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/faultproxy"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/sinktest"
)

// conformanceMaxMessageSize is the limit the conformance sink enforces, as
// a stand-in for Redis's proto-max-bulk-len (512 MiB, too much to send in a
// test).
const conformanceMaxMessageSize = 1 << 20

// conformanceEnv is one conformance test's key prefix, a direct client to
// read the streams, and a fault proxy that the sink's connection goes
// through.
type conformanceEnv struct {
	*env
	proxy *faultproxy.Proxy
}

func newConformanceEnv(t *testing.T) *conformanceEnv {
	t.Helper()
	e := newEnv(t)
	u, err := url.Parse(serverURL())
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	return &conformanceEnv{env: e, proxy: proxy}
}

// TestConformance runs the sink conformance suite against the real Redis.
// The sink dials through a fault proxy (Outage cuts it) and owns its
// client; destinations are streams under the test's key prefix.
func TestConformance(t *testing.T) {
	env := sinktest.PerTest(newConformanceEnv)
	sinktest.Run(t, sinktest.Harness{
		New: func(t *testing.T) sink.Sink {
			e := env(t)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			u, _ := url.Parse(serverURL())
			u.Host = e.proxy.Addr()
			s, err := Dial(ctx, u.String(), &Config{MaxMessageSize: conformanceMaxMessageSize})
			if err != nil {
				t.Fatalf("%v; %s", err, startHint)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		Dest: func(t *testing.T, name string) string { return env(t).prefix + name },
		Read: func(t *testing.T, dests []string, want int) []sinktest.Received {
			e := env(t)
			var got []sinktest.Received
			// Up to 5s for want messages; the suite judges what arrived.
			_ = await.Poll(5*time.Second, func() error {
				got = got[:0]
				for _, d := range dests {
					for _, r := range e.xrange(t, d) {
						id, _ := r.field("id")
						key, _ := r.field("key")
						payload, _ := r.field("payload")
						hj, _ := r.field("headers")
						rec := sinktest.Received{ID: id, Destination: d, Key: []byte(key), Value: []byte(payload)}
						if err := json.Unmarshal([]byte(hj), &rec.Headers); err != nil {
							t.Errorf("entry %s of %s: headers %q: %v", r.id, d, hj, err)
						}
						got = append(got, rec)
					}
				}
				if len(got) < want {
					return fmt.Errorf("%d of %d messages arrived", len(got), want)
				}
				return nil
			})
			return got
		},
		TooLarge: func(t *testing.T, dest string) *sink.Message {
			return &sink.Message{Destination: dest, Key: []byte("k"), Value: make([]byte, conformanceMaxMessageSize+1)}
		},
		Outage: func(t *testing.T) func() {
			p := env(t).proxy
			p.Cut()
			return p.Restore
		},
	})
}
