package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/kafkasink"
	"github.com/outboxkit/outbox/sink/natssink"
	"github.com/outboxkit/outbox/sink/stdoutsink"
)

// Sink URLs the delivery scenarios take (Config.Sink).
const (
	// DefaultSink is the local NATS server.
	DefaultSink = "nats://127.0.0.1:4222"
	// KafkaInProcess starts an in-process Kafka cluster (kfake) for the
	// run: "kafka://" with no address.
	KafkaInProcess = "kafka://"
)

// broker is what the delivery scenarios need of a broker: a sink for the
// relay, a raw publisher that stands for the broker's own limit, and a
// consumer that sees what arrived.
type broker interface {
	// Describe names the broker and where it runs, for the report.
	Describe() string
	// Sink returns a sink publishing to the broker's bench destination,
	// for the relay; the caller closes it.
	Sink(ctx context.Context) (sink.Sink, error)
	// Destination is the routing replacement that lands events in the
	// bench destination ("${routedByValue}" is the aggregate type).
	Destination() string
	// RawDestination is where the raw publishes of destination go, out of
	// the consumer's sight.
	RawDestination(destination string) string
	// RelayArgs are the `outbox relay` flags that publish to the bench
	// destination.
	RelayArgs() []string
	// Raw publishes msgs straight through the broker's client, with
	// asynchronous acknowledgements and no database, and returns once
	// every message was acknowledged.
	Raw(ctx context.Context, msgs []sink.Message) error
	// Consume calls fn with the event id of every message the relay
	// published to the bench destination, from the first, until stop.
	Consume(ctx context.Context, fn func(id string)) (stop func(), err error)
	Close() error
}

// openBroker opens the broker a sink URL names: nats://, kafka://
// (in-process kfake when no address is given), pubsub:// and kinesis://
// (cloud.go) or stdout: (a null writer: no acknowledgement, no consumer).
func openBroker(ctx context.Context, rawURL, tag string) (broker, error) {
	scheme, rest, _ := strings.Cut(rawURL, "://")
	switch strings.ToLower(scheme) {
	case "nats", "tls":
		return openNATS(ctx, rawURL, tag)
	case "kafka":
		return openKafka(ctx, rest, tag)
	case "pubsub":
		return openPubSub(ctx, rest, tag)
	case "kinesis":
		return openKinesis(ctx, rawURL, tag)
	case "stdout:", "stdout":
		return nullBroker{}, nil
	default:
		return nil, fmt.Errorf("bench: sink %q: use stdout:, nats://host:port, kafka:// (in-process), kafka://host:port, pubsub:// (in-process), pubsub://PROJECT or kinesis://?region=REGION[&endpoint=URL]", rawURL)
	}
}

// natsBroker publishes to a file-backed stream of its own on subjects
// "<tag>.>", deleted at Close.
type natsBroker struct {
	url    string
	nc     *nats.Conn
	js     jetstream.JetStream
	stream string
}

func openNATS(ctx context.Context, url, tag string) (*natsBroker, error) {
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("bench: cannot connect to NATS at %s: %v (is nats-server running with -js?)", url, err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(natssink.DefaultMaxPending))
	if err != nil {
		nc.Close()
		return nil, err
	}
	b := &natsBroker{url: url, nc: nc, js: js, stream: strings.ToUpper(tag)}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: b.stream, Subjects: []string{tag + ".>"}, Storage: jetstream.FileStorage}); err != nil {
		nc.Close()
		return nil, fmt.Errorf("bench: create JetStream stream %s: %w", b.stream, err)
	}
	return b, nil
}

func (b *natsBroker) Describe() string {
	return fmt.Sprintf("NATS JetStream %s at %s, file-backed stream %s", b.nc.ConnectedServerVersion(), b.url, b.stream)
}

func (b *natsBroker) Destination() string { return strings.ToLower(b.stream) + ".${routedByValue}" }

func (b *natsBroker) RawDestination(d string) string {
	return strings.Replace(d, strings.ToLower(b.stream)+".", strings.ToLower(b.stream)+".raw.", 1)
}

func (b *natsBroker) RelayArgs() []string {
	return []string{"--sink", b.url, "--nats-stream", b.stream, "--nats-subjects", strings.ToLower(b.stream) + ".>", "--nats-no-create-stream"}
}

func (b *natsBroker) Sink(ctx context.Context) (sink.Sink, error) {
	return natssink.DialStream(ctx, b.url, &natssink.Config{Stream: b.stream, Subjects: []string{strings.ToLower(b.stream) + ".>"}, NoCreateStream: true})
}

func (b *natsBroker) Raw(ctx context.Context, msgs []sink.Message) error {
	futures := make([]jetstream.PubAckFuture, 0, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		nm := nats.NewMsg(m.Destination)
		nm.Data = m.Value
		nm.Header.Set(jetstream.MsgIDHeader, m.ID)
		nm.Header.Set("id", m.ID)
		nm.Header.Set(natssink.KeyHeader, string(m.Key))
		for _, h := range m.Headers {
			nm.Header.Add(h.Key, h.Value)
		}
		// On a loaded machine the broker may take longer than the
		// default 200ms to make room for more: wait, do not fail.
		f, err := b.js.PublishMsgAsync(nm, jetstream.WithStallWait(30*time.Second))
		if err != nil {
			return fmt.Errorf("bench: raw publish: %w", err)
		}
		futures = append(futures, f)
	}
	select {
	case <-b.js.PublishAsyncComplete():
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Minute):
		return errors.New("bench: raw publish: no acknowledgement of every message within a minute")
	}
	for _, f := range futures {
		select {
		case err := <-f.Err():
			return fmt.Errorf("bench: raw publish: %w", err)
		default:
		}
	}
	return nil
}

