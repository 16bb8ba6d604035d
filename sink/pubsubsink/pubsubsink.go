package pubsubsink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/outboxkit/outbox/internal/confval"
	"github.com/outboxkit/outbox/sink"
)

// Attribute names the sink sets besides the message's headers.
const (
	// IDAttr carries Message.ID.
	IDAttr = "id"
	// RepeatedAttr lists, as a JSON array, the header names that occur more
	// than once; their attributes hold JSON arrays of the values.
	RepeatedAttr = "outbox-repeated"
	// DestinationAttr carries Message.Destination when Config.Topic is set.
	DestinationAttr = "destination"
)

// Limits of the Pub/Sub service, checked before a message is sent.
const (
	maxAttrs       = 100
	maxAttrKey     = 256
	maxAttrValue   = 1024
	maxOrderingKey = 1024
)

// DefaultTimeout is the default for Config.Timeout.
const DefaultTimeout = 10 * time.Second

// ErrClosed is returned for every message published after Close.
var ErrClosed = errors.New("pubsubsink: sink is closed")

// Config configures a Sink. The zero value (or a nil *Config) is usable.
type Config struct {
	// Topic, when set, is the one topic (an id, not a full name) every
	// message goes to; Message.Destination then travels in the attribute
	// "destination". Default: the topic is Message.Destination.
	Topic string
	// CreateTopics creates a missing topic on its first use. Default: a
	// missing topic fails the message transiently.
	CreateTopics bool
	// Timeout bounds the client's attempts to publish one bundle of
	// messages, retries included. Default 10s.
	Timeout time.Duration
	// Logger receives topic creation messages. Default: warnings and errors
	// as text on standard error.
	Logger *slog.Logger
}

func normalize(cfg *Config) (Config, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Topic != "" {
		if err := checkTopic(c.Topic); err != nil {
			return c, fmt.Errorf("pubsubsink: invalid Config.Topic: %v", err)
		}
	}
	if err := confval.PositiveOr("pubsubsink", "Timeout", &c.Timeout, DefaultTimeout); err != nil {
		return c, err
	}
	c.Logger = confval.Logger(c.Logger)
	return c, nil
}

// checkTopic applies Pub/Sub's rules for topic ids.
func checkTopic(id string) error {
	if len(id) < 3 || len(id) > 255 {
		return fmt.Errorf("topic %q: a topic id has 3 to 255 characters", id)
	}
	if c := id[0]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
		return fmt.Errorf("topic %q: a topic id starts with a letter", id)
	}
	if strings.HasPrefix(strings.ToLower(id), "goog") {
		return fmt.Errorf("topic %q: a topic id cannot start with \"goog\"", id)
	}
	for _, c := range id {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.ContainsRune("-_.~+%", c)) {
			return fmt.Errorf("topic %q: a topic id holds only letters, digits and - _ . ~ + %%", id)
		}
	}
	return nil
}

// Sink publishes messages to Pub/Sub. It is safe for concurrent use; order
// is kept within one Publish call, not across concurrent calls.
type Sink struct {
	client  *pubsub.Client
	project string
	owned   bool
	cfg     Config
	log     *slog.Logger

	mu      sync.RWMutex // write-held by Close
	closed  bool
	pubMu   sync.Mutex
	pubs    map[string]*pubsub.Publisher
	created map[string]bool
}

var (
	_ sink.Sink     = (*Sink)(nil)
	_ sink.Systemer = (*Sink)(nil)
)

// New returns a Sink that publishes through client to topics of project
// (the client's project). It does no I/O. Close stops the sink's
// publishers but leaves client open.
func New(client *pubsub.Client, project string, cfg *Config) (*Sink, error) {
	if client == nil {
		return nil, errors.New("pubsubsink: New: nil *pubsub.Client")
	}
	if project == "" {
		return nil, errors.New("pubsubsink: New: empty project id")
	}
	c, err := normalize(cfg)
	if err != nil {
		return nil, err
	}
	return &Sink{client: client, project: project, cfg: c, log: c.Logger,
		pubs: map[string]*pubsub.Publisher{}, created: map[string]bool{}}, nil
}

