package kafkasink

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/sinktest"
)

// conformanceEnv is one conformance test's broker: a fake cluster of its
// own, and an admin client that creates its topics.
type conformanceEnv struct {
	c     *kfake.Cluster
	admin *kgo.Client

	mu     sync.Mutex
	topics map[string]bool
}

func newConformanceEnv(t *testing.T) *conformanceEnv {
	t.Helper()
	c := newCluster(t)
	admin, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	return &conformanceEnv{c: c, admin: admin, topics: map[string]bool{}}
}

func ctx10s(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// topic creates topic with three partitions, once.
func (e *conformanceEnv) topic(t *testing.T, topic string) string {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.topics[topic] {
		return topic
	}
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, 3, 1
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx10s(t), e.admin)
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	if err := kerr.ErrorForCode(resp.Topics[0].ErrorCode); err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	e.topics[topic] = true
	return topic
}

// setMaxMessageBytes sets the topic's max.message.bytes.
func (e *conformanceEnv) setMaxMessageBytes(t *testing.T, topic, value string) {
	t.Helper()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	rr := kmsg.NewIncrementalAlterConfigsRequestResource()
	rr.ResourceType, rr.ResourceName = kmsg.ConfigResourceTypeTopic, topic
	cfg := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	cfg.Name, cfg.Value, cfg.Op = "max.message.bytes", &value, kmsg.IncrementalAlterConfigOpSet
	rr.Configs = append(rr.Configs, cfg)
	req.Resources = append(req.Resources, rr)
	resp, err := req.RequestWith(ctx10s(t), e.admin)
	if err != nil {
		t.Fatalf("alter config of %s: %v", topic, err)
	}
	if err := kerr.ErrorForCode(resp.Resources[0].ErrorCode); err != nil {
		t.Fatalf("alter config of %s: %v", topic, err)
	}
}

// read consumes topics from the start until at least want records are there
// (or 10s passed) and no more arrive for 200ms.
func (e *conformanceEnv) read(t *testing.T, topics []string, want int) []sinktest.Received {
	t.Helper()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(e.c.ListenAddrs()...),
		kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(50*time.Millisecond),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var got []sinktest.Received
	deadline := time.Now().Add(10 * time.Second)
	for {
		wait := 200 * time.Millisecond
		if len(got) < want {
			wait = time.Until(deadline)
		}
		if wait <= 0 {
			return got
		}
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("fetch %s/%d: %v", topic, p, err)
			}
		})
		recs := fs.Records()
		if len(recs) == 0 && len(got) >= want {
			return got
		}
		for _, r := range recs {
			id, _ := header(r, "id")
			hs := map[string][]string{}
			for _, h := range r.Headers {
				hs[h.Key] = append(hs[h.Key], string(h.Value))
			}
			got = append(got, sinktest.Received{ID: id, Destination: r.Topic, Key: r.Key, Value: r.Value, Headers: hs})
		}
	}
}

// TestConformance runs the sink conformance suite against a fake cluster
// per test, with three partitions per topic.
//
// Outage is not provided: kfake cannot be stopped and started again on the
// same address, and a fault proxy in front of it is bypassed, since the
// client connects to the broker address the cluster advertises in its
// metadata, not to its seed address.
func TestConformance(t *testing.T) {
	env := sinktest.PerTest(newConformanceEnv)
	sinktest.Run(t, sinktest.Harness{
		New: func(t *testing.T) sink.Sink {
			s, err := Dial(ctx10s(t), clusterURL(env(t).c), quiet)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
		Dest: func(t *testing.T, name string) string { return env(t).topic(t, name) },
		Read: func(t *testing.T, dests []string, want int) []sinktest.Received {
			return env(t).read(t, dests, want)
		},
		DedupeKey: false, // the idempotent producer drops its own retries, not publishes of the same id
		KeyHeader: "",    // Kafka records have a key
		TooLarge: func(t *testing.T, dest string) *sink.Message {
			env(t).setMaxMessageBytes(t, dest, "8192")
			return &sink.Message{Destination: dest, Key: []byte("k"), Value: incompressible(16 << 10)}
		},
	})
}
