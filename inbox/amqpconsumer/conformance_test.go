package amqpconsumer_test

import (
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/amqpconsumer"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/inbox/consumertest"
	"github.com/outboxkit/outbox/inbox/internal/pgstore"
	"github.com/outboxkit/outbox/internal/faultproxy"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/amqpsink"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	envURL    = "OUTBOX_TEST_AMQP_URL"
	startHint = "start it with: rabbitmq-server -detached"
)

func brokerURL() string {
	if u := os.Getenv(envURL); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// dial connects to the test broker or fails the test saying how to start
// it.
func dial(t *testing.T) *amqp.Connection {
	t.Helper()
	conn, err := amqp.DialConfig(brokerURL(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		t.Fatalf("RabbitMQ is not reachable (set %s to use another broker): %v; %s", envURL, err, startHint)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// conformanceEnv is one conformance test's exchange and queue (bound to
// every routing key under the test's prefix), declared and published to by
// amqpsink; each adapter connects through a fault proxy of its own.
type conformanceEnv struct {
	prefix string
	queue  string
	sink   *amqpsink.Sink
	admin  *amqp.Connection

	mu      sync.Mutex
	proxies map[consumertest.Adapter]*faultproxy.Proxy
}

func newConformanceEnv(queueArgs amqp.Table) func(t *testing.T) *conformanceEnv {
	return func(t *testing.T) *conformanceEnv {
		t.Helper()
		admin := dial(t)
		prefix := testenv.Name("c")
		e := &conformanceEnv{prefix: prefix, queue: prefix + ".q", admin: admin, proxies: map[consumertest.Adapter]*faultproxy.Proxy{}}
		ctx := testenv.Context(t, 30*time.Second)
		s, err := amqpsink.Dial(ctx, brokerURL(), &amqpsink.Config{Exchange: prefix, Declare: true,
			Queues: []amqpsink.Queue{{Name: e.queue, BindingKeys: []string{prefix + ".#"}, Args: queueArgs}}})
		if err != nil {
			t.Fatalf("%v; %s", err, startHint)
		}
		t.Cleanup(func() {
			_ = s.Close()
			if ch, err := admin.Channel(); err == nil {
				_, _ = ch.QueueDelete(e.queue, false, false, false)
				_ = ch.ExchangeDelete(prefix, false, false)
				_ = ch.Close()
			}
		})
		if err := s.Setup(ctx); err != nil {
			t.Fatal(err)
		}
		e.sink = s
		return e
	}
}

// ready is how many messages the queue holds ready (not delivered, or
// requeued); with no consumer connected that is everything unacknowledged.
func (e *conformanceEnv) ready() (int, error) {
	ch, err := e.admin.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(e.queue, true, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	return q.Messages, nil
}

func harness(queueArgs amqp.Table) consumertest.Harness[pgx.Tx] {
	env := consumertest.PerTest(newConformanceEnv(queueArgs))
	return consumertest.Harness[pgx.Tx]{
		Store: pgstore.New,
		Dest:  func(t *testing.T, name string) string { return env(t).prefix + "." + name },
		Publish: func(t *testing.T, msgs []sink.Message) {
			consumertest.PublishAll(t, env(t).sink, msgs)
		},
		Start: func(t *testing.T, ib *inbox.Inbox[pgx.Tx], h consumer.Handler[pgx.Tx], cfg consumer.Config) consumertest.Adapter {
			e := env(t)
			u, err := url.Parse(brokerURL())
			if err != nil {
				t.Fatal(err)
			}
			proxy, err := faultproxy.Start(u.Host)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = proxy.Close() })
			u.Host = proxy.Addr()
			c, err := amqpconsumer.New(ib, h, &amqpconsumer.Config{Config: cfg, URL: u.String(), Queue: e.queue})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Start(testenv.Context(t, 10*time.Second)); err != nil {
				t.Fatalf("%v; %s", err, startHint)
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
		Pending: func(t *testing.T) (int, error) { return env(t).ready() },
		Ordered: true,
		Settle:  30 * time.Second,
	}
}

// TestConformanceClassicQueue runs the consumer conformance suite on the
// real RabbitMQ with a classic queue, publishing with amqpsink.
func TestConformanceClassicQueue(t *testing.T) {
	consumertest.Run(t, harness(nil))
}

// TestConformanceQuorumQueue runs the suite with a quorum queue.
func TestConformanceQuorumQueue(t *testing.T) {
	consumertest.Run(t, harness(amqp.Table{"x-queue-type": "quorum"}))
}
