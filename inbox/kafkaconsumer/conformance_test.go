package kafkaconsumer_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/inbox/consumertest"
	"github.com/outboxkit/outbox/inbox/internal/pgstore"
	"github.com/outboxkit/outbox/inbox/kafkaconsumer"
	"github.com/outboxkit/outbox/internal/faultproxy"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/kafkasink"
)

// conformanceTopic is the one topic of a conformance test's cluster.
const conformanceTopic = "outbox.event.orders"

// conformanceEnv is one conformance test's in-process cluster (a topic of
// three partitions), published to by kafkasink; each adapter reaches the
// broker through a fault proxy of its own.
type conformanceEnv struct {
	broker string
	sink   *kafkasink.Sink
	admin  *kgo.Client

	mu      sync.Mutex
	proxies map[consumertest.Adapter]*faultproxy.Proxy
}

func newConformanceEnv(t *testing.T) *conformanceEnv {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, conformanceTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	broker := c.ListenAddrs()[0]
	prod, err := kgo.NewClient(append(kafkasink.Options(), kgo.SeedBrokers(broker))...)
	if err != nil {
		t.Fatal(err)
	}
	s, err := kafkasink.New(prod, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(); prod.Close() })
	admin, err := kgo.NewClient(kgo.SeedBrokers(broker))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	return &conformanceEnv{broker: broker, sink: s, admin: admin, proxies: map[consumertest.Adapter]*faultproxy.Proxy{}}
}

// lag is the group's records not committed, over the topic's partitions.
func (e *conformanceEnv) lag(ctx context.Context, group string) (int, error) {
	lo := kmsg.NewPtrListOffsetsRequest()
	lt := kmsg.NewListOffsetsRequestTopic()
	lt.Topic = conformanceTopic
	for p := range int32(3) {
		lp := kmsg.NewListOffsetsRequestTopicPartition()
		lp.Partition, lp.Timestamp = p, -1 // the end
		lt.Partitions = append(lt.Partitions, lp)
	}
	lo.Topics = append(lo.Topics, lt)
	loResp, err := lo.RequestWith(ctx, e.admin)
	if err != nil {
		return 0, err
	}
	end := map[int32]int64{}
	for _, t := range loResp.Topics {
		for _, p := range t.Partitions {
			end[p.Partition] = p.Offset
		}
	}
	of := kmsg.NewPtrOffsetFetchRequest()
	of.Group = group
	ot := kmsg.NewOffsetFetchRequestTopic()
	ot.Topic = conformanceTopic
	ot.Partitions = []int32{0, 1, 2}
	of.Topics = append(of.Topics, ot)
	ofResp, err := of.RequestWith(ctx, e.admin)
	if err != nil {
		return 0, err
	}
	lag := 0
	for p, endOff := range end {
		committed := int64(0)
		for _, t := range ofResp.Topics {
			for _, rp := range t.Partitions {
				if rp.Partition == p && rp.Offset >= 0 {
					committed = rp.Offset
				}
			}
		}
		lag += int(endOff - committed)
	}
	return lag, nil
}

// TestConformance runs the consumer conformance suite on an in-process
// Kafka cluster (kfake) and the real PostgreSQL, publishing with kafkasink.
func TestConformance(t *testing.T) {
	env := consumertest.PerTest(newConformanceEnv)
	consumertest.Run(t, consumertest.Harness[pgx.Tx]{
		Store: pgstore.New,
		Dest:  func(t *testing.T, name string) string { return "outbox.event." + name },
		Publish: func(t *testing.T, msgs []sink.Message) {
			consumertest.PublishAll(t, env(t).sink, msgs)
		},
		Start: func(t *testing.T, ib *inbox.Inbox[pgx.Tx], h consumer.Handler[pgx.Tx], cfg consumer.Config) consumertest.Adapter {
			e := env(t)
			proxy, err := faultproxy.Start(e.broker)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = proxy.Close() })
			var d net.Dialer
			c, err := kafkaconsumer.New(ib, h, &kafkaconsumer.Config{Config: cfg, Brokers: []string{proxy.Addr()},
				Group: "conformance", Topics: []string{conformanceTopic}, CommitInterval: 200 * time.Millisecond,
				Options: []kgo.Opt{
					// Every connection, to any broker the metadata names, goes through the proxy.
					kgo.Dialer(func(ctx context.Context, network, _ string) (net.Conn, error) {
						return d.DialContext(ctx, network, proxy.Addr())
					}),
					kgo.SessionTimeout(6 * time.Second), kgo.RebalanceTimeout(6 * time.Second),
					kgo.HeartbeatInterval(500 * time.Millisecond), kgo.RequestRetries(2),
				}})
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
			n, err := env(t).lag(testenv.Context(t, 10*time.Second), "conformance")
			if err != nil {
				return 0, fmt.Errorf("group lag: %w", err)
			}
			return n, nil
		},
		Ordered: true,
		Settle:  60 * time.Second,
	})
}
