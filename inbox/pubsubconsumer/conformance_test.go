package pubsubconsumer_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/inbox/consumertest"
	"github.com/outboxkit/outbox/inbox/internal/pgstore"
	"github.com/outboxkit/outbox/inbox/pubsubconsumer"
	"github.com/outboxkit/outbox/internal/faultproxy"
	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/pubsubsink"
)

const project = "outbox-test"

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// started by an init function of a dependency of the Pub/Sub client
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		// the client's stream pinger, which notices that Receive returned
		// only at its next tick (up to 30s later)
		goleak.IgnoreTopFunction("cloud.google.com/go/pubsub/v2.(*messageIterator).streamKeepAliveHandler"))
}

// client connects to addr, closed when the test ends.
func client(t *testing.T, addr string) (*pubsub.Client, *grpc.ClientConn) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	c, err := pubsub.NewClient(context.Background(), project, option.WithGRPCConn(conn))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, conn
}

// pubsubEnv is one test's in-process Pub/Sub (pstest): a topic and an
// ordered subscription (ack deadline 10s), published to by pubsubsink.
type pubsubEnv struct {
	srv   *pstest.Server
	admin *pubsub.Client
	topic string
	sub   string
	sink  *pubsubsink.Sink

	mu    sync.Mutex
	conns map[consumertest.Adapter]crashable
}

// crashable is what Crash cuts: the adapter's proxy and its connection.
type crashable struct {
	proxy *faultproxy.Proxy
	conn  *grpc.ClientConn
}

func newPubsubEnv(t *testing.T, topic string) *pubsubEnv {
	t.Helper()
	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	admin, _ := client(t, srv.Addr)
	e := &pubsubEnv{srv: srv, admin: admin, topic: topic, sub: "billing", conns: map[consumertest.Adapter]crashable{}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.admin.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/" + project + "/topics/" + topic}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: "projects/" + project + "/subscriptions/" + e.sub, Topic: "projects/" + project + "/topics/" + topic,
		AckDeadlineSeconds: 10, EnableMessageOrdering: true}); err != nil {
		t.Fatal(err)
	}
	s, err := pubsubsink.New(e.admin, project, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	e.sink = s
	return e
}

// start starts a consumer reaching the server through a fault proxy.
func (e *pubsubEnv) start(t *testing.T, ib *inbox.Inbox[pgx.Tx], h consumer.Handler[pgx.Tx], cfg consumer.Config) *pubsubconsumer.Consumer[pgx.Tx] {
	t.Helper()
	proxy, err := faultproxy.Start(e.srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	cl, conn := client(t, proxy.Addr())
	c, err := pubsubconsumer.New(cl, ib, h, &pubsubconsumer.Config{Config: cfg, Subscription: e.sub, AckExtension: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	e.mu.Lock()
	e.conns[c] = crashable{proxy: proxy, conn: conn}
	e.mu.Unlock()
	return c
}

// unacked counts the topic's messages no client acknowledged.
func (e *pubsubEnv) unacked() int {
	n := 0
	for _, m := range e.srv.Messages() {
		if strings.HasSuffix(m.Topic, "/"+e.topic) && m.Acks == 0 {
			n++
		}
	}
	return n
}

// TestConformance runs the consumer conformance suite on the in-process
// Pub/Sub fake the sink's tests use (pstest) and the real PostgreSQL,
// publishing with pubsubsink; the crashed adapter's message comes back once
// its ack deadline (extended by 10s at a time) passed.
func TestConformance(t *testing.T) {
	env := consumertest.PerTest(func(t *testing.T) *pubsubEnv { return newPubsubEnv(t, "orders") })
	consumertest.Run(t, consumertest.Harness[pgx.Tx]{
		Store: pgstore.New,
		Dest:  func(t *testing.T, _ string) string { return env(t).topic },
		Publish: func(t *testing.T, msgs []sink.Message) {
			consumertest.PublishAll(t, env(t).sink, msgs)
		},
		Start: func(t *testing.T, ib *inbox.Inbox[pgx.Tx], h consumer.Handler[pgx.Tx], cfg consumer.Config) consumertest.Adapter {
			return env(t).start(t, ib, h, cfg)
		},
		// The process dies: its connection drops and is gone for good
		// (while the service is merely unreachable, the client's Receive
		// keeps retrying and does not return).
		Crash: func(t *testing.T, a consumertest.Adapter) {
			e := env(t)
			e.mu.Lock()
			defer e.mu.Unlock()
			e.conns[a].proxy.Cut()
			_ = e.conns[a].conn.Close()
		},
		Pending: func(t *testing.T) (int, error) { return env(t).unacked(), nil },
		Ordered: true,
		Settle:  60 * time.Second,
	})
}