func (b *natsBroker) Consume(ctx context.Context, fn func(id string)) (func(), error) {
	return b.consume(ctx, func(id string, _ time.Time) { fn(id) })
}

// consume is Consume that also gives the time JetStream stored each
// message (its metadata): when the relay's publish of it was done.
func (b *natsBroker) consume(ctx context.Context, fn func(id string, stored time.Time)) (func(), error) {
	// The relay's subjects (<tag>.<aggregate type>), not the raw
	// publishes (<tag>.raw.<aggregate type>).
	cons, err := b.js.OrderedConsumer(ctx, b.stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{strings.ToLower(b.stream) + ".*"}})
	if err != nil {
		return nil, fmt.Errorf("bench: consumer: %w", err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		var stored time.Time
		if md, err := m.Metadata(); err == nil {
			stored = md.Timestamp
		}
		fn(m.Headers().Get("id"), stored)
	}, jetstream.PullMaxMessages(4096))
	if err != nil {
		return nil, fmt.Errorf("bench: consumer: %w", err)
	}
	return cc.Stop, nil
}

func (b *natsBroker) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := b.js.DeleteStream(ctx, b.stream)
	b.nc.Close()
	return err
}

// kafkaBroker publishes to a topic of its own, on a cluster given by
// address or started in process (kfake).
type kafkaBroker struct {
	seeds   []string
	cluster *kfake.Cluster
	client  *kgo.Client
	topic   string
}

func openKafka(ctx context.Context, hosts, tag string) (*kafkaBroker, error) {
	b := &kafkaBroker{topic: tag}
	if hosts == "" {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
		if err != nil {
			return nil, fmt.Errorf("bench: in-process Kafka: %w", err)
		}
		b.cluster, b.seeds = c, c.ListenAddrs()
	} else {
		seeds, err := kafkasink.ParseURL("kafka://" + hosts)
		if err != nil {
			return nil, err
		}
		b.seeds = seeds
	}
	client, err := kgo.NewClient(append(kafkasink.Options(), kgo.SeedBrokers(b.seeds...), kgo.AllowAutoTopicCreation(), kgo.MaxBufferedRecords(1<<20))...)
	if err != nil {
		b.Close()
		return nil, err
	}
	b.client = client
	return b, nil
}

func (b *kafkaBroker) Describe() string {
	if b.cluster != nil {
		return "Kafka: in-process kfake cluster (1 broker) at " + strings.Join(b.seeds, ",") + ", topic " + b.topic
	}
	return "Kafka at " + strings.Join(b.seeds, ",") + ", topic " + b.topic
}

// Destination is the topic: every event goes to the one topic.
func (b *kafkaBroker) Destination() string { return b.topic }

func (b *kafkaBroker) RawDestination(d string) string { return d + "_raw" }

func (b *kafkaBroker) RelayArgs() []string {
	return []string{"--sink", "kafka://" + strings.Join(b.seeds, ",")}
}

func (b *kafkaBroker) Sink(ctx context.Context) (sink.Sink, error) {
	return kafkasink.Dial(ctx, "kafka://"+strings.Join(b.seeds, ","), nil, kgo.AllowAutoTopicCreation())
}

func (b *kafkaBroker) Raw(ctx context.Context, msgs []sink.Message) error {
	var (
		mu       sync.Mutex
		firstErr error
	)
	for i := range msgs {
		m := &msgs[i]
		r := &kgo.Record{Topic: m.Destination, Key: m.Key, Value: m.Value}
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: "id", Value: []byte(m.ID)})
		b.client.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		})
	}
	if err := b.client.Flush(ctx); err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	if firstErr != nil {
		return fmt.Errorf("bench: raw produce: %w", firstErr)
	}
	return nil
}

func (b *kafkaBroker) Consume(ctx context.Context, fn func(id string)) (func(), error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.seeds...), kgo.ConsumeTopics(b.topic), kgo.AllowAutoTopicCreation(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(10*time.Millisecond))
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for cctx.Err() == nil {
			fs := cl.PollFetches(cctx)
			fs.EachRecord(func(r *kgo.Record) {
				for _, h := range r.Headers {
					if h.Key == "id" {
						fn(string(h.Value))
					}
				}
			})
		}
	}()
	return func() { cancel(); <-done; cl.Close() }, nil
}

func (b *kafkaBroker) Close() error {
	if b.client != nil {
		b.client.Close()
	}
	if b.cluster != nil {
		b.cluster.Close()
	}
	return nil
}

// nullBroker writes to a null writer: the relay's own cost with a sink
// that costs nothing. It has no consumer: latency is not measurable.
type nullBroker struct{}

func (nullBroker) Describe() string    { return "stdout sink writing to a null writer (no broker)" }
func (nullBroker) Destination() string { return "bench.${routedByValue}" }
func (nullBroker) Sink(context.Context) (sink.Sink, error) {
	return stdoutsink.New(discard{}), nil
}
func (nullBroker) Raw(context.Context, []sink.Message) error { return nil }
func (nullBroker) RawDestination(d string) string            { return d }
func (nullBroker) RelayArgs() []string                       { return []string{"--sink", "stdout:"} }
func (nullBroker) Consume(context.Context, func(string)) (func(), error) {
	return nil, fmt.Errorf("%w: the stdout sink has none; latency needs nats:// or kafka://", errNoConsumer)
}
func (nullBroker) Close() error { return nil }

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
