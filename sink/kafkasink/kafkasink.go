package kafkasink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox/internal/confval"
	"github.com/outboxkit/outbox/sink"
)

// Producer settings applied by [Options].
const (
	// Linger is how long a partition waits for more records before its
	// batch is sent: none. A relay hands Publish a batch it already holds,
	// so there is nothing to wait for; records produced while a request is
	// in flight (up to five per broker) still gather into the next one. A
	// linger would hold every batch's last records back for its whole
	// length, as franz-go's own default (10ms) does; without it latency
	// falls and a backlog drains no slower (docs/benchmarks.md#latency).
	// To batch harder, append kgo.ProducerLinger to Options.
	Linger time.Duration = 0
	// MaxBufferedRecords bounds the records the client buffers; Publish
	// blocks (until its context ends) while the buffer is full.
	MaxBufferedRecords = 10_000
	// MaxBufferedBytes bounds the bytes the client buffers, as
	// MaxBufferedRecords bounds records.
	MaxBufferedBytes = 256 << 20
)

// ErrClosed is the (transient) error Publish reports after Close.
var ErrClosed = errors.New("kafkasink: sink closed")

// Config tunes a Sink. The zero value, and a nil *Config, are valid.
type Config struct {
	// Logger receives the sink's own log lines; with Dial it also receives
	// the client's warnings and errors. Default: warnings and errors as
	// text on standard error.
	Logger *slog.Logger
}

// Sink publishes messages to Kafka. It implements sink.Sink and is safe for
// concurrent use.
type Sink struct {
	client *kgo.Client
	owned  bool // Close closes client
	log    *slog.Logger

	closed    atomic.Bool
	closeOnce sync.Once
}

var _ sink.Sink = (*Sink)(nil)

// Options returns the producer options the sink relies on, for callers that
// build their own client for New; append your own options (seed brokers,
// TLS, SASL) after them:
//
//   - kgo.RequiredAcks(kgo.AllISRAcks()): a record counts as written only
//     once every in-sync replica has it. Required.
//   - the idempotent producer stays enabled (it is franz-go's default; never
//     add kgo.DisableIdempotentWrite). Required.
//   - kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)): keyed records
//     go to the partition the Java client picks (murmur2 of the key), so one
//     key keeps one partition and its order.
//   - kgo.ProducerLinger(Linger), kgo.MaxBufferedRecords(MaxBufferedRecords)
//     and kgo.MaxBufferedBytes(MaxBufferedBytes).
//
// If your topics have a max.message.bytes below the broker default, also add
// kgo.ProducerBatchMaxBytes with the smallest of them: the client then never
// builds a batch the broker rejects as too large.
func Options() []kgo.Opt {
	return []kgo.Opt{
		kgo.RequiredAcks(kgo.AllISRAcks()),
		// Let the broker's auto.create.topics.enable decide, as Kafka
		// Connect and Debezium do; without it a new aggregate type fails
		// until someone creates its topic.
		kgo.AllowAutoTopicCreation(),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.ProducerLinger(Linger),
		kgo.MaxBufferedRecords(MaxBufferedRecords),
		kgo.MaxBufferedBytes(MaxBufferedBytes),
	}
}

// New returns a Sink that produces with client. The client must produce with
// acks=all, idempotently and not transactionally (see Options); New checks
// this and does no I/O. Close leaves the client open.
func New(client *kgo.Client, cfg *Config) (*Sink, error) {
	if client == nil {
		return nil, errors.New("kafkasink: nil client")
	}
	if acks, _ := client.OptValue(kgo.RequiredAcks).(kgo.Acks); acks != kgo.AllISRAcks() {
		return nil, errors.New("kafkasink: the client must produce with kgo.RequiredAcks(kgo.AllISRAcks()) (see kafkasink.Options)")
	}
	if disabled, _ := client.OptValue(kgo.DisableIdempotentWrite).(bool); disabled {
		return nil, errors.New("kafkasink: the client must produce idempotently; remove kgo.DisableIdempotentWrite")
	}
	if vs := client.OptValues(kgo.TransactionalID); len(vs) == 2 {
		if set, _ := vs[1].(bool); set {
			return nil, errors.New("kafkasink: the client must not be transactional; remove kgo.TransactionalID")
		}
	}
	var log *slog.Logger
	if cfg != nil {
		log = cfg.Logger
	}
	log = confval.Logger(log)
	return &Sink{client: client, log: log}, nil
}