// ParseURL splits pubsub://PROJECT[/TOPIC] into its project and topic.
func ParseURL(rawURL string) (project, topic string, err error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", "", errors.New("pubsubsink: invalid sink URL: want pubsub://PROJECT or pubsub://PROJECT/TOPIC")
	}
	if u.Scheme != "pubsub" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", "", fmt.Errorf("pubsubsink: invalid sink URL %q: want pubsub://PROJECT or pubsub://PROJECT/TOPIC (credentials come from the environment, not the URL)", u.Redacted())
	}
	topic = strings.TrimPrefix(u.Path, "/")
	if topic != "" {
		if err := checkTopic(topic); err != nil {
			return "", "", fmt.Errorf("pubsubsink: invalid sink URL %q: %v", u.Redacted(), err)
		}
	}
	return u.Host, topic, nil
}

// Dial opens a Pub/Sub client for pubsub://PROJECT[/TOPIC] and returns a
// Sink that owns it. The client finds credentials the usual way
// (Application Default Credentials), or talks to the emulator named by
// PUBSUB_EMULATOR_HOST. A topic in the URL becomes Config.Topic (it must
// not contradict one set there).
func Dial(ctx context.Context, rawURL string, cfg *Config) (*Sink, error) {
	project, topic, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if topic != "" {
		if c.Topic != "" && c.Topic != topic {
			return nil, fmt.Errorf("pubsubsink: the URL names topic %q and Config.Topic %q", topic, c.Topic)
		}
		c.Topic = topic
	}
	if _, err := normalize(&c); err != nil {
		return nil, err
	}
	client, err := pubsub.NewClient(ctx, project)
	if err != nil {
		return nil, fmt.Errorf("pubsubsink: cannot open a client for project %q: %w", project, err)
	}
	s, err := New(client, project, &c)
	if err != nil {
		client.Close()
		return nil, err
	}
	s.owned = true
	return s, nil
}

// System names the broker for tracing (messaging.system).
func (s *Sink) System() string { return "gcp_pubsub" }

// topicName is the full resource name of topic id.
func (s *Sink) topicName(id string) string {
	return "projects/" + s.project + "/topics/" + id
}

// publisher returns the ordered publisher of topic id, creating the topic
// first when Config.CreateTopics allows it.
func (s *Sink) publisher(ctx context.Context, id string) (*pubsub.Publisher, error) {
	s.pubMu.Lock()
	defer s.pubMu.Unlock()
	if s.cfg.CreateTopics && !s.created[id] {
		cctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
		_, err := s.client.TopicAdminClient.CreateTopic(cctx, &pubsubpb.Topic{Name: s.topicName(id)})
		cancel()
		switch status.Code(err) {
		case codes.OK:
			s.log.Info("pubsubsink: created topic", "topic", id)
		case codes.AlreadyExists:
		default:
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, classify(fmt.Errorf("pubsubsink: create topic %q: %w", id, err), id)
		}
		s.created[id] = true
	}
	p := s.pubs[id]
	if p == nil {
		p = s.client.Publisher(s.topicName(id))
		p.EnableMessageOrdering = true
		p.PublishSettings.Timeout = s.cfg.Timeout
		s.pubs[id] = p
	}
	return p, nil
}

