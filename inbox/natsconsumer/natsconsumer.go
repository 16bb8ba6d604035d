package natsconsumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/inbox/internal/runloop"
	"github.com/outboxkit/outbox/internal/confval"
)

// Defaults applied to zero Config fields.
const (
	// DefaultBuffer is how many messages the client pulls ahead by default.
	DefaultBuffer = 100
	// DefaultFetchWait is how long one pull request waits by default.
	DefaultFetchWait = time.Second
	// DefaultShutdownGrace is how long Run lets handlers in flight finish.
	DefaultShutdownGrace = 30 * time.Second
	// DefaultAckWait is the AckWait of ConsumerConfig, and the one assumed
	// when the consumer's is zero.
	DefaultAckWait = 30 * time.Second
)

// Config configures a Consumer. The zero value (or a nil *Config) is
// usable: every zero field takes its documented default.
type Config struct {
	// Config holds the concurrency, retry and dead-letter settings. Its
	// Logger defaults to warnings and errors as text on standard error.
	consumer.Config
	// Buffer is the most messages one pull request asks for. Default 100.
	Buffer int
	// FetchWait is how long one pull request waits for messages; Stop
	// waits for the one in flight to end. Default 1s.
	FetchWait time.Duration
	// ShutdownGrace is how long Run lets handlers in flight finish after
	// its context ended. Default 30s.
	ShutdownGrace time.Duration
}

// ConsumerConfig returns the configuration of a durable pull consumer
// suited to the inbox: explicit acknowledgements, delivery from the start of
// the stream, no limit on deliveries (the inbox dead-letters instead of the
// server dropping a message) and an AckWait of 30s. Create it with
// js.CreateOrUpdateConsumer(ctx, stream, cfg); filterSubjects may be empty.
func ConsumerConfig(durable string, filterSubjects ...string) jetstream.ConsumerConfig {
	cc := jetstream.ConsumerConfig{
		Durable:       durable,
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait:       DefaultAckWait,
		MaxDeliver:    -1,
		MaxAckPending: 1000,
	}
	switch len(filterSubjects) {
	case 0:
	case 1:
		cc.FilterSubject = filterSubjects[0]
	default:
		cc.FilterSubjects = filterSubjects
	}
	return cc
}

// Consumer pulls messages from a JetStream consumer and handles them through
// an inbox.
type Consumer[TTx any] struct {
	cons jetstream.Consumer
	ib   *inbox.Inbox[TTx]
	h    consumer.Handler[TTx]
	cfg  Config
	log  *slog.Logger

	run *runloop.Loop
	eng *consumer.Engine[TTx] // set by Start, under run's lock
}