// Dial parses url (kafka://host:port[,host:port...]), builds a client seeded
// with those brokers from Options and then extra (for TLS, SASL and the
// like), and checks that a broker answers before ctx ends. The returned Sink
// owns the client: Close closes it.
func Dial(ctx context.Context, url string, cfg *Config, extra ...kgo.Opt) (*Sink, error) {
	brokers, err := ParseURL(url)
	if err != nil {
		return nil, err
	}
	var log *slog.Logger
	if cfg != nil {
		log = cfg.Logger
	}
	log = confval.Logger(log)
	// The client stays quiet until the broker answered: a failed Dial is
	// reported once, by its error.
	kl := &kgoLogger{l: log}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(brokers...),
		kgo.WithLogger(kl),
	}, Options()...)
	opts = append(opts, extra...)
	client, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafkasink: %s: %w", url, err)
	}
	s, err := New(client, cfg)
	if err != nil {
		client.Close()
		return nil, err
	}
	if err := client.Ping(ctx); err != nil {
		client.Close()
		return nil, fmt.Errorf("kafkasink: cannot reach %s: %w (check the broker address)", url, err)
	}
	kl.on.Store(true)
	s.owned = true
	return s, nil
}

// ParseURL returns the host:port seed brokers of a kafka://host:port[,host:port]
// URL. Credentials, paths and query parameters are not accepted: configure
// TLS and SASL with kgo options.
func ParseURL(url string) ([]string, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("kafkasink: invalid URL %q: %s (want kafka://host:port[,host:port])", url, fmt.Sprintf(format, args...))
	}
	scheme, rest, ok := strings.Cut(url, "://")
	if !ok {
		return nil, bad("no scheme")
	}
	if !strings.EqualFold(scheme, "kafka") {
		return nil, bad("scheme %q is not kafka", scheme)
	}
	rest = strings.TrimSuffix(rest, "/")
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		return nil, bad("unexpected %q after the broker list", rest[i:])
	}
	if strings.Contains(rest, "@") {
		return nil, bad("credentials in the URL are not supported; configure SASL with kgo options")
	}
	if rest == "" {
		return nil, bad("no broker")
	}
	var brokers []string
	for hp := range strings.SplitSeq(rest, ",") {
		if hp == "" {
			return nil, bad("empty broker address")
		}
		host, port, err := net.SplitHostPort(hp)
		if err != nil {
			return nil, bad("broker %q is not host:port", hp)
		}
		if host == "" {
			return nil, bad("broker %q has no host", hp)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, bad("broker %q has an invalid port %q", hp, port)
		}
		brokers = append(brokers, hp)
	}
	return brokers, nil
}

// Publish produces one record per message and waits until Kafka has
// acknowledged each one (acks=all) or ctx ends. It returns one error per
// message, in order; see the package documentation for which are permanent.
// Messages with the same Destination and Key are produced in slice order.
//
// Kafka rejects some records together with their whole batch (a batch over
// the topic's max.message.bytes, an invalid record). Publish then produces
// each record of the rejected batch again on its own, so that only the
// culprit fails (permanently); the others succeed, though after later
// records of their key that were in other batches.
func (s *Sink) Publish(ctx context.Context, msgs []sink.Message) []error {
	errs := make([]error, len(msgs))
	if len(msgs) == 0 {
		return errs
	}
	if s.closed.Load() {
		for i := range msgs {
			errs[i] = produceErr(msgs[i].Destination, ErrClosed)
		}
		return errs
	}
	if err := ctx.Err(); err != nil {
		for i := range msgs {
			errs[i] = produceErr(msgs[i].Destination, err)
		}
		return errs
	}

	todo := make([]int, 0, len(msgs))
	for i := range msgs {
		if err := ValidateTopic(msgs[i].Destination); err != nil {
			errs[i] = sink.Permanent(produceErr(msgs[i].Destination, err))
			continue
		}
		todo = append(todo, i)
	}

	// Kafka rejects some errors for a whole batch (a partition's records
	// in one request): a batch over max.message.bytes, or with one invalid
	// record. The records that shared the batch with the culprit fail with
	// it, so before calling such an error permanent we produce each of
	// those records again on its own.
	var isolate []int
	for j, err := range s.produce(ctx, msgs, todo) {
		i := todo[j]
		if batchScoped(err) && ctx.Err() == nil {
			isolate = append(isolate, i)
			continue
		}
		errs[i] = classify(msgs[i].Destination, err)
	}
	if len(isolate) == 0 {
		return errs
	}
	s.log.Debug("kafkasink: records rejected with their batch; producing them one at a time", "records", len(isolate))
	var innocent int
	for _, i := range isolate {
		err := s.produce(ctx, msgs, []int{i})[0]
		if err == nil {
			innocent++
		}
		errs[i] = classify(msgs[i].Destination, err)
	}
	if innocent > 0 {
		s.log.Warn("kafkasink: the broker rejected whole batches because of some of their records; the other records were produced again one at a time. If a topic's max.message.bytes is below the client's batch size, set kgo.ProducerBatchMaxBytes to it",
			"records", len(isolate), "accepted_alone", innocent)
	}
	return errs
}

