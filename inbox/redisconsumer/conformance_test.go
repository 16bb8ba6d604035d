package redisconsumer_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/inbox/consumertest"
	"github.com/outboxkit/outbox/inbox/internal/pgstore"
	"github.com/outboxkit/outbox/inbox/redisconsumer"
	"github.com/outboxkit/outbox/internal/faultproxy"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/redissink"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// envURL overrides the Redis server the tests use.
const envURL = "OUTBOX_TEST_REDIS_URL"

const startHint = `start it with: redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log`

func serverURL() string {
	if u := os.Getenv(envURL); u != "" {
		return u
	}
	return "redis://127.0.0.1:6379/0"
}

// connect returns a client on the test server (through addr when set),
// closed when the test ends, or fails the test saying how to start it.
func connect(t *testing.T, addr string) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(serverURL())
	if err != nil {
		t.Fatalf("%s: %v", envURL, err)
	}
	if addr != "" {
		opt.Addr = addr
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.Ping(testenv.Context(t, 5*time.Second)).Err(); err != nil {
		t.Fatalf("Redis is not reachable at %s (set %s to use another server): %v; %s", serverURL(), envURL, err, startHint)
	}
	return rdb
}

// conformanceEnv is one conformance test's stream (deleted at the end),
// published to by redissink; each adapter connects through a fault proxy
// of its own.
type conformanceEnv struct {
	admin  *redis.Client
	stream string
	sink   *redissink.Sink

	mu      sync.Mutex
	proxies map[consumertest.Adapter]*faultproxy.Proxy
}

func newConformanceEnv(t *testing.T) *conformanceEnv {
	t.Helper()
	admin := connect(t, "")
	e := &conformanceEnv{admin: admin, stream: testenv.Name("c") + ".orders", proxies: map[consumertest.Adapter]*faultproxy.Proxy{}}
	t.Cleanup(func() { admin.Del(context.Background(), e.stream) })
	s, err := redissink.New(admin, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	e.sink = s
	return e
}

// TestConformance runs the consumer conformance suite on the real Redis
// and PostgreSQL, publishing with redissink. Each adapter has a consumer
// name of its own, so the crashed adapter's entry reaches the second one
// through XAUTOCLAIM (ClaimIdle 1s).
func TestConformance(t *testing.T) {
	env := consumertest.PerTest(newConformanceEnv)
	consumertest.Run(t, consumertest.Harness[pgx.Tx]{
		Store: pgstore.New,
		Dest:  func(t *testing.T, _ string) string { return env(t).stream },
		Publish: func(t *testing.T, msgs []sink.Message) {
			consumertest.PublishAll(t, env(t).sink, msgs)
		},
		Start: func(t *testing.T, ib *inbox.Inbox[pgx.Tx], h consumer.Handler[pgx.Tx], cfg consumer.Config) consumertest.Adapter {
			e := env(t)
			opt, err := redis.ParseURL(serverURL())
			if err != nil {
				t.Fatal(err)
			}
			proxy, err := faultproxy.Start(opt.Addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = proxy.Close() })
			rdb := connect(t, proxy.Addr())
			c, err := redisconsumer.New(rdb, ib, h, &redisconsumer.Config{Config: cfg, Streams: []string{e.stream}, Group: "conformance",
				Consumer: testenv.Name("member"), Block: 200 * time.Millisecond, ClaimIdle: time.Second})
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
			e := env(t)
			groups, err := e.admin.XInfoGroups(testenv.Context(t, 10*time.Second), e.stream).Result()
			if err != nil {
				return 0, err
			}
			n := 0
			for _, g := range groups {
				if g.Name == "conformance" {
					n += int(g.Pending + g.Lag)
				}
			}
			return n, nil
		},
		Ordered: true,
		Settle:  30 * time.Second,
	})
}
