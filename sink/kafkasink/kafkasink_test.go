package kafkasink

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"

	"github.com/outboxkit/outbox/sink"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var quiet = &Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}

// newCluster starts a one-broker fake cluster, closed when the test ends.
func newCluster(t *testing.T, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func clusterURL(c *kfake.Cluster) string {
	return "kafka://" + strings.Join(c.ListenAddrs(), ",")
}

// dial returns a Sink that owns its client, closed when the test ends.
func dial(t *testing.T, c *kfake.Cluster, cfg *Config, extra ...kgo.Opt) *Sink {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := Dial(ctx, clusterURL(c), cfg, extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func publish(t *testing.T, s *Sink, msgs []sink.Message) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := s.Publish(ctx, msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("Publish returned %d results for %d messages", len(errs), len(msgs))
	}
	return errs
}

// consume reads n records from the start of topics, failing the test if
// they do not come within a few seconds, and then checks for a few
// milliseconds that no more arrive.
func consume(t *testing.T, c *kfake.Cluster, n int, topics ...string) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(50*time.Millisecond),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	deadline := time.Now().Add(10 * time.Second)
	for len(recs) < n && time.Now().Before(deadline) {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("fetch %s/%d: %v", topic, p, err)
			}
		})
		recs = append(recs, fs.Records()...)
	}
	if len(recs) < n {
		t.Fatalf("consumed %d records, want %d", len(recs), n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if extra := cl.PollFetches(ctx).Records(); len(extra) > 0 {
		recs = append(recs, extra...)
		t.Fatalf("consumed %d records, want exactly %d", len(recs), n)
	}
	return recs
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

func h(k, v string) sink.Header { return sink.Header{Key: k, Value: v} }

func headers(r *kgo.Record) []sink.Header {
	var hs []sink.Header
	for _, h := range r.Headers {
		hs = append(hs, sink.Header{Key: h.Key, Value: string(h.Value)})
	}
	return hs
}

// TestPublishRoundTrip publishes 500 messages over two topics and ten keys
// and reads them back: topic, key, value and headers survive, and every
// key's messages keep their order.
func TestPublishRoundTrip(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(4, "orders", "payments"))
	s := dial(t, c, quiet)

	const n = 500
	msgs := make([]sink.Message, n)
	want := make(map[string]sink.Message, n)
	for i := range msgs {
		topic := "orders"
		if i%3 == 0 {
			topic = "payments"
		}
		m := sink.Message{
			ID:          fmt.Sprintf("evt-%03d", i),
			Destination: topic,
			Key:         fmt.Appendf(nil, "agg-%d", i%10),
			Value:       fmt.Appendf(nil, `{"seq":%d}`, i),
		}
		switch i % 4 {
		case 0: // no headers: the sink adds "id"
		case 1: // repeated custom headers, kept in order after "id"
			m.Headers = []sink.Header{h("type", "Created"), h("trace", "t1"), h("type", "Again")}
		case 2: // the router already put "id" first
			m.Headers = []sink.Header{h("id", m.ID), h("type", "Updated")}
		case 3: // "id" given later: left where it is
			m.Headers = []sink.Header{h("type", "Deleted"), h("id", m.ID)}
		}
		msgs[i] = m
		want[m.ID] = m
	}
	for i, err := range publish(t, s, msgs) {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}

	recs := consume(t, c, n, "orders", "payments")
	lastSeq := map[string]int{} // topic/key -> last seq seen
	partOf := map[string]int32{}
	for _, r := range recs {
		id, ok := header(r, "id")
		if !ok {
			t.Fatalf("record %s/%d@%d has no id header", r.Topic, r.Partition, r.Offset)
		}
		m, ok := want[id]
		if !ok {
			t.Fatalf("unexpected or duplicate record id %q", id)
		}
		delete(want, id)
		if r.Topic != m.Destination || !bytes.Equal(r.Key, m.Key) || !bytes.Equal(r.Value, m.Value) {
			t.Fatalf("record %s = topic %q key %q value %q; want %q %q %q", id, r.Topic, r.Key, r.Value, m.Destination, m.Key, m.Value)
		}
		wantHs := m.Headers
		if _, ok := m.Header("id"); !ok {
			wantHs = append([]sink.Header{h("id", m.ID)}, m.Headers...)
		}
		if got := headers(r); !slices.Equal(got, wantHs) {
			t.Fatalf("record %s headers = %v, want %v", id, got, wantHs)
		}

		var seq int
		fmt.Sscanf(string(r.Value), `{"seq":%d}`, &seq)
		tk := r.Topic + "/" + string(r.Key)
		if p, ok := partOf[tk]; ok && p != r.Partition {
			t.Fatalf("key %s spread over partitions %d and %d", tk, p, r.Partition)
		}
		partOf[tk] = r.Partition
		if last, ok := lastSeq[tk]; ok && seq <= last {
			t.Fatalf("key %s: seq %d consumed after %d", tk, seq, last)
		}
		lastSeq[tk] = seq
	}
	if len(lastSeq) != 20 {
		t.Fatalf("saw %d topic/key pairs, want 20", len(lastSeq))
	}
	parts := map[int32]bool{}
	for _, p := range partOf {
		parts[p] = true
	}
	if len(parts) < 2 {
		t.Fatalf("all keys landed on one partition; the key is not hashed")
	}
}

func smallAndHuge(topic string, hugeSize int) ([]sink.Message, int) {
	var msgs []sink.Message
	for i := range 20 {
		msgs = append(msgs, sink.Message{
			ID: fmt.Sprintf("small-%d", i), Destination: topic, Key: []byte("k"),
			Value: []byte(`{"small":true}`),
		})
	}
	const huge = 10
	msgs[huge] = sink.Message{
		ID: "huge", Destination: topic, Key: []byte("k"),
		Value: incompressible(hugeSize),
	}
	return msgs, huge
}

// incompressible returns n random bytes, which compression cannot shrink
// below a size limit.
func incompressible(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func checkOnlyHugeFailed(t *testing.T, errs []error, huge int) {
	t.Helper()
	for i, err := range errs {
		if i == huge {
			if !sink.IsPermanent(err) || !errors.Is(err, kerr.MessageTooLarge) {
				t.Fatalf("oversized message: got %v, want a permanent MessageTooLarge", err)
			}
			if !strings.Contains(err.Error(), `kafkasink: produce to topic "big"`) {
				t.Fatalf("oversized message error lacks context: %v", err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
}

// TestOversizedClientLimit: a record bigger than the client's batch limit is
// failed by the client before it is sent; it alone fails, permanently.
func TestOversizedClientLimit(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(1, "big"))
	s := dial(t, c, quiet, kgo.ProducerBatchMaxBytes(16<<10))
	msgs, huge := smallAndHuge("big", 64<<10)
	checkOnlyHugeFailed(t, publish(t, s, msgs), huge)
	consume(t, c, len(msgs)-1, "big")
}

// TestOversizedBrokerLimit: the topic's max.message.bytes is below the
// client's batch size, so the broker rejects the whole batch that holds the
// oversized record. The sink produces the batch's records again one by one:
// only the oversized one fails, permanently, and none is written twice.
func TestOversizedBrokerLimit(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(1, "big"), kfake.BrokerConfigs(map[string]string{"message.max.bytes": "8192"}))
	var logs bytes.Buffer
	s := dial(t, c, &Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	msgs, huge := smallAndHuge("big", 16<<10)
	checkOnlyHugeFailed(t, publish(t, s, msgs), huge)
	recs := consume(t, c, len(msgs)-1, "big")
	seen := map[string]bool{}
	for _, r := range recs {
		id, _ := header(r, "id")
		if seen[id] || id == "huge" {
			t.Fatalf("record %q consumed twice or should not exist", id)
		}
		seen[id] = true
	}
	if !strings.Contains(logs.String(), "ProducerBatchMaxBytes") {
		t.Fatalf("no warning about the batch size was logged: %q", logs.String())
	}

	// The partition keeps working after the rejected batch.
	ok := []sink.Message{{ID: "after", Destination: "big", Key: []byte("k"), Value: []byte("{}")}}
	if err := publish(t, s, ok)[0]; err != nil {
		t.Fatalf("publish after rejected batch: %v", err)
	}
}

// TestInvalidTopic: invalid topic names fail permanently, before any
// produce, while the other messages are published.
func TestInvalidTopic(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(1, "good.topic_1-x"))
	s := dial(t, c, quiet)
	bad := []string{"", ".", "..", "has space", "slash/topic", "ünï", strings.Repeat("a", 250)}
	var msgs []sink.Message
	for i, topic := range bad {
		msgs = append(msgs,
			sink.Message{ID: fmt.Sprint("ok", i), Destination: "good.topic_1-x", Key: []byte("k"), Value: []byte("1")},
			sink.Message{ID: fmt.Sprint("bad", i), Destination: topic, Key: []byte("k"), Value: []byte("1")},
		)
	}
	for i, err := range publish(t, s, msgs) {
		if i%2 == 0 {
			if err != nil {
				t.Fatalf("valid message %d: %v", i, err)
			}
			continue
		}
		if !sink.IsPermanent(err) || !strings.Contains(err.Error(), "invalid topic name") {
			t.Fatalf("topic %q: got %v, want a permanent invalid topic error", msgs[i].Destination, err)
		}
	}
	consume(t, c, len(bad), "good.topic_1-x")
}

func TestValidateTopic(t *testing.T) {
	for _, ok := range []string{"a", "orders", "Orders.v1", "a_b-c.d", "...", strings.Repeat("z", 249)} {
		if err := ValidateTopic(ok); err != nil {
			t.Errorf("ValidateTopic(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "a b", "a/b", "a:b", "é", "a\n", strings.Repeat("z", 250)} {
		if err := ValidateTopic(bad); err == nil {
			t.Errorf("ValidateTopic(%q) = nil, want an error", bad)
		}
	}
}

// TestBrokerErrors: errors the broker returns are classified as the relay
// needs: authorization failures are permanent, retriable errors that last
// past ctx are transient, and other topics in the batch are unaffected.
func TestBrokerErrors(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(1, "ok", "denied", "flaky"))
	s := dial(t, c, quiet)
	c.Fault(
		kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "denied", Err: kerr.TopicAuthorizationFailed, Count: -1},
		kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "flaky", Err: kerr.NotEnoughReplicas, Count: -1},
	)
	msgs := []sink.Message{
		{ID: "1", Destination: "ok", Key: []byte("k")},
		{ID: "2", Destination: "denied", Key: []byte("k")},
		{ID: "3", Destination: "flaky", Key: []byte("k")},
		{ID: "4", Destination: "ok", Key: []byte("k")},
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	errs := s.Publish(ctx, msgs)
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Publish took %v after a 1s deadline", d)
	}
	if errs[0] != nil || errs[3] != nil {
		t.Fatalf("ok topic: %v, %v", errs[0], errs[3])
	}
	if !sink.IsPermanent(errs[1]) || !errors.Is(errs[1], kerr.TopicAuthorizationFailed) {
		t.Fatalf("denied topic: got %v, want permanent TopicAuthorizationFailed", errs[1])
	}
	if errs[2] == nil || sink.IsPermanent(errs[2]) {
		t.Fatalf("flaky topic: got %v, want a transient error", errs[2])
	}
}

// TestUnknownTopic: a topic that does not exist (and is not auto-created)
// fails transiently: it may be created later.
func TestUnknownTopic(t *testing.T) {
	c := newCluster(t)
	s := dial(t, c, quiet, kgo.UnknownTopicRetries(0), kgo.RetryBackoffFn(func(int) time.Duration { return 10 * time.Millisecond }))
	err := publish(t, s, []sink.Message{{ID: "1", Destination: "missing", Key: []byte("k")}})[0]
	if err == nil || sink.IsPermanent(err) || !errors.Is(err, kerr.UnknownTopicOrPartition) {
		t.Fatalf("got %v, want a transient UnknownTopicOrPartition", err)
	}
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err       error
		permanent bool
	}{
		{kerr.MessageTooLarge, true},
		{fmt.Errorf("%w (uncompressed_bytes=9)", kerr.MessageTooLarge), true},
		{kerr.RecordListTooLarge, true},
		{kerr.InvalidRecord, true},
		{kerr.InvalidTopicException, true},
		{kerr.TopicAuthorizationFailed, true},
		{kerr.UnknownTopicOrPartition, false},
		{kerr.NotEnoughReplicas, false},
		{kerr.RequestTimedOut, false},
		{kgo.ErrRecordTimeout, false},
		{kgo.ErrRecordRetries, false},
		{kgo.ErrClientClosed, false},
		{context.DeadlineExceeded, false},
		{errors.New("dial tcp: connection refused"), false},
	} {
		got := classify("t", tc.err)
		if sink.IsPermanent(got) != tc.permanent || !errors.Is(got, tc.err) {
			t.Errorf("classify(%v) = %v, permanent %v; want permanent %v", tc.err, got, sink.IsPermanent(got), tc.permanent)
		}
	}
	if classify("t", nil) != nil {
		t.Error("classify(nil) != nil")
	}
}

// TestContext: a cancelled context fails every message at once, and a
// deadline that passes while records are in flight ends Publish on time.
func TestContext(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(1, "t"))
	s := dial(t, c, quiet)
	msgs := []sink.Message{{ID: "1", Destination: "t"}, {ID: "2", Destination: "t"}}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i, err := range s.Publish(ctx, msgs) {
		if !errors.Is(err, context.Canceled) || sink.IsPermanent(err) {
			t.Fatalf("message %d: got %v, want transient context.Canceled", i, err)
		}
	}

	// The broker holds every produce request: Publish must give up at
	// its deadline rather than wait for the broker.
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock) // before the cluster closes
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		c.SleepControl(func() { <-release })
		return nil, nil, false
	})
	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	errs := s.Publish(ctx, msgs)
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Publish returned %v after its deadline", d)
	}
	for i, err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) || sink.IsPermanent(err) {
			t.Fatalf("message %d: got %v, want transient context.DeadlineExceeded", i, err)
		}
	}
	unblock()
}

func TestDialErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String() // nothing listens here once we close it
	ln.Close()

	for _, tc := range []struct{ url, want string }{
		{"http://localhost:9092", `scheme "http" is not kafka`},
		{"localhost:9092", "no scheme"},
		{"kafka://", "no broker"},
		{"kafka://localhost", `broker "localhost" is not host:port`},
		{"kafka://localhost:", `invalid port ""`},
		{"kafka://localhost:abc", `invalid port "abc"`},
		{"kafka://localhost:70000", `invalid port "70000"`},
		{"kafka://:9092", "has no host"},
		{"kafka://a:1,,b:2", "empty broker address"},
		{"kafka://user:pw@localhost:9092", "credentials"},
		{"kafka://localhost:9092/topic", `unexpected "/topic"`},
		{"kafka://" + closed, "kafkasink: cannot reach kafka://" + closed + ": "},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		start := time.Now()
		s, err := Dial(ctx, tc.url, quiet)
		cancel()
		if err == nil {
			s.Close()
			t.Errorf("Dial(%q) succeeded", tc.url)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("Dial(%q) = %q, want one line containing %q", tc.url, err, tc.want)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("Dial(%q) took %v", tc.url, d)
		}
	}
	_, err = Dial(context.Background(), "kafka://"+closed, quiet)
	if err == nil || !strings.HasSuffix(err.Error(), "(check the broker address)") {
		t.Errorf("unreachable broker: %v", err)
	}
}