// produce produces msgs[i] for each i in idx, in that order, and waits for
// their results or ctx's end. It returns the raw results aligned with idx.
func (s *Sink) produce(ctx context.Context, msgs []sink.Message, idx []int) []error {
	w := &waiter{
		errs:     make([]error, len(idx)),
		finished: make([]bool, len(idx)),
		pending:  len(idx),
		done:     make(chan struct{}),
	}
	if len(idx) == 0 {
		return w.errs
	}
	for j, i := range idx {
		if ctx.Err() != nil {
			break // the rest are failed with ctx's error below
		}
		// Produce blocks only while the client's buffer is full, and
		// gives up (calling the promise) when ctx ends.
		s.client.Produce(ctx, record(&msgs[i]), func(_ *kgo.Record, err error) {
			w.finish(j, err)
		})
	}
	select {
	case <-w.done:
	case <-ctx.Done():
	}
	return w.collect(ctx)
}

// waiter gathers the promises of one produce call. Once collected it ignores
// late promises: records still in flight when ctx ended finish in the
// background.
type waiter struct {
	mu        sync.Mutex
	errs      []error
	finished  []bool
	pending   int
	done      chan struct{}
	collected bool
}

func (w *waiter) finish(j int, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.collected || w.finished[j] {
		return
	}
	w.errs[j], w.finished[j] = err, true
	if w.pending--; w.pending == 0 {
		close(w.done)
	}
}

func (w *waiter) collect(ctx context.Context) []error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.collected = true
	for j, ok := range w.finished {
		if !ok {
			w.errs[j] = ctx.Err()
			if w.errs[j] == nil { // unreachable: we only stop waiting early when ctx ends
				w.errs[j] = context.Canceled
			}
		}
	}
	return w.errs
}

// record converts m into a Kafka record.
func record(m *sink.Message) *kgo.Record {
	hs := make([]kgo.RecordHeader, 0, len(m.Headers)+1)
	if _, ok := m.Header("id"); !ok {
		hs = append(hs, kgo.RecordHeader{Key: "id", Value: []byte(m.ID)})
	}
	for _, h := range m.Headers {
		hs = append(hs, kgo.RecordHeader{Key: h.Key, Value: []byte(h.Value)})
	}
	return &kgo.Record{Topic: m.Destination, Key: m.Key, Value: m.Value, Headers: hs}
}

// batchScoped reports whether err is a permanent error that Kafka returns
// for a whole batch, so that it may belong to another record of the batch.
func batchScoped(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) ||
		errors.Is(err, kerr.RecordListTooLarge) ||
		errors.Is(err, kerr.InvalidRecord)
}

// classify wraps a produce result for topic, marking it permanent when Kafka
// will never accept the record.
func classify(topic string, err error) error {
	if err == nil {
		return nil
	}
	err = produceErr(topic, err)
	switch {
	case batchScoped(err),
		errors.Is(err, kerr.InvalidTopicException),
		errors.Is(err, kerr.TopicAuthorizationFailed):
		return sink.Permanent(err)
	case errors.Is(err, kgo.ErrRecordTimeout), errors.Is(err, kgo.ErrClientClosed):
		// No broker answered in time: nothing is wrong with the record.
		return sink.Unavailable(err)
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return sink.Unavailable(err)
	}
	return err
}

func produceErr(topic string, err error) error {
	return fmt.Errorf("kafkasink: produce to topic %q: %w", topic, err)
}

// ValidateTopic reports whether name is a legal Kafka topic name: 1 to 249
// characters of ASCII letters, digits, '.', '_' and '-', and neither "." nor
// "..".
func ValidateTopic(name string) error {
	switch {
	case name == "":
		return errors.New("invalid topic name: empty")
	case name == "." || name == "..":
		return fmt.Errorf("invalid topic name %q", name)
	case len(name) > 249:
		return fmt.Errorf("invalid topic name: %d characters, at most 249 allowed", len(name))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("invalid topic name %q: character %q not allowed (only [a-zA-Z0-9._-])", name, rune(c))
		}
	}
	return nil
}

// Close stops the sink: later Publish calls fail with ErrClosed. It closes
// the client if Dial created it; a client passed to New is left open.
// Close is idempotent and always returns nil.
func (s *Sink) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		if s.owned {
			s.client.Close()
		}
	})
	return nil
}

// kgoLogger passes the client's warnings and errors to a slog.Logger once
// on is set.
type kgoLogger struct {
	l  *slog.Logger
	on atomic.Bool
}

func (*kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (k *kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	if !k.on.Load() {
		return
	}
	l := slog.LevelInfo
	switch level {
	case kgo.LogLevelError:
		l = slog.LevelError
	case kgo.LogLevelWarn:
		l = slog.LevelWarn
	case kgo.LogLevelDebug:
		l = slog.LevelDebug
	}
	k.l.Log(context.Background(), l, "kafka client: "+msg, keyvals...)
}

// System names the broker as OpenTelemetry's messaging.system attribute
// does: "kafka".
func (s *Sink) System() string { return "kafka" }