// New returns a Consumer that handles the messages of cons with h through
// ib. It does no I/O; Start checks the consumer's configuration.
func New[TTx any](cons jetstream.Consumer, ib *inbox.Inbox[TTx], h consumer.Handler[TTx], cfg *Config) (*Consumer[TTx], error) {
	if cons == nil {
		return nil, errors.New("natsconsumer: jetstream.Consumer is nil")
	}
	if ib == nil {
		return nil, errors.New("natsconsumer: inbox is nil")
	}
	if h == nil {
		return nil, errors.New("natsconsumer: handler is nil")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if err := confval.PositiveOr("natsconsumer", "Buffer", &c.Buffer, DefaultBuffer); err != nil {
		return nil, err
	}
	if err := confval.PositiveOr("natsconsumer", "FetchWait", &c.FetchWait, DefaultFetchWait); err != nil {
		return nil, err
	}
	if err := confval.PositiveOr("natsconsumer", "ShutdownGrace", &c.ShutdownGrace, DefaultShutdownGrace); err != nil {
		return nil, err
	}
	c.Logger = confval.Logger(c.Logger)
	// Validate the shared settings now rather than at Start.
	if _, err := consumer.New(ib, h, &c.Config); err != nil {
		return nil, fmt.Errorf("natsconsumer: %w", err)
	}
	return &Consumer[TTx]{cons: cons, ib: ib, h: h, cfg: c, log: c.Logger, run: runloop.New("natsconsumer")}, nil
}

// Start checks that the JetStream consumer acknowledges explicitly and
// cannot drop a message before the inbox dead-letters it, then starts
// pulling and handling messages in the background and returns. It fails if
// the Consumer was already started.
func (c *Consumer[TTx]) Start(ctx context.Context) error {
	return c.run.Start(ctx, func(ctx context.Context) (runloop.Engine, func(context.Context) error, error) {
		info, err := c.cons.Info(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("natsconsumer: consumer info: %w", err)
		}
		cc := info.Config
		name := info.Stream + "/" + info.Name
		if cc.AckPolicy != jetstream.AckExplicitPolicy {
			return nil, nil, fmt.Errorf("natsconsumer: consumer %s acknowledges with %s; the inbox needs explicit acknowledgements (AckExplicitPolicy, see ConsumerConfig)", name, cc.AckPolicy)
		}
		ecfg := c.cfg.Config
		maxAttempts := ecfg.MaxAttempts
		if maxAttempts == 0 {
			maxAttempts = consumer.DefaultMaxAttempts
		}
		if cc.MaxDeliver > 0 && cc.MaxDeliver <= maxAttempts {
			return nil, nil, fmt.Errorf("natsconsumer: consumer %s has MaxDeliver %d: the server would drop a message before the inbox dead-letters it after %d attempts; use MaxDeliver -1 (see ConsumerConfig)", name, cc.MaxDeliver, maxAttempts)
		}
		ackWait := cc.AckWait
		if ackWait <= 0 {
			ackWait = DefaultAckWait
		}
		if ecfg.KeepAlive == 0 || ecfg.KeepAlive > ackWait/3 {
			ecfg.KeepAlive = ackWait / 3
		}
		eng, err := consumer.New(c.ib, c.h, &ecfg)
		if err != nil {
			return nil, nil, fmt.Errorf("natsconsumer: %w", err)
		}
		if err := eng.Start(ctx); err != nil {
			return nil, nil, fmt.Errorf("natsconsumer: %w", err)
		}
		c.eng = eng
		return eng, c.loop, nil
	})
}

// loop pulls batches of messages and submits them until stopped. Each pull
// request ends by itself after FetchWait; at stop, the loop hands back what
// the last one still delivers. Ending the request on the server's side
// (rather than unsubscribing from it) matters: a message handed back while
// a request of this instance is still open would be delivered to it again.
func (c *Consumer[TTx]) loop(ctx context.Context) error {
	failures := 0
	for ctx.Err() == nil {
		batch, err := c.cons.Fetch(c.cfg.Buffer, jetstream.FetchMaxWait(c.cfg.FetchWait))
		if err == nil {
			for m := range batch.Messages() {
				d := newDelivery(m)
				if ctx.Err() != nil {
					_ = d.Release(0) // stopping: back to the stream at once
					continue
				}
				if err := c.eng.Submit(ctx, d); err != nil {
					_ = d.Release(0)
				}
			}
			if err = batch.Error(); err == nil || errors.Is(err, nats.ErrTimeout) {
				failures = 0
				continue
			}
		}
		if errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, jetstream.ErrConnectionClosed) {
			c.log.Error("natsconsumer: the NATS connection is closed; no more messages are pulled", "err", err)
			return fmt.Errorf("natsconsumer: %w", err)
		}
		failures++
		d := min(100*time.Millisecond<<min(failures, 7), 10*time.Second)
		c.log.Warn("natsconsumer: pulling messages failed; trying again", "err", err, "retry_in", d)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	return nil
}

// Stop stops pulling, hands back the messages not started, lets the
// handlers in flight finish and acknowledge, and returns when every
// goroutine has exited; the pull request in flight ends within
// Config.FetchWait. If ctx ends first, the handlers in flight are cancelled
// (their transactions roll back, their messages are handed back). Stop is
// idempotent and safe when Start never ran.
func (c *Consumer[TTx]) Stop(ctx context.Context) error { return c.run.Stop(ctx) }

// Run starts the Consumer and stops it gracefully when ctx ends, letting
// handlers in flight finish for at most Config.ShutdownGrace. It returns
// nil after a graceful stop, or the error that stopped it.
func (c *Consumer[TTx]) Run(ctx context.Context) error {
	return c.run.Run(ctx, c.Start, c.cfg.ShutdownGrace)
}

// Err returns the error that stopped pulling by itself (the NATS
// connection was closed), or nil.
func (c *Consumer[TTx]) Err() error { return c.run.Err() }

// delivery adapts a JetStream message to consumer.Delivery.
type delivery struct {
	m        jetstream.Msg
	msg      inbox.Message
	attempts int
}

func newDelivery(m jetstream.Msg) *delivery {
	var hdr map[string]string
	if h := m.Headers(); len(h) > 0 {
		hdr = make(map[string]string, len(h))
		for k, vs := range h {
			if len(vs) > 0 {
				hdr[k] = vs[0]
			}
		}
	}
	d := &delivery{m: m, msg: inbox.NewMessage(m.Subject(), nil, hdr, m.Data())}
	d.msg.System = "nats"
	if md, err := m.Metadata(); err == nil && md.NumDelivered > 1 {
		d.attempts = int(md.NumDelivered - 1)
	}
	return d
}

func (d *delivery) Message() inbox.Message { return d.msg }

func (d *delivery) Key() string { return d.msg.AggregateType + "\x00" + d.msg.AggregateID }

func (d *delivery) Attempts() int { return d.attempts }

func (d *delivery) Ack(ctx context.Context) error { return d.m.DoubleAck(ctx) }

func (d *delivery) Release(delay time.Duration) error {
	if delay <= 0 {
		return d.m.Nak()
	}
	return d.m.NakWithDelay(delay)
}

func (d *delivery) KeepAlive() error { return d.m.InProgress() }

func (d *delivery) Abandoned() <-chan struct{} { return nil }