func TestParseURL(t *testing.T) {
	got, err := ParseURL("KAFKA://a:1,b.example:9092,[::1]:9093/")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a:1", "b.example:9092", "[::1]:9093"}; !slices.Equal(got, want) {
		t.Fatalf("ParseURL = %v, want %v", got, want)
	}
}

// TestProducerSettings inspects the produce requests the broker receives:
// acks=all (-1) and an idempotent producer id on every batch.
func TestProducerSettings(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(2, "t"))
	var (
		mu       sync.Mutex
		requests int
		problems []string
	)
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.ProduceRequest)
		mu.Lock()
		defer mu.Unlock()
		requests++
		if req.Acks != -1 {
			problems = append(problems, fmt.Sprintf("acks = %d", req.Acks))
		}
		if req.TransactionID != nil {
			problems = append(problems, "transactional produce")
		}
		for _, rt := range req.Topics {
			for _, rp := range rt.Partitions {
				var b kmsg.RecordBatch
				if err := b.ReadFrom(rp.Records); err != nil {
					problems = append(problems, err.Error())
				} else if b.ProducerID < 0 || b.ProducerEpoch < 0 || b.FirstSequence < 0 {
					problems = append(problems, fmt.Sprintf("batch not idempotent: producer id %d epoch %d seq %d", b.ProducerID, b.ProducerEpoch, b.FirstSequence))
				}
			}
		}
		return nil, nil, false // observe only: the broker handles it
	})
	s := dial(t, c, quiet)
	var msgs []sink.Message
	for i := range 50 {
		msgs = append(msgs, sink.Message{ID: fmt.Sprint(i), Destination: "t", Key: fmt.Append(nil, i%5)})
	}
	for i, err := range publish(t, s, msgs) {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if requests == 0 || len(problems) > 0 {
		t.Fatalf("%d produce requests; problems: %v", requests, problems)
	}
}

