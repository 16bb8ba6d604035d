package amqpsink

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox/internal/faultproxy"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/sinktest"
)

// conformanceEnv is one conformance test's namespace: an exchange of its
// own, a queue per destination bound with the destination as routing key, a
// direct connection to read the queues, and a fault proxy that the sink's
// connection goes through.
type conformanceEnv struct {
	*env
	proxy *faultproxy.Proxy

	mu   sync.Mutex
	held map[string][]sinktest.Received // per destination, read so far
}

func newConformanceEnv(t *testing.T) *conformanceEnv {
	t.Helper()
	e := newEnv(t)
	e.declareExchange(t)
	u, err := url.Parse(brokerURL())
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	return &conformanceEnv{env: e, proxy: proxy, held: map[string][]sinktest.Received{}}
}

// received converts a delivery; a repeated header is an array.
func received(d amqp.Delivery) sinktest.Received {
	r := sinktest.Received{ID: d.MessageId, Destination: d.RoutingKey, Value: d.Body, Headers: map[string][]string{}}
	for k, v := range d.Headers {
		switch v := v.(type) {
		case []any:
			for _, x := range v {
				r.Headers[k] = append(r.Headers[k], fmt.Sprint(x))
			}
		default:
			r.Headers[k] = []string{fmt.Sprint(v)}
		}
	}
	return r
}

// TestConformance runs the sink conformance suite against the real
// RabbitMQ. The sink dials through a fault proxy (Outage cuts it) and owns
// its connection; Dest declares a queue per destination.
func TestConformance(t *testing.T) {
	env := sinktest.PerTest(newConformanceEnv)
	sinktest.Run(t, sinktest.Harness{
		New: func(t *testing.T) sink.Sink {
			e := env(t)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			u, _ := url.Parse(brokerURL())
			u.Host = e.proxy.Addr()
			s, err := Dial(ctx, u.String(), &Config{Exchange: e.exchange, Declare: true, DialTimeout: 2 * time.Second})
			if err != nil {
				t.Fatalf("%v; %s", err, startHint)
			}
			t.Cleanup(func() { _ = s.Close() })
			if err := s.Setup(ctx); err != nil {
				t.Fatal(err)
			}
			return s
		},
		Dest: func(t *testing.T, name string) string {
			e := env(t)
			dest := e.prefix + "." + name
			e.mu.Lock()
			known := e.held[dest] != nil
			if !known {
				e.held[dest] = []sinktest.Received{}
			}
			e.mu.Unlock()
			if !known {
				e.queue(t, name, nil, dest) // queue named dest, bound with dest
			}
			return dest
		},
		Read: func(t *testing.T, dests []string, want int) []sinktest.Received {
			e := env(t)
			e.mu.Lock()
			defer e.mu.Unlock()
			var got []sinktest.Received
			// Up to 5s for want messages; the suite judges what arrived.
			_ = await.Poll(5*time.Second, func() error {
				got = got[:0]
				for _, d := range dests {
					for _, m := range e.drain(t, d) {
						e.held[d] = append(e.held[d], received(m))
					}
					got = append(got, e.held[d]...)
				}
				if len(got) < want {
					return fmt.Errorf("%d of %d messages arrived", len(got), want)
				}
				return nil
			})
			return slices.Clone(got)
		},
		KeyHeader: DefaultKeyHeader,
		TooLarge: func(t *testing.T, dest string) *sink.Message {
			// RabbitMQ's max_message_size, mirrored by the default
			// Config.MaxMessageSize.
			return &sink.Message{Destination: dest, Key: []byte("k"), Value: make([]byte, DefaultMaxMessageSize+1)}
		},
		Outage: func(t *testing.T) func() {
			p := env(t).proxy
			p.Cut()
			return p.Restore
		},
	})
}