// message builds the Pub/Sub message for m, or a permanent error saying
// why Pub/Sub would refuse it.
func (s *Sink) message(m *sink.Message, topic string) (*pubsub.Message, error) {
	if !utf8.Valid(m.Key) {
		return nil, sink.Permanent(fmt.Errorf("pubsubsink: message %s: key is not UTF-8, and Pub/Sub ordering keys are text", m.ID))
	}
	if len(m.Key) > maxOrderingKey {
		return nil, sink.Permanent(fmt.Errorf("pubsubsink: message %s: key of %d bytes, over Pub/Sub's %d-byte ordering key limit", m.ID, len(m.Key), maxOrderingKey))
	}
	headers := make([]sink.Header, 0, len(m.Headers)+2)
	headers = append(headers, sink.Header{Key: IDAttr, Value: m.ID})
	for _, h := range m.Headers {
		if h.Key != IDAttr {
			headers = append(headers, h)
		}
	}
	if s.cfg.Topic != "" {
		if _, ok := m.Header(DestinationAttr); !ok {
			headers = append(headers, sink.Header{Key: DestinationAttr, Value: m.Destination})
		}
	}
	attrs, err := attributes(headers)
	if err != nil {
		return nil, sink.Permanent(fmt.Errorf("pubsubsink: message %s: %v", m.ID, err))
	}
	msg := &pubsub.Message{Data: m.Value, Attributes: attrs, OrderingKey: string(m.Key)}
	size := proto.Size(&pubsubpb.PubsubMessage{Data: msg.Data, Attributes: msg.Attributes, OrderingKey: msg.OrderingKey})
	// The client refuses a message that does not fit one publish request
	// with its topic name.
	if limit := int(pubsub.MaxPublishRequestBytes) - len(s.topicName(topic)) - 16; size > limit {
		return nil, sink.Permanent(fmt.Errorf("pubsubsink: message %s: %d bytes, over Pub/Sub's limit of %d for one message", m.ID, size, limit))
	}
	return msg, nil
}

// attributes encodes headers as Pub/Sub attributes (see the package doc).
func attributes(headers []sink.Header) (map[string]string, error) {
	values := map[string][]string{}
	var names []string
	for _, h := range headers {
		if _, ok := values[h.Key]; !ok {
			names = append(names, h.Key)
		}
		values[h.Key] = append(values[h.Key], h.Value)
	}
	attrs := make(map[string]string, len(names)+1)
	var repeated []string
	for _, n := range names {
		if n == "" || len(n) > maxAttrKey || strings.HasPrefix(n, "goog") || !utf8.ValidString(n) {
			return nil, fmt.Errorf("header name %.40q: Pub/Sub attribute names have 1 to %d bytes of UTF-8 and do not start with \"goog\"", n, maxAttrKey)
		}
		if n == RepeatedAttr {
			return nil, fmt.Errorf("header name %q is reserved by the sink", n)
		}
		vs := values[n]
		v := vs[0]
		if len(vs) > 1 {
			b, _ := json.Marshal(vs)
			v = string(b)
			repeated = append(repeated, n)
		}
		if len(v) > maxAttrValue || !utf8.ValidString(v) {
			return nil, fmt.Errorf("header %q: value of %d bytes; Pub/Sub attribute values have at most %d bytes of UTF-8", n, len(v), maxAttrValue)
		}
		attrs[n] = v
	}
	if len(repeated) > 0 {
		b, _ := json.Marshal(repeated)
		attrs[RepeatedAttr] = string(b)
	}
	if len(attrs) > maxAttrs {
		return nil, fmt.Errorf("%d attributes, over Pub/Sub's limit of %d", len(attrs), maxAttrs)
	}
	return attrs, nil
}

// Publish publishes msgs and waits for each one's result. See the package
// doc for ordering keys and errors.
func (s *Sink) Publish(ctx context.Context, msgs []sink.Message) []error {
	errs := make([]error, len(msgs))
	if len(msgs) == 0 {
		return errs
	}
	if err := ctx.Err(); err != nil {
		return sink.Results(len(msgs), err)
	}
	results := make([]*pubsub.PublishResult, len(msgs))
	if !s.enqueue(ctx, msgs, results, errs) {
		return sink.Results(len(msgs), ErrClosed)
	}
	for i, r := range results {
		if r == nil {
			continue
		}
		select {
		case <-r.Ready():
		case <-ctx.Done():
			for j := i; j < len(msgs); j++ {
				if results[j] != nil {
					errs[j] = ctx.Err()
				}
			}
			return errs
		}
		if _, err := r.Get(ctx); err != nil {
			errs[i] = classify(fmt.Errorf("pubsubsink: publish %s to topic %q: %w", msgs[i].ID, s.topicOf(&msgs[i]), err), s.topicOf(&msgs[i]))
		}
	}
	return errs
}