// TestNew: New checks the client's settings, does no I/O, and Close leaves
// the caller's client open.
func TestNew(t *testing.T) {
	for _, tc := range []struct {
		opts []kgo.Opt
		want string
	}{
		{[]kgo.Opt{kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.LeaderAck())}, "AllISRAcks"},
		{[]kgo.Opt{kgo.DisableIdempotentWrite()}, "idempotently"},
		{[]kgo.Opt{kgo.TransactionalID("x")}, "transactional"},
	} {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers("127.0.0.1:1")}, tc.opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := New(cl, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New with %d opts = %v, want an error mentioning %q", len(tc.opts), err, tc.want)
		}
		cl.Close()
	}
	if _, err := New(nil, nil); err == nil {
		t.Error("New(nil) succeeded")
	}

	c := newCluster(t, kfake.SeedTopics(1, "t"))
	cl, err := kgo.NewClient(append(Options(), kgo.SeedBrokers(c.ListenAddrs()...))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	s, err := New(cl, nil)
	if err != nil {
		t.Fatal(err)
	}
	msg := []sink.Message{{ID: "1", Destination: "t", Key: []byte("k"), Value: []byte("v")}}
	if err := publish(t, s, msg)[0]; err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Publish(context.Background(), msg)[0]; !errors.Is(err, ErrClosed) || sink.IsPermanent(err) {
		t.Fatalf("Publish after Close = %v, want transient ErrClosed", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "t", Value: []byte("still open")}).FirstErr(); err != nil {
		t.Fatalf("caller's client unusable after Sink.Close: %v", err)
	}
}
