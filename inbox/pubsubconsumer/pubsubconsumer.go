package pubsubconsumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/inbox/internal/runloop"
	"github.com/outboxkit/outbox/internal/confval"
)

// Defaults applied to zero Config fields.
const (
	// DefaultMaxExtension is how long the client extends a message's ack
	// deadline at most, by default.
	DefaultMaxExtension = 60 * time.Minute
	// DefaultShutdownGrace is how long Run lets handlers in flight finish.
	DefaultShutdownGrace = 30 * time.Second
)

// Attributes pubsubsink sets.
const (
	// IDAttr carries the event id.
	IDAttr = "id"
	// DestinationAttr carries the destination when the sink publishes to
	// one fixed topic.
	DestinationAttr = "destination"
	// RepeatedAttr lists, as a JSON array, the attributes that hold a JSON
	// array of a repeated header's values.
	RepeatedAttr = "outbox-repeated"
)

// Config configures a Consumer. Subscription is required.
type Config struct {
	// Config holds the concurrency, retry and dead-letter settings. Its
	// Logger defaults to warnings and errors as text on standard error.
	consumer.Config
	// Subscription is the subscription's id in the client's project, or
	// its full name projects/P/subscriptions/S. Required.
	Subscription string
	// MaxExtension is how long the client keeps extending the ack deadline
	// of a message that is not finished. Default 60 minutes.
	MaxExtension time.Duration
	// AckExtension is the longest single extension of a message's ack
	// deadline (the client's MaxDurationPerAckExtension): the messages of
	// a consumer that died come back after at most this long. Default: the
	// client's own estimate, from the time it takes to acknowledge (at
	// least 60s at first).
	AckExtension time.Duration
	// ShutdownGrace is how long Run lets handlers in flight finish after
	// its context ended. Default 30s.
	ShutdownGrace time.Duration
}

// Consumer receives a subscription's messages and handles them through an
// inbox.
type Consumer[TTx any] struct {
	client *pubsub.Client
	cfg    Config
	name   string // projects/P/subscriptions/S
	log    *slog.Logger
	eng    *consumer.Engine[TTx]

	run   *runloop.Loop
	mu    sync.Mutex
	topic string // the subscription's topic id
}

// New returns a Consumer of cfg.Subscription through client that handles
// messages with h through ib. It does no I/O; Start checks the
// subscription. Stop does not close client.
func New[TTx any](client *pubsub.Client, ib *inbox.Inbox[TTx], h consumer.Handler[TTx], cfg *Config) (*Consumer[TTx], error) {
	if client == nil {
		return nil, errors.New("pubsubconsumer: client is nil")
	}
	if ib == nil {
		return nil, errors.New("pubsubconsumer: inbox is nil")
	}
	if h == nil {
		return nil, errors.New("pubsubconsumer: handler is nil")
	}
	if cfg == nil || strings.TrimSpace(cfg.Subscription) == "" {
		return nil, errors.New("pubsubconsumer: Config.Subscription is empty: name the subscription")
	}
	c := *cfg
	name := c.Subscription
	if !strings.HasPrefix(name, "projects/") {
		name = "projects/" + client.Project() + "/subscriptions/" + name
	}
	if parts := strings.Split(name, "/"); len(parts) != 4 || parts[2] != "subscriptions" || parts[1] == "" || parts[3] == "" {
		return nil, fmt.Errorf("pubsubconsumer: invalid Config.Subscription %q: want an id or projects/P/subscriptions/S", c.Subscription)
	}
	if c.AckExtension < 0 {
		return nil, fmt.Errorf("pubsubconsumer: invalid Config.AckExtension %v: must be positive (or 0 for the client's estimate)", c.AckExtension)
	}
	for _, err := range []error{
		confval.PositiveOr("pubsubconsumer", "MaxExtension", &c.MaxExtension, DefaultMaxExtension),
		confval.PositiveOr("pubsubconsumer", "ShutdownGrace", &c.ShutdownGrace, DefaultShutdownGrace),
	} {
		if err != nil {
			return nil, err
		}
	}
	c.Logger = confval.Logger(c.Logger)
	c.KeepAlive = 0 // the client extends ack deadlines itself
	eng, err := consumer.New(ib, h, &c.Config)
	if err != nil {
		return nil, fmt.Errorf("pubsubconsumer: %w", err)
	}
	return &Consumer[TTx]{client: client, cfg: c, name: name, log: c.Logger.With("subscription", name), eng: eng,
		run: runloop.New("pubsubconsumer")}, nil
}

