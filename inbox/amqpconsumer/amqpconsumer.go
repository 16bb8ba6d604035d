package amqpconsumer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/internal/backoff"
	"github.com/outboxkit/outbox/internal/confval"
)

// Defaults applied to zero Config fields.
const (
	// DefaultPrefetch is the default basic.qos prefetch count.
	DefaultPrefetch = 100
	// DefaultKeyHeader is the header amqpsink carries the key in.
	DefaultKeyHeader = "key"
	// DefaultDialTimeout bounds one dial and handshake by default.
	DefaultDialTimeout = 10 * time.Second
	// DefaultReconnectMin and DefaultReconnectMax bound the pause
	// between two dials after the connection was lost.
	DefaultReconnectMin = 100 * time.Millisecond
	DefaultReconnectMax = 10 * time.Second
	// DefaultShutdownGrace is how long Run lets handlers in flight finish.
	DefaultShutdownGrace = 30 * time.Second
)

// Config configures a Consumer. URL and Queue are required.
type Config struct {
	// Config holds the concurrency, retry and dead-letter settings. Its
	// Logger defaults to warnings and errors as text on standard error.
	consumer.Config
	// URL is the broker, amqp://user:password@host:port/vhost (or
	// amqps://). Required.
	URL string
	// TLS configures amqps:// connections. Default: the system's roots.
	TLS *tls.Config
	// Queue is the queue to consume. Required.
	Queue string
	// Prefetch is the most deliveries the broker sends before their
	// acknowledgement (basic.qos), at most MaxPending. Default 100, or
	// MaxPending when smaller.
	Prefetch int
	// KeyHeader is the header holding the aggregate id, as amqpsink's
	// Config.KeyHeader. Default "key".
	KeyHeader string
	// DialTimeout bounds one dial and AMQP handshake. Default 10s.
	DialTimeout time.Duration
	// ReconnectMin and ReconnectMax bound the exponential backoff between
	// dials after the connection or the channel was lost. Defaults 100ms
	// and 10s.
	ReconnectMin, ReconnectMax time.Duration
	// ShutdownGrace is how long Run lets handlers in flight finish after
	// its context ended. Default 30s.
	ShutdownGrace time.Duration
}

// Consumer consumes a queue and handles its messages through an inbox.
type Consumer[TTx any] struct {
	cfg   Config
	shown string // URL without its password
	log   *slog.Logger
	eng   *consumer.Engine[TTx]

	sessions atomic.Int64 // channels opened, to name consumer tags

	mu      sync.Mutex
	started bool
	stop    context.CancelFunc
	engDone chan struct{} // closed once the engine stopped
	done    chan struct{} // closed when the loop has exited
}

// New returns a Consumer of cfg.Queue that handles messages with h through
// ib. It does no I/O; Start connects.
func New[TTx any](ib *inbox.Inbox[TTx], h consumer.Handler[TTx], cfg *Config) (*Consumer[TTx], error) {
	if ib == nil {
		return nil, errors.New("amqpconsumer: inbox is nil")
	}
	if h == nil {
		return nil, errors.New("amqpconsumer: handler is nil")
	}
	if cfg == nil {
		return nil, errors.New("amqpconsumer: config is nil: URL and Queue are required")
	}
	c := *cfg
	shown, err := checkURL(c.URL)
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(c.Queue) == "" {
		return nil, errors.New("amqpconsumer: Config.Queue is empty: name the queue to consume")
	}
	if c.KeyHeader == "" {
		c.KeyHeader = DefaultKeyHeader
	}
	for _, err := range []error{
		confval.PositiveOr("amqpconsumer", "DialTimeout", &c.DialTimeout, DefaultDialTimeout),
		confval.PositiveOr("amqpconsumer", "ReconnectMin", &c.ReconnectMin, DefaultReconnectMin),
		confval.PositiveOr("amqpconsumer", "ReconnectMax", &c.ReconnectMax, DefaultReconnectMax),
		confval.PositiveOr("amqpconsumer", "ShutdownGrace", &c.ShutdownGrace, DefaultShutdownGrace),
	} {
		if err != nil {
			return nil, err
		}
	}
	if c.ReconnectMax < c.ReconnectMin {
		return nil, fmt.Errorf("amqpconsumer: Config.ReconnectMax %v is shorter than Config.ReconnectMin %v", c.ReconnectMax, c.ReconnectMin)
	}
	c.Logger = confval.Logger(c.Logger)
	c.KeepAlive = 0 // RabbitMQ has no per-delivery timeout to extend
	eng, err := consumer.New(ib, h, &c.Config)
	if err != nil {
		return nil, fmt.Errorf("amqpconsumer: %w", err)
	}
	maxPending := eng.Config().MaxPending
	if c.Prefetch == 0 {
		c.Prefetch = min(DefaultPrefetch, maxPending)
	}
	if c.Prefetch < 0 || c.Prefetch > maxPending {
		return nil, fmt.Errorf("amqpconsumer: invalid Config.Prefetch %d: want 1 to MaxPending (%d)", c.Prefetch, maxPending)
	}
	return &Consumer[TTx]{cfg: c, shown: shown, log: c.Logger.With("queue", c.Queue), eng: eng}, nil
}