func (s *Sink) topicOf(m *sink.Message) string {
	if s.cfg.Topic != "" {
		return s.cfg.Topic
	}
	return m.Destination
}

// enqueue hands msgs to the publishers, filling results (or errs for the
// messages it does not send). It reports false when the sink is closed.
func (s *Sink) enqueue(ctx context.Context, msgs []sink.Message, results []*pubsub.PublishResult, errs []error) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return false
	}
	type topicKey struct{ topic, key string }
	resumed := map[topicKey]bool{}
	// blocked holds the keys whose message failed transiently here: their
	// later messages must not overtake it.
	blocked := map[topicKey]error{}
	failedTopic := map[string]error{}
	for i := range msgs {
		m := &msgs[i]
		topic := s.topicOf(m)
		k := topicKey{topic, string(m.Key)}
		if err := blocked[k]; err != nil {
			errs[i] = fmt.Errorf("pubsubsink: message %s not sent: an earlier message with its key failed: %w", m.ID, err)
			continue
		}
		if err := checkTopic(topic); err != nil {
			errs[i] = sink.Permanent(fmt.Errorf("pubsubsink: message %s: %v", m.ID, err))
			continue
		}
		if err := failedTopic[topic]; err != nil {
			errs[i] = err
			continue
		}
		pm, err := s.message(m, topic)
		if err != nil {
			errs[i] = err
			continue
		}
		p, err := s.publisher(ctx, topic)
		if err != nil {
			// Later messages of the topic fail with this error too, rather
			// than each waiting for another attempt.
			errs[i] = err
			failedTopic[topic] = err
			if k.key != "" {
				blocked[k] = err
			}
			continue
		}
		if k.key != "" && !resumed[k] {
			// A key paused by an earlier failure starts again with this
			// call's first message of the key: the relay sends the
			// failed messages again, in order.
			p.ResumePublish(k.key)
			resumed[k] = true
		}
		results[i] = p.Publish(ctx, pm)
	}
	return true
}

// classify marks err for the relay.
func classify(err error, topic string) error {
	if errors.Is(err, pubsub.ErrPublisherStopped) {
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	var paused pubsub.ErrPublishingPaused
	if errors.As(err, &paused) {
		return fmt.Errorf("%w (not sent: an earlier message with this ordering key failed, and the retry resumes the key)", err)
	}
	if errors.Is(err, pubsub.ErrOversizedMessage) {
		return sink.Permanent(err)
	}
	switch status.Code(err) {
	case codes.InvalidArgument:
		return sink.Permanent(err)
	case codes.NotFound:
		return fmt.Errorf("%w (create topic %q, or allow the sink to create topics)", err, topic)
	case codes.Unavailable, codes.DeadlineExceeded:
		return sink.Unavailable(err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return sink.Unavailable(err)
	}
	return err
}

// Close stops the sink's publishers, after they sent what they hold, and
// closes the client if Dial opened it. It is idempotent.
func (s *Sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.pubMu.Lock()
	pubs := s.pubs
	s.pubs = nil
	s.pubMu.Unlock()
	var wg sync.WaitGroup
	for _, p := range pubs {
		wg.Go(p.Stop)
	}
	wg.Wait()
	if s.owned {
		if err := s.client.Close(); err != nil {
			return fmt.Errorf("pubsubsink: close client: %w", err)
		}
	}
	return nil
}