// Start checks that the subscription exists (and warns when it does not
// order messages), then receives and handles messages in the background,
// and returns. It fails if the Consumer was already started.
func (c *Consumer[TTx]) Start(ctx context.Context) error {
	return c.run.Start(ctx, func(ctx context.Context) (runloop.Engine, func(context.Context) error, error) {
		sub, err := c.client.SubscriptionAdminClient.GetSubscription(ctx, &pubsubpb.GetSubscriptionRequest{Subscription: c.name})
		if err != nil {
			return nil, nil, fmt.Errorf("pubsubconsumer: subscription %s: %w", c.name, err)
		}
		if !sub.GetEnableMessageOrdering() {
			c.log.Warn("pubsubconsumer: the subscription does not enable message ordering: one aggregate's messages may arrive out of order")
		}
		c.mu.Lock()
		c.topic = sub.GetTopic()[strings.LastIndexByte(sub.GetTopic(), '/')+1:]
		c.mu.Unlock()
		if err := c.eng.Start(ctx); err != nil {
			return nil, nil, fmt.Errorf("pubsubconsumer: %w", err)
		}
		s := c.client.Subscriber(c.name)
		s.ReceiveSettings.MaxOutstandingMessages = c.eng.Config().MaxPending
		s.ReceiveSettings.MaxExtension = c.cfg.MaxExtension
		if c.cfg.AckExtension > 0 {
			s.ReceiveSettings.MaxDurationPerAckExtension = c.cfg.AckExtension
		}
		return c.eng, func(loopCtx context.Context) error {
			err := s.Receive(loopCtx, func(_ context.Context, m *pubsub.Message) { c.receive(loopCtx, m) })
			if err != nil && loopCtx.Err() == nil {
				c.log.Error("pubsubconsumer: receiving stopped", "err", err)
				return fmt.Errorf("pubsubconsumer: receive: %w", err)
			}
			return nil
		}, nil
	})
}

// receive submits m and returns once it is acknowledged or handed back, so
// that the client hands over its ordering key's next message only then.
func (c *Consumer[TTx]) receive(ctx context.Context, m *pubsub.Message) {
	d := c.delivery(m)
	if err := c.eng.Submit(ctx, d); err != nil {
		m.Nack()
		return
	}
	<-d.done
}

// Stop stops receiving, hands back the messages not started, lets the
// handlers in flight finish and acknowledge, and returns when every
// goroutine has exited. If ctx ends first, the handlers in flight are
// cancelled (their transactions roll back, their messages are nacked).
// Stop is idempotent and safe when Start never ran.
func (c *Consumer[TTx]) Stop(ctx context.Context) error { return c.run.Stop(ctx) }

// Run starts the Consumer and stops it gracefully when ctx ends, letting
// handlers in flight finish for at most Config.ShutdownGrace. It returns
// nil after a graceful stop, or the error that stopped receiving.
func (c *Consumer[TTx]) Run(ctx context.Context) error {
	return c.run.Run(ctx, c.Start, c.cfg.ShutdownGrace)
}

// Err returns the error that stopped receiving by itself (the subscription
// was deleted, permission was denied), or nil.
func (c *Consumer[TTx]) Err() error { return c.run.Err() }

// delivery adapts a Pub/Sub message to consumer.Delivery.
type delivery struct {
	m        *pubsub.Message
	msg      inbox.Message
	key      string
	attempts int
	once     sync.Once
	done     chan struct{}
}

func (c *Consumer[TTx]) delivery(m *pubsub.Message) *delivery {
	hdr := make(map[string]string, len(m.Attributes))
	var repeated []string
	if r, ok := m.Attributes[RepeatedAttr]; ok {
		_ = json.Unmarshal([]byte(r), &repeated)
	}
	for k, v := range m.Attributes {
		if k == RepeatedAttr {
			continue
		}
		hdr[k] = v
	}
	for _, k := range repeated {
		var vs []string
		if json.Unmarshal([]byte(m.Attributes[k]), &vs) == nil && len(vs) > 0 {
			hdr[k] = vs[0]
		}
	}
	dest := m.Attributes[DestinationAttr]
	if dest == "" {
		c.mu.Lock()
		dest = c.topic
		c.mu.Unlock()
	}
	msg := inbox.NewMessage(dest, []byte(m.OrderingKey), hdr, m.Data)
	msg.System = "gcp_pubsub"
	d := &delivery{m: m, msg: msg, key: dest + "\x00" + msg.AggregateID, done: make(chan struct{})}
	if m.DeliveryAttempt != nil && *m.DeliveryAttempt > 1 {
		d.attempts = *m.DeliveryAttempt - 1
	}
	return d
}

func (d *delivery) Message() inbox.Message { return d.msg }

func (d *delivery) Key() string { return d.key }

func (d *delivery) Attempts() int { return d.attempts }

// Ack acknowledges the message and waits for the result, which only a
// subscription with exactly-once delivery can refuse.
func (d *delivery) Ack(ctx context.Context) error {
	defer d.once.Do(func() { close(d.done) })
	_, err := d.m.AckWithResult().Get(ctx)
	return err
}

// Release nacks the message: Pub/Sub redelivers it at once (it has no
// delay).
func (d *delivery) Release(time.Duration) error {
	d.m.Nack()
	d.once.Do(func() { close(d.done) })
	return nil
}

func (d *delivery) KeepAlive() error { return nil }

func (d *delivery) Abandoned() <-chan struct{} { return nil }