// checkURL validates an AMQP URL and returns it with its password redacted.
func checkURL(rawURL string) (string, error) {
	if strings.TrimSpace(rawURL) == "" {
		return "", errors.New("amqpconsumer: Config.URL is empty; want amqp://user:password@host:port/vhost")
	}
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return "", errors.New("amqpconsumer: invalid Config.URL (not shown, it may hold a password): want amqp://user:password@host:port/vhost, with reserved characters percent-encoded")
	}
	shown := u.Redacted()
	if u.Scheme != "amqp" && u.Scheme != "amqps" {
		return "", fmt.Errorf("amqpconsumer: invalid Config.URL %s: scheme %q is not supported; use amqp:// or amqps://", shown, u.Scheme)
	}
	if _, err := amqp.ParseURI(rawURL); err != nil {
		return "", fmt.Errorf("amqpconsumer: invalid Config.URL %s: %v", shown, err)
	}
	return shown, nil
}

// session is one connection and its consuming channel.
type session struct {
	conn       *amqp.Connection
	ch         *amqp.Channel
	deliveries <-chan amqp.Delivery
	gone       chan struct{} // closed when the channel is closed
	tag        string
}

// open dials, opens a channel, sets the prefetch and starts consuming.
func (c *Consumer[TTx]) open() (*session, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("outboxkit-amqpconsumer")
	conn, err := amqp.DialConfig(c.cfg.URL, amqp.Config{Properties: props, TLSClientConfig: c.cfg.TLS, Dial: amqp.DefaultDial(c.cfg.DialTimeout)})
	if err != nil {
		return nil, fmt.Errorf("amqpconsumer: cannot connect to %s: %w", c.shown, err)
	}
	fail := func(format string, err error) (*session, error) {
		_ = conn.Close()
		return nil, fmt.Errorf(format, err)
	}
	ch, err := conn.Channel()
	if err != nil {
		return fail("amqpconsumer: open a channel: %w", err)
	}
	if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return fail("amqpconsumer: set the prefetch: %w", err)
	}
	tag := fmt.Sprintf("outboxkit-%p-%d", c, c.sessions.Add(1))
	s := &session{conn: conn, ch: ch, gone: make(chan struct{}), tag: tag}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	s.deliveries, err = ch.Consume(c.cfg.Queue, tag, false, false, false, false, nil)
	if err != nil {
		if isCode(err, amqp.NotFound) {
			return fail("amqpconsumer: %w (declare the queue and its bindings first, e.g. with amqpsink's Config.Declare and Setup)", err)
		}
		return fail("amqpconsumer: consume: %w", err)
	}
	go func() {
		<-closed
		close(s.gone)
	}()
	return s, nil
}

func isCode(err error, code int) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == code
}

// Start connects, starts consuming the queue and handling its messages in
// the background, and returns. It fails when the broker cannot be reached
// or the queue does not exist; after that a lost connection is dialled
// again. It fails if the Consumer was already started.
func (c *Consumer[TTx]) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started {
		return errors.New("amqpconsumer: already started")
	}
	s, err := c.open()
	if err != nil {
		return err
	}
	if err := c.eng.Start(ctx); err != nil {
		_ = s.conn.Close()
		return fmt.Errorf("amqpconsumer: %w", err)
	}
	c.started = true
	loopCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	c.stop = stop
	c.engDone = make(chan struct{})
	c.done = make(chan struct{})
	go func() {
		defer close(c.done)
		c.loop(loopCtx, s)
	}()
	return nil
}

// loop consumes on s, and on sessions dialled again after s is lost, until
// stopped.
func (c *Consumer[TTx]) loop(ctx context.Context, s *session) {
	failures := 0
	for {
		if s != nil {
			err := c.consume(ctx, s)
			if ctx.Err() != nil {
				return
			}
			failures = 0
			c.log.Warn("amqpconsumer: the channel was lost; dialling again (unacknowledged messages are redelivered, the inbox suppresses those already handled)", "err", err)
		}
		failures++
		d := backoff.Delay(failures, c.cfg.ReconnectMin, c.cfg.ReconnectMax)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		var err error
		if s, err = c.open(); err != nil {
			c.log.Warn("amqpconsumer: dialling again failed", "err", err, "attempt", failures)
		}
	}
}

