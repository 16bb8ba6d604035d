package natsconsumer_test

import (
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/inbox/consumertest"
	"github.com/outboxkit/outbox/inbox/internal/pgstore"
	"github.com/outboxkit/outbox/inbox/natsconsumer"
	"github.com/outboxkit/outbox/internal/faultproxy"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/natssink"
)

// conformanceEnv is one conformance test's stream and durable consumer
// (AckWait 3s, so a crashed adapter's message comes back soon), published
// to by natssink; each adapter connects through a fault proxy of its own.
type conformanceEnv struct {
	js      jetstream.JetStream
	stream  string
	durable jetstream.Consumer
	sink    *natssink.Sink

	mu      sync.Mutex
	proxies map[consumertest.Adapter]*faultproxy.Proxy
}

func newConformanceEnv(t *testing.T) *conformanceEnv {
	t.Helper()
	_, js := testenv.JetStream(t)
	_, prefix := testenv.Stream(t, js)
	cc := natsconsumer.ConsumerConfig("conformance", prefix+".>")
	cc.AckWait = 3 * time.Second
	cons, err := js.CreateOrUpdateConsumer(testenv.Context(t, 10*time.Second), prefix, cc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := natssink.New(js, &natssink.Config{Stream: prefix, Subjects: []string{prefix + ".>"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return &conformanceEnv{js: js, stream: prefix, durable: cons, sink: s, proxies: map[consumertest.Adapter]*faultproxy.Proxy{}}
}

// TestConformance runs the consumer conformance suite on the real NATS
// JetStream and PostgreSQL, publishing with natssink.
func TestConformance(t *testing.T) {
	env := consumertest.PerTest(newConformanceEnv)
	consumertest.Run(t, consumertest.Harness[pgx.Tx]{
		Store: pgstore.New,
		Dest:  func(t *testing.T, name string) string { return env(t).stream + "." + name },
		Publish: func(t *testing.T, msgs []sink.Message) {
			consumertest.PublishAll(t, env(t).sink, msgs)
		},
		Start: func(t *testing.T, ib *inbox.Inbox[pgx.Tx], h consumer.Handler[pgx.Tx], cfg consumer.Config) consumertest.Adapter {
			e := env(t)
			u, err := url.Parse(testenv.NATSURL())
			if err != nil {
				t.Fatal(err)
			}
			proxy, err := faultproxy.Start(u.Host)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = proxy.Close() })
			u.Host = proxy.Addr()
			nc, err := nats.Connect(u.String(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
			if err != nil {
				t.Fatalf("%v; %s", err, testenv.NATSHelp)
			}
			t.Cleanup(nc.Close)
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			cons, err := js.Consumer(testenv.Context(t, 10*time.Second), e.stream, "conformance")
			if err != nil {
				t.Fatal(err)
			}
			c, err := natsconsumer.New(cons, ib, h, &natsconsumer.Config{Config: cfg, FetchWait: 500 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Start(testenv.Context(t, 10*time.Second)); err != nil {
				t.Fatal(err)
			}
			e.mu.Lock()
			e.proxies[c] = proxy
			e.mu.Unlock()
			return c
		},
		Crash: func(t *testing.T, a consumertest.Adapter) {
			e := env(t)
			e.mu.Lock()
			defer e.mu.Unlock()
			e.proxies[a].Cut()
		},
		Pending: func(t *testing.T) (int, error) {
			info, err := env(t).durable.Info(testenv.Context(t, 10*time.Second))
			if err != nil {
				return 0, err
			}
			return int(info.NumPending) + info.NumAckPending, nil
		},
		Ordered:    true,
		DedupeByID: true, // natssink sets Nats-Msg-Id
		Settle:     30 * time.Second,
	})
}