// consume submits the deliveries of s until its channel is lost or ctx
// ends. At stop it cancels the consumer, hands back what was delivered and
// not submitted, and keeps the channel open until the engine has
// acknowledged the messages in flight.
func (c *Consumer[TTx]) consume(ctx context.Context, s *session) error {
	defer s.conn.Close()
	for {
		select {
		case <-ctx.Done():
			return c.drain(s)
		case m, ok := <-s.deliveries:
			if !ok {
				if ctx.Err() != nil {
					return c.drain(s)
				}
				return errors.New("the broker closed the channel or the connection")
			}
			d := c.delivery(m, s.gone)
			if err := c.eng.Submit(ctx, d); err != nil {
				_ = m.Nack(false, true)
			}
		}
	}
}

// drain, at stop, cancels the consumer, hands back what was delivered and
// not submitted, and waits until the engine has stopped (or the channel is
// gone) before the connection is closed, so that the messages in flight
// can still be acknowledged.
func (c *Consumer[TTx]) drain(s *session) error {
	_ = s.ch.Cancel(s.tag, false)
	for m := range s.deliveries { // closed once the broker confirmed the cancel
		_ = m.Nack(false, true)
	}
	c.mu.Lock()
	engDone := c.engDone
	c.mu.Unlock()
	select {
	case <-engDone:
	case <-s.gone:
	}
	return context.Canceled
}

// Stop stops consuming, hands back the messages not started, lets the
// handlers in flight finish and acknowledge, closes the connection and
// returns when every goroutine has exited. If ctx ends first, the handlers
// in flight are cancelled (their transactions roll back, their messages
// are handed back). Stop is idempotent and safe when Start never ran.
func (c *Consumer[TTx]) Stop(ctx context.Context) error {
	c.mu.Lock()
	if !c.started {
		c.mu.Unlock()
		return nil
	}
	c.stop()
	done, engDone := c.done, c.engDone
	c.mu.Unlock()
	err := c.eng.Stop(ctx)
	c.mu.Lock()
	select {
	case <-engDone:
	default:
		close(engDone)
	}
	c.mu.Unlock()
	<-done
	return err
}

// Run starts the Consumer and stops it gracefully when ctx ends, letting
// handlers in flight finish for at most Config.ShutdownGrace.
func (c *Consumer[TTx]) Run(ctx context.Context) error {
	if err := c.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), c.cfg.ShutdownGrace)
	defer cancel()
	return c.Stop(sctx)
}

// delivery adapts an AMQP delivery to consumer.Delivery.
type delivery struct {
	m        amqp.Delivery
	msg      inbox.Message
	key      string
	attempts int
	gone     <-chan struct{}
}

func (c *Consumer[TTx]) delivery(m amqp.Delivery, gone <-chan struct{}) *delivery {
	var hdr map[string]string
	if len(m.Headers) > 0 {
		hdr = make(map[string]string, len(m.Headers))
		for k, v := range m.Headers {
			if s, ok := headerString(v); ok {
				hdr[k] = s
			}
		}
	}
	if _, ok := hdr[inbox.HeaderID]; !ok && m.MessageId != "" {
		if hdr == nil {
			hdr = map[string]string{}
		}
		hdr[inbox.HeaderID] = m.MessageId
	}
	msg := inbox.NewMessage(m.RoutingKey, []byte(hdr[c.cfg.KeyHeader]), hdr, m.Body)
	msg.Type = m.Type
	msg.System = "rabbitmq"
	d := &delivery{m: m, msg: msg, key: msg.AggregateType + "\x00" + msg.AggregateID, gone: gone}
	// A quorum queue counts the earlier deliveries of a message.
	if n, ok := headerInt(m.Headers["x-delivery-count"]); ok && n > 0 {
		d.attempts = int(n)
	}
	return d
}

// headerString returns a header value as text: a string or bytes, a number,
// or the first of an array (amqpsink sends a repeated header as an array).
func headerString(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case []byte:
		return string(v), true
	case []any:
		if len(v) > 0 {
			return headerString(v[0])
		}
		return "", false
	}
	if n, ok := headerInt(v); ok {
		return strconv.FormatInt(n, 10), true
	}
	return "", false
}

func headerInt(v any) (int64, bool) {
	switch v := v.(type) {
	case int:
		return int64(v), true
	case int8:
		return int64(v), true
	case int16:
		return int64(v), true
	case int32:
		return int64(v), true
	case int64:
		return v, true
	case uint8:
		return int64(v), true
	case uint16:
		return int64(v), true
	case uint32:
		return int64(v), true
	}
	return 0, false
}

func (d *delivery) Message() inbox.Message { return d.msg }

func (d *delivery) Key() string { return d.key }

func (d *delivery) Attempts() int { return d.attempts }

func (d *delivery) Ack(context.Context) error { return d.m.Ack(false) }

// Release hands the message back with basic.nack and requeue; AMQP has no
// delay, so delay is not honoured.
func (d *delivery) Release(time.Duration) error { return d.m.Nack(false, true) }

func (d *delivery) KeepAlive() error { return nil }

// Abandoned is closed when the delivery's channel is closed: RabbitMQ has
// requeued the message, and an acknowledgement could no longer reach it.
func (d *delivery) Abandoned() <-chan struct{} { return d.gone }
