package amqpsink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox/internal/confval"
	"github.com/outboxkit/outbox/sink"
)

// Defaults applied to zero Config fields.
const (
	// DefaultExchange is the default exchange.
	DefaultExchange = "outbox"
	// DefaultExchangeType is the type Setup declares the exchange with.
	DefaultExchangeType = amqp.ExchangeTopic
	// DefaultKeyHeader is the header that carries Message.Key.
	DefaultKeyHeader = "key"
	// DefaultMaxInFlight bounds the unconfirmed messages of one Publish.
	DefaultMaxInFlight = 1024
	// DefaultConfirmTimeout is how long Publish waits for one confirm.
	DefaultConfirmTimeout = 30 * time.Second
	// DefaultMaxMessageSize is RabbitMQ 3.x's default max_message_size
	// (RabbitMQ 4 lowered it to 16 MiB).
	DefaultMaxMessageSize = 128 << 20
	// DefaultDialTimeout bounds dialing again after the connection was lost.
	DefaultDialTimeout = 10 * time.Second
)

// maxIdleChannels bounds the confirm-mode channels kept open between
// Publish calls; concurrent calls beyond it open channels of their own.
const maxIdleChannels = 8

// closeTimeout bounds the AMQP close handshake of a connection Dial opened.
const closeTimeout = 5 * time.Second

var (
	// ErrClosed is the error of every message published after Close.
	ErrClosed = errors.New("amqpsink: sink is closed")
	// ErrUnroutable is wrapped by the (permanent) error of a message the
	// broker returned because no queue is bound to receive it.
	ErrUnroutable = errors.New("message returned as unroutable")
	// ErrNacked is wrapped by the (transient) error of a message the broker
	// negatively acknowledged.
	ErrNacked = errors.New("broker nacked the message")
)

// Config configures a Sink. The zero value (or a nil *Config) is usable:
// every zero field takes its documented default. New and Dial do not modify
// it.
type Config struct {
	// Exchange is the exchange messages are published to (unless Route says
	// otherwise) and that Setup declares or checks. Default "outbox".
	Exchange string
	// ExchangeType is the type Setup declares Exchange with: "topic",
	// "direct", "fanout", "headers" or a plugin's type. Default "topic".
	ExchangeType string
	// Route maps a message Destination to the exchange and routing key it
	// is published with. Default: Exchange and the Destination itself.
	Route func(destination string) (exchange, routingKey string)
	// KeyHeader is the header that carries Message.Key. Default "key".
	KeyHeader string
	// Declare makes Setup declare Exchange (durable, of ExchangeType) and
	// the Queues. Without it Setup only checks that Exchange exists.
	Declare bool
	// Queues are declared (durable) and bound to Exchange by Setup when
	// Declare is set.
	Queues []Queue
	// MaxInFlight is the most messages one Publish call keeps unconfirmed.
	// Default 1024.
	MaxInFlight int
	// ConfirmTimeout is how long Publish waits for the confirm of one
	// message before it reports an Unavailable timeout error for it.
	// Default 30s.
	ConfirmTimeout time.Duration
	// MaxMessageSize is the largest body Publish sends; larger ones fail
	// permanently without being sent. Set it to the broker's
	// max_message_size; negative means no limit. Default 128 MiB.
	MaxMessageSize int
	// DialTimeout bounds dialing again, from Publish or Setup, after the
	// connection of a Sink made by Dial was lost, and the handshake of Dial
	// when its ctx has no deadline. Default 10s.
	DialTimeout time.Duration
	// Logger receives connection events. Default: warnings and errors as
	// text on standard error.
	Logger *slog.Logger
}

// Queue is a durable queue that Setup declares and binds to the exchange.
type Queue struct {
	// Name is the queue name.
	Name string
	// BindingKeys are the routing keys (patterns, for a topic exchange) the
	// queue is bound with; at least one. "#" binds every routing key of a
	// topic exchange.
	BindingKeys []string
	// Args are the queue arguments, e.g. {"x-queue-type": "quorum"}.
	Args amqp.Table
}

// normalize returns a copy of cfg with defaults applied, or an error naming
// the invalid field.
func normalize(cfg *Config) (Config, error) {
	var c Config
	if cfg != nil {
		c = *cfg
		c.Queues = slices.Clone(cfg.Queues)
	}
	if c.Exchange == "" {
		c.Exchange = DefaultExchange
	}
	if len(c.Exchange) > 255 {
		return c, fmt.Errorf("amqpsink: exchange name of %d bytes: RabbitMQ allows at most 255 (--amqp-exchange; Config.Exchange)", len(c.Exchange))
	}
	if c.ExchangeType == "" {
		c.ExchangeType = DefaultExchangeType
	}
	if c.KeyHeader == "" {
		c.KeyHeader = DefaultKeyHeader
	}
	if len(c.KeyHeader) > 255 {
		return c, fmt.Errorf("amqpsink: invalid Config.KeyHeader: %d bytes, at most 255 allowed", len(c.KeyHeader))
	}
	if len(c.Queues) > 0 && !c.Declare {
		return c, errors.New("amqpsink: Config.Queues names queues to declare and bind, but Config.Declare is not set: set it, so that Setup declares the exchange, the queues and their bindings")
	}
	for i, q := range c.Queues {
		switch {
		case q.Name == "":
			return c, fmt.Errorf("amqpsink: invalid Config.Queues[%d]: empty Name", i)
		case len(q.Name) > 255:
			return c, fmt.Errorf("amqpsink: invalid Config.Queues[%d]: Name is %d bytes, at most 255 allowed", i, len(q.Name))
		case len(q.BindingKeys) == 0:
			return c, fmt.Errorf("amqpsink: invalid Config.Queues[%d] (%q): no BindingKeys; use \"#\" to bind every routing key of a topic exchange", i, q.Name)
		}
		for _, k := range q.BindingKeys {
			if len(k) > 255 {
				return c, fmt.Errorf("amqpsink: invalid Config.Queues[%d] (%q): binding key of %d bytes, at most 255 allowed", i, q.Name, len(k))
			}
		}
		if err := q.Args.Validate(); err != nil {
			return c, fmt.Errorf("amqpsink: invalid Config.Queues[%d] (%q) Args: %v", i, q.Name, err)
		}
	}
	if err := confval.PositiveOr("amqpsink", "MaxInFlight", &c.MaxInFlight, DefaultMaxInFlight); err != nil {
		return c, err
	}
	if err := confval.PositiveOr("amqpsink", "ConfirmTimeout", &c.ConfirmTimeout, DefaultConfirmTimeout); err != nil {
		return c, err
	}
	if err := confval.PositiveOr("amqpsink", "DialTimeout", &c.DialTimeout, DefaultDialTimeout); err != nil {
		return c, err
	}
	if c.MaxMessageSize == 0 {
		c.MaxMessageSize = DefaultMaxMessageSize
	}
	c.Logger = confval.Logger(c.Logger)
	return c, nil
}

// Sink publishes messages to RabbitMQ. It is safe for concurrent use; order
// is kept within one Publish call, not across concurrent calls.
type Sink struct {
	cfg Config
	log *slog.Logger

	// rawURL and shown (rawURL with the password redacted) are set by Dial:
	// the sink owns its connection and dials again when it is lost.
	rawURL, shown string

	mu     sync.Mutex
	cs     *connState // current connection; nil before the first use
	user   *amqp.Connection
	closed bool

	dialMu sync.Mutex // serializes dialing again
	// ctx is cancelled and done closed by Close.
	ctx    context.Context
	cancel context.CancelFunc
	done   <-chan struct{}
	wg     sync.WaitGroup // goroutines of Publish, Setup and connection watchers
}

var _ sink.Sink = (*Sink)(nil)

// New returns a Sink that publishes on conn. It does no I/O: the sink opens
// its channels on first use. Close closes those channels and leaves conn
// open. If conn is closed, Publish fails with [sink.Unavailable] errors: the
// sink cannot reopen a connection it does not own.
func New(conn *amqp.Connection, cfg *Config) (*Sink, error) {
	if conn == nil {
		return nil, errors.New("amqpsink: New: nil *amqp091.Connection")
	}
	c, err := normalize(cfg)
	if err != nil {
		return nil, err
	}
	s := &Sink{cfg: c, log: c.Logger, user: conn}
	s.init()
	return s, nil
}

// Dial connects to the broker at rawURL (amqp://user:password@host:port/vhost
// or amqps://...; see amqp091.ParseURI for the query parameters) before ctx
// ends and returns a Sink that owns the connection: Close closes it. A lost
// connection is dialed again by the next Publish or Setup. Like New, Dial
// does not touch exchanges or queues; call Setup.
func Dial(ctx context.Context, rawURL string, cfg *Config) (*Sink, error) {
	c, err := normalize(cfg)
	if err != nil {
		return nil, err
	}
	shown, err := checkURL(rawURL)
	if err != nil {
		return nil, err
	}
	s := &Sink{cfg: c, log: c.Logger.With("url", shown), rawURL: rawURL, shown: shown}
	s.init()
	conn, err := s.dial(ctx)
	if err != nil {
		s.cancel()
		return nil, err
	}
	s.log.Info("amqpsink: connected to RabbitMQ")
	s.cs = s.newConnState(conn)
	return s, nil
}

func (s *Sink) init() {
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.done = s.ctx.Done()
}

// checkURL validates an AMQP URL and returns it with its password redacted.
func checkURL(rawURL string) (string, error) {
	if strings.TrimSpace(rawURL) == "" {
		return "", errors.New("amqpsink: empty URL; want amqp://user:password@host:port/vhost")
	}
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return "", errors.New("amqpsink: invalid URL (not shown, it may hold a password): want amqp://user:password@host:port/vhost, with reserved characters in the user name or password percent-encoded")
	}
	shown := u.Redacted()
	if u.Scheme != "amqp" && u.Scheme != "amqps" {
		return "", fmt.Errorf("amqpsink: invalid URL %s: scheme %q is not supported; use amqp:// or amqps://", shown, u.Scheme)
	}
	if _, err := amqp.ParseURI(rawURL); err != nil {
		return "", fmt.Errorf("amqpsink: invalid URL %s: %v", shown, err)
	}
	return shown, nil
}

// dial opens a connection to s.rawURL before ctx ends.
func (s *Sink) dial(ctx context.Context) (*amqp.Connection, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("amqpsink: cannot connect to %s: %w", s.shown, err)
	}
	// The TCP connection honours ctx; the TLS and AMQP handshakes run
	// under a deadline (ctx's, or DialTimeout) that ctx's cancellation
	// moves to the past.
	var stop func() bool
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("outboxkit-amqpsink")
	conn, err := amqp.DialConfig(s.rawURL, amqp.Config{
		Properties: props,
		Dial: func(network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			deadline, ok := ctx.Deadline()
			if !ok {
				deadline = time.Now().Add(s.cfg.DialTimeout)
			}
			if err := c.SetDeadline(deadline); err != nil {
				c.Close()
				return nil, err
			}
			stop = context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
			return c, nil
		},
	})
	if stop != nil && !stop() && err == nil {
		// ctx ended right after the handshake, and its deadline may
		// have broken the connection.
		_ = conn.CloseDeadline(time.Now())
		return nil, fmt.Errorf("amqpsink: cannot connect to %s: %w", s.shown, ctx.Err())
	}
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%v: %w", err, ctx.Err())
		}
		return nil, fmt.Errorf("amqpsink: cannot connect to %s: %w%s", s.shown, err, dialHint(err))
	}
	return conn, nil
}

// dialHint explains the usual causes of a failed dial.
func dialHint(err error) string {
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.AccessRefused {
		return " (check the user name, password and vhost in the URL)"
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return " (is RabbitMQ running and listening there?)"
	}
	return ""
}

// connState is one connection and the sink's state on it.
type connState struct {
	conn *amqp.Connection

	mu    sync.Mutex
	idle  []*pubChan
	known map[string]bool // exchanges known to exist

	blocked atomic.Pointer[string] // reason, while a resource alarm blocks the connection
}

// newConnState wraps conn and starts watching it for closing and blocking.
func (s *Sink) newConnState(conn *amqp.Connection) *connState {
	cs := &connState{conn: conn, known: map[string]bool{}}
	closes := conn.NotifyClose(make(chan *amqp.Error, 1))
	blocks := conn.NotifyBlocked(make(chan amqp.Blocking, 8))
	s.wg.Go(func() {
		for {
			select {
			case err, ok := <-closes:
				if ok && err != nil {
					s.log.Warn("amqpsink: connection to RabbitMQ lost", "err", err)
				}
				return
			case b, ok := <-blocks:
				if !ok {
					blocks = nil
					continue
				}
				if b.Active {
					reason := b.Reason
					cs.blocked.Store(&reason)
					s.log.Warn("amqpsink: RabbitMQ blocked publishing on the connection (resource alarm)", "reason", b.Reason)
				} else {
					cs.blocked.Store(nil)
					s.log.Info("amqpsink: RabbitMQ unblocked the connection")
				}
			case <-s.done:
				return
			}
		}
	})
	return cs
}

// conn returns the current connection, dialing again (for a Sink made by
// Dial) when it was lost.
func (s *Sink) conn() (*connState, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	if s.cs == nil && s.user != nil {
		s.cs = s.newConnState(s.user)
	}
	cs := s.cs
	s.mu.Unlock()
	if !cs.conn.IsClosed() {
		return cs, nil
	}
	if s.rawURL == "" {
		return nil, sink.Unavailable(errors.New("amqpsink: the connection passed to New is closed; the sink cannot reopen it"))
	}

	s.dialMu.Lock()
	defer s.dialMu.Unlock()
	s.mu.Lock()
	cs = s.cs
	s.mu.Unlock()
	if !cs.conn.IsClosed() {
		return cs, nil // another call dialed meanwhile
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.DialTimeout)
	defer cancel()
	conn, err := s.dial(ctx)
	if err != nil {
		return nil, sink.Unavailable(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = conn.CloseDeadline(time.Now().Add(closeTimeout))
		return nil, ErrClosed
	}
	s.log.Info("amqpsink: reconnected to RabbitMQ")
	s.cs = s.newConnState(conn)
	return s.cs, nil
}

// pubChan is a confirm-mode channel with its return and close listeners.
type pubChan struct {
	ch      *amqp.Channel
	returns chan amqp.Return
	closes  chan *amqp.Error
}

// channel returns an idle confirm-mode channel or opens one.
func (s *Sink) channel(cs *connState) (*pubChan, error) {
	cs.mu.Lock()
	for len(cs.idle) > 0 {
		pc := cs.idle[len(cs.idle)-1]
		cs.idle = cs.idle[:len(cs.idle)-1]
		if !pc.ch.IsClosed() {
			cs.mu.Unlock()
			return pc, nil
		}
	}
	cs.mu.Unlock()
	ch, err := cs.conn.Channel()
	if err != nil {
		return nil, err
	}
	pc := &pubChan{
		ch: ch,
		// Each unconfirmed message may be returned once; the buffer never
		// fills, so the connection's reader never waits on it.
		returns: ch.NotifyReturn(make(chan amqp.Return, s.cfg.MaxInFlight+1)),
		closes:  ch.NotifyClose(make(chan *amqp.Error, 1)),
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, err
	}
	return pc, nil
}

// release keeps pc for the next Publish if reuse is set and pc is still
// usable, and closes it otherwise.
func (s *Sink) release(cs *connState, pc *pubChan, reuse bool) {
	if reuse && !pc.ch.IsClosed() {
		s.mu.Lock()
		closed := s.closed
		s.mu.Unlock()
		cs.mu.Lock()
		if !closed && len(cs.idle) < maxIdleChannels {
			cs.idle = append(cs.idle, pc)
			cs.mu.Unlock()
			return
		}
		cs.mu.Unlock()
	}
	_ = pc.ch.Close()
}

// closeCause is the error that closed pc's channel.
func (pc *pubChan) closeCause() error {
	select {
	case err, ok := <-pc.closes:
		if ok && err != nil {
			return err
		}
	default:
	}
	return amqp.ErrClosed
}

// Setup prepares the broker at start-up. With Config.Declare it declares
// Config.Exchange (durable, of Config.ExchangeType) and then each of
// Config.Queues (durable) with its bindings to the exchange; declaring what
// exists with the same settings changes nothing. Without Config.Declare it
// only checks that Config.Exchange exists. Setup does not declare other
// exchanges that Config.Route returns; Publish checks those as it checks
// every exchange, before it first publishes to it on a connection.
func (s *Sink) Setup(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("amqpsink: setup: %w", err)
	}
	res := make(chan error, 1)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		res <- s.setup()
	}()
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return fmt.Errorf("amqpsink: setup of exchange %q: %w", s.cfg.Exchange, ctx.Err())
	}
}

func (s *Sink) setup() error {
	cs, err := s.conn()
	if err != nil {
		return err
	}
	ch, err := cs.conn.Channel()
	if err != nil {
		return s.setupErr(cs, fmt.Errorf("amqpsink: setup: open channel: %w", err))
	}
	defer ch.Close()
	ex := s.cfg.Exchange
	if !s.cfg.Declare {
		if err := ch.ExchangeDeclarePassive(ex, s.cfg.ExchangeType, true, false, false, false, nil); err != nil {
			var ae *amqp.Error
			if errors.As(err, &ae) && ae.Code == amqp.NotFound {
				return fmt.Errorf("amqpsink: %s", s.noExchange(ex, cs.conn.Config.Vhost))
			}
			return s.setupErr(cs, fmt.Errorf("amqpsink: check exchange %q: %w", ex, err))
		}
		cs.setKnown(ex)
		return nil
	}
	if err := ch.ExchangeDeclare(ex, s.cfg.ExchangeType, true, false, false, false, nil); err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
			return fmt.Errorf("amqpsink: the exchange %q exists in vhost %q but is not a durable %s exchange (RabbitMQ: %s): delete it, "+
				"or publish to another exchange (--amqp-exchange; Config.Exchange, and Config.ExchangeType for its type)", ex, cs.conn.Config.Vhost, s.cfg.ExchangeType, ae.Reason)
		}
		return s.setupErr(cs, fmt.Errorf("amqpsink: declare exchange %q: %w", ex, err))
	}
	cs.setKnown(ex)
	s.log.Info("amqpsink: declared exchange", "exchange", ex, "type", s.cfg.ExchangeType)
	for _, q := range s.cfg.Queues {
		if _, err := ch.QueueDeclare(q.Name, true, false, false, false, q.Args); err != nil {
			var ae *amqp.Error
			if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
				return fmt.Errorf("amqpsink: the queue %q exists in vhost %q but is not a durable queue with arguments %v (RabbitMQ: %s): delete it, or change its entry in Config.Queues", q.Name, cs.conn.Config.Vhost, q.Args, ae.Reason)
			}
			return s.setupErr(cs, fmt.Errorf("amqpsink: declare queue %q: %w", q.Name, err))
		}
		for _, k := range q.BindingKeys {
			if err := ch.QueueBind(q.Name, k, ex, false, nil); err != nil {
				return s.setupErr(cs, fmt.Errorf("amqpsink: bind queue %q to exchange %q with binding key %q: %w", q.Name, ex, k, err))
			}
		}
		s.log.Info("amqpsink: declared queue", "queue", q.Name, "exchange", ex, "binding_keys", q.BindingKeys)
	}
	return nil
}

// The errors below speak RabbitMQ (exchange, queue, binding key) and name
// what fixes them twice: the flag of outbox relay, where the setting comes
// from one, and the Config field of a program that builds the sink itself.

// noExchange says that exchange does not exist in vhost, and how to make
// it exist.
func (s *Sink) noExchange(exchange, vhost string) string {
	if exchange != s.cfg.Exchange {
		return fmt.Sprintf("the exchange %q (from Config.Route) does not exist in vhost %q: declare it (Setup declares Config.Exchange only)", exchange, vhost)
	}
	return fmt.Sprintf("the exchange %q does not exist in vhost %q: check its name (--amqp-exchange; Config.Exchange), declare it (a durable %s exchange), "+
		"or let the relay declare it at start-up (--amqp-declare; Config.Declare, then Setup)", exchange, vhost, s.cfg.ExchangeType)
}

// noBinding says that no queue is bound to receive a message of r, and
// how to bind one.
func noBinding(r route) string {
	return fmt.Sprintf("no queue is bound to the exchange %q with a binding key that matches the routing key %q; bind a queue "+
		"(rabbitmqadmin declare binding source=%q destination=QUEUE routing_key=%q; Config.Queues), or route the event to a key a queue is bound with "+
		"(--destination, --route-by, --route-replacement; Config.Route)", r.exchange, r.key, r.exchange, r.key)
}

// accessRefused says that the URL's user may not publish to exchange.
func accessRefused(exchange, vhost string) string {
	return fmt.Sprintf("access refused: the user of the URL may not publish to the exchange %q in vhost %q (grant it write permission: rabbitmqctl set_permissions)", exchange, vhost)
}

// setupErr marks err Unavailable when the connection is gone.
func (s *Sink) setupErr(cs *connState, err error) error {
	if cs.conn.IsClosed() {
		return sink.Unavailable(err)
	}
	return err
}

func (cs *connState) setKnown(exchange string) {
	cs.mu.Lock()
	cs.known[exchange] = true
	cs.mu.Unlock()
}

// route is where one message goes.
type route struct{ exchange, key string }

// job is one Publish call, carried out by a goroutine while the caller
// waits for it or for its context.
type job struct {
	msgs   []sink.Message
	routes []route

	mu      sync.Mutex
	errs    []error
	have    []bool
	left    int
	done    chan struct{} // closed once every message has a result
	stop    chan struct{} // closed when the caller stopped waiting
	stopped bool
}

// set records the result of message i, unless it has one.
func (j *job) set(i int, err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.have[i] {
		return
	}
	j.errs[i], j.have[i] = err, true
	if j.left--; j.left == 0 {
		close(j.done)
	}
}

// abandon gives every message without a result err and stops the job.
func (j *job) abandon(err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for i, ok := range j.have {
		if !ok {
			j.errs[i], j.have[i] = err, true
		}
	}
	if !j.stopped {
		j.stopped = true
		close(j.stop)
	}
}

// rest gives every message without a result err.
func (j *job) rest(err error) {
	for i := range j.msgs {
		j.set(i, err)
	}
}

// stopped reports whether the caller of j stopped waiting or the sink was
// closed: the work on j ends then.
func (s *Sink) stopped(j *job) bool {
	select {
	case <-j.stop:
		return true
	case <-s.done:
		return true
	default:
		return false
	}
}

// Publish publishes msgs and returns one result per message, in order: nil
// once the broker confirmed the message without returning it. Messages are
// published in slice order on one channel, at most Config.MaxInFlight of
// them unconfirmed. When ctx ends first, messages without a result get
// ctx.Err() (the work in progress stops in the background). See the package
// documentation for which errors are permanent.
//
// After ctx ended, the message being written may still be read in the
// background when Publish returns: do not modify the messages' Key, Value
// or Headers afterwards.
func (s *Sink) Publish(ctx context.Context, msgs []sink.Message) []error {
	if len(msgs) == 0 {
		return []error{}
	}
	if err := ctx.Err(); err != nil {
		return sink.Results(len(msgs), err)
	}
	if s.isClosed() {
		return sink.Results(len(msgs), ErrClosed)
	}
	j := &job{
		msgs:   msgs,
		routes: make([]route, len(msgs)),
		errs:   make([]error, len(msgs)),
		have:   make([]bool, len(msgs)),
		left:   len(msgs),
		done:   make(chan struct{}),
		stop:   make(chan struct{}),
	}
	todo := make([]int, 0, len(msgs))
	for i := range msgs {
		if err := s.check(&msgs[i], &j.routes[i]); err != nil {
			j.set(i, sink.Permanent(err))
			continue
		}
		todo = append(todo, i)
	}
	if len(todo) > 0 {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return sink.Results(len(msgs), ErrClosed)
		}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			s.run(j, todo)
			// Only Close stops a job before every message has a result.
			j.rest(ErrClosed)
		}()
		select {
		case <-j.done:
		case <-ctx.Done():
			j.abandon(ctx.Err())
		}
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.errs)
}

func (s *Sink) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// check routes m into r and reports why m can never be published, or nil.
func (s *Sink) check(m *sink.Message, r *route) error {
	if m.Destination == "" {
		return errors.New("amqpsink: publish: empty destination")
	}
	if s.cfg.Route != nil {
		r.exchange, r.key = s.cfg.Route(m.Destination)
	} else {
		r.exchange, r.key = s.cfg.Exchange, m.Destination
	}
	pre := func() string {
		return fmt.Sprintf("amqpsink: publish to exchange %q with routing key %q", r.exchange, r.key)
	}
	switch {
	case len(r.exchange) > 255:
		return fmt.Errorf("%s: exchange name of %d bytes from Config.Route: RabbitMQ allows at most 255", pre(), len(r.exchange))
	case len(r.key) > 255:
		return fmt.Errorf("%s: routing key (the destination) of %d bytes: RabbitMQ allows at most 255", pre(), len(r.key))
	case len(m.ID) > 255:
		return fmt.Errorf("%s: message id of %d bytes, AMQP's message-id holds at most 255", pre(), len(m.ID))
	case s.cfg.MaxMessageSize > 0 && len(m.Value) > s.cfg.MaxMessageSize:
		return fmt.Errorf("%s: body of %d bytes exceeds the largest message the sink sends, %d bytes (RabbitMQ's max_message_size; Config.MaxMessageSize)", pre(), len(m.Value), s.cfg.MaxMessageSize)
	}
	for _, h := range m.Headers {
		if len(h.Key) > 255 {
			return fmt.Errorf("%s: header name of %d bytes, at most 255 allowed", pre(), len(h.Key))
		}
	}
	return nil
}

// run carries out j for the messages todo.
func (s *Sink) run(j *job, todo []int) {
	cs, err := s.conn()
	if err != nil {
		for _, i := range todo {
			j.set(i, err)
		}
		return
	}
	if reason := cs.blocked.Load(); reason != nil {
		err := sink.Unavailable(fmt.Errorf("amqpsink: RabbitMQ blocks publishing on this connection (resource alarm: %s); free memory or disk space on the broker", *reason))
		for _, i := range todo {
			j.set(i, err)
		}
		return
	}
	todo = s.checkExchanges(j, cs, todo)
	for len(todo) > 0 && !s.stopped(j) {
		todo = s.publishRound(j, cs, todo)
	}
}

// checkExchanges checks that the exchanges of the messages todo exist,
// fails the messages of those that do not, and returns the others.
func (s *Sink) checkExchanges(j *job, cs *connState, todo []int) []int {
	var unknown []string
	cs.mu.Lock()
	for _, i := range todo {
		ex := j.routes[i].exchange
		if ex != "" && !cs.known[ex] && !slices.Contains(unknown, ex) {
			unknown = append(unknown, ex)
		}
	}
	cs.mu.Unlock()
	if len(unknown) == 0 {
		return todo
	}
	failed := map[string]error{}
	var ch *amqp.Channel
	for _, ex := range unknown {
		if ch == nil || ch.IsClosed() {
			var err error
			if ch, err = cs.conn.Channel(); err != nil {
				failed[ex] = err
				continue
			}
		}
		err := ch.ExchangeDeclarePassive(ex, s.cfg.ExchangeType, true, false, false, false, nil)
		if err == nil {
			cs.setKnown(ex)
			continue
		}
		failed[ex] = err
	}
	if ch != nil {
		_ = ch.Close()
	}
	if len(failed) == 0 {
		return todo
	}
	kept := todo[:0:0]
	for _, i := range todo {
		r := j.routes[i]
		err, ok := failed[r.exchange]
		if !ok {
			kept = append(kept, i)
			continue
		}
		var ae *amqp.Error
		switch {
		case errors.As(err, &ae) && ae.Code == amqp.NotFound && !cs.conn.IsClosed():
			j.set(i, sink.Permanent(fmt.Errorf("amqpsink: publish to exchange %q with routing key %q: %s: %w",
				r.exchange, r.key, s.noExchange(r.exchange, cs.conn.Config.Vhost), err)))
		case errors.As(err, &ae) && ae.Code == amqp.AccessRefused && !cs.conn.IsClosed():
			j.set(i, sink.Permanent(fmt.Errorf("amqpsink: publish to exchange %q with routing key %q: %s: %w", r.exchange, r.key, accessRefused(r.exchange, cs.conn.Config.Vhost), err)))
		default:
			j.set(i, s.lostErr(cs, r, fmt.Errorf("check that the exchange exists: %w", err)))
		}
	}
	return kept
}

// publishRound publishes the messages todo as one batch. If the broker
// closes the channel because of one message, it publishes the unconfirmed
// messages one at a time until that message fails, and returns the messages
// after it, to publish in the next round; otherwise it returns nil.
func (s *Sink) publishRound(j *job, cs *connState, todo []int) []int {
	unresolved, cause, scoped := s.batch(j, cs, todo)
	if len(unresolved) == 0 || s.stopped(j) {
		return nil
	}
	if !scoped {
		for _, i := range unresolved {
			j.set(i, s.lostErr(cs, j.routes[i], cause))
		}
		return nil
	}
	if isCode(cause, amqp.NotFound) {
		cs.mu.Lock()
		clear(cs.known) // an exchange was deleted after it was checked
		cs.mu.Unlock()
		if rest := s.checkExchanges(j, cs, unresolved); len(rest) < len(unresolved) {
			return rest
		}
	}
	s.log.Debug("amqpsink: the broker closed the channel because of a message; publishing the unconfirmed messages one at a time to find it",
		"messages", len(unresolved), "err", cause)
	for k, i := range unresolved {
		u, cause, scoped := s.batch(j, cs, unresolved[k:k+1])
		if len(u) == 0 {
			continue
		}
		if s.stopped(j) {
			return nil
		}
		if !scoped {
			for _, i := range unresolved[k:] {
				j.set(i, s.lostErr(cs, j.routes[i], cause))
			}
			return nil
		}
		j.set(i, s.rejectedErr(cs, &j.msgs[i], j.routes[i], cause))
		return unresolved[k+1:]
	}
	return nil
}

// pending is a message waiting for its confirm.
type pending struct {
	i        int
	dc       *amqp.DeferredConfirmation
	deadline time.Time
	returned *amqp.Return
}

// batch publishes the messages idx on one channel in order and waits for
// their confirms, recording the result of each message it resolves. When
// the channel closes first, it returns the messages left without a result,
// in order, with the reason; scoped reports that the broker closed the
// channel (connection still open) with an error that one message can cause.
func (s *Sink) batch(j *job, cs *connState, idx []int) (unresolved []int, cause error, scoped bool) {
	pc, err := s.channel(cs)
	if err != nil {
		return idx, fmt.Errorf("open channel: %w", err), false
	}
	reuse := true
	defer func() { s.release(cs, pc, reuse) }()

	window := make([]pending, 0, min(len(idx), s.cfg.MaxInFlight))
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()

	// matchReturns attaches the returns received so far to their pending
	// messages. The broker sends a message's return before its confirm and
	// the client hands both over in that order, so a return is here by the
	// time its message's confirm is.
	matchReturns := func() {
		for {
			select {
			case r, ok := <-pc.returns:
				if !ok {
					return
				}
				matched := false
				for k := range window {
					p := &window[k]
					rt := j.routes[p.i]
					if p.returned == nil && j.msgs[p.i].ID == r.MessageId && rt.exchange == r.Exchange && rt.key == r.RoutingKey {
						p.returned, matched = &r, true
						break
					}
				}
				if !matched {
					s.log.Warn("amqpsink: a returned message matches no unconfirmed message", "message_id", r.MessageId, "exchange", r.Exchange, "routing_key", r.RoutingKey)
				}
			default:
				return
			}
		}
	}

	closed := false
	// settle waits for the confirm of the oldest pending message and pops it.
	settle := func() bool {
		p := window[0]
		timer.Reset(time.Until(p.deadline))
		select {
		case <-p.dc.Done():
		case <-timer.C:
			reuse = false // its confirm may still arrive
			j.set(p.i, s.lostErr(cs, j.routes[p.i], fmt.Errorf("no confirm within %v (Config.ConfirmTimeout)", s.cfg.ConfirmTimeout)))
			window = window[1:]
			return true
		case <-j.stop:
			reuse = false
			return false
		case <-s.done:
			reuse = false
			return false
		}
		matchReturns()
		p = window[0]
		window = window[1:]
		r := j.routes[p.i]
		switch {
		case p.dc.Acked() && p.returned != nil:
			j.set(p.i, sink.Permanent(fmt.Errorf("amqpsink: publish to exchange %q with routing key %q: %w (%d %s): %s",
				r.exchange, r.key, ErrUnroutable, p.returned.ReplyCode, p.returned.ReplyText, noBinding(r))))
		case p.dc.Acked():
			j.set(p.i, nil)
		case pc.ch.IsClosed():
			closed = true
			unresolved = append(unresolved, p.i)
		default:
			j.set(p.i, fmt.Errorf("amqpsink: publish to exchange %q with routing key %q: %w", r.exchange, r.key, ErrNacked))
		}
		return true
	}

	for n, i := range idx {
		if len(window) == s.cfg.MaxInFlight && !settle() {
			return nil, nil, false
		}
		if s.stopped(j) {
			reuse = false
			return nil, nil, false
		}
		if closed || pc.ch.IsClosed() {
			closed = true
			unresolved = append(unresolved, idx[n:]...)
			break
		}
		m, r := &j.msgs[i], j.routes[i]
		dc, err := pc.ch.PublishWithDeferredConfirm(r.exchange, r.key, true, false, s.publishing(m))
		if err != nil {
			// The channel or connection is closed or broken.
			reuse = false
			closed = true
			if cause == nil {
				cause = err
			}
			unresolved = append(unresolved, idx[n:]...)
			break
		}
		window = append(window, pending{i: i, dc: dc, deadline: time.Now().Add(s.cfg.ConfirmTimeout)})
	}
	for len(window) > 0 {
		if !settle() {
			return nil, nil, false
		}
	}
	if !closed {
		return nil, nil, false
	}
	reuse = false
	slices.Sort(unresolved)
	if pc.ch.IsClosed() {
		cause = pc.closeCause()
	}
	var ae *amqp.Error
	scoped = !cs.conn.IsClosed() && errors.As(cause, &ae) && ae.Server &&
		(ae.Code == amqp.NotFound || ae.Code == amqp.AccessRefused || ae.Code == amqp.PreconditionFailed)
	return unresolved, cause, scoped
}

// publishing converts m into an AMQP publishing.
func (s *Sink) publishing(m *sink.Message) amqp.Publishing {
	ct := amqp.MimeApplicationOctetStream
	if json.Valid(m.Value) {
		ct = amqp.MimeApplicationJSON
	}
	return amqp.Publishing{
		Headers:      s.table(m),
		ContentType:  ct,
		DeliveryMode: amqp.Persistent,
		MessageId:    m.ID,
		Type:         m.Type,
		Body:         m.Value,
	}
}

// table builds the headers table of m: "id", the headers (a repeated name
// maps to an array of its values) and the key.
func (s *Sink) table(m *sink.Message) amqp.Table {
	t := make(amqp.Table, len(m.Headers)+2)
	if _, ok := m.Header("id"); !ok {
		t["id"] = m.ID
	}
	for _, h := range m.Headers {
		switch v := t[h.Key].(type) {
		case nil:
			t[h.Key] = h.Value
		case string:
			t[h.Key] = []any{v, h.Value}
		case []any:
			t[h.Key] = append(v, h.Value)
		}
	}
	if _, ok := t[s.cfg.KeyHeader]; !ok && len(m.Key) > 0 {
		t[s.cfg.KeyHeader] = string(m.Key)
	}
	return t
}

func isCode(err error, code int) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == code
}

// lostErr is the error of a message whose outcome is unknown because of
// cause. It is Unavailable unless the broker closed the channel on an open
// connection: a lost connection, a timeout or an I/O error says nothing
// about the message.
func (s *Sink) lostErr(cs *connState, r route, cause error) error {
	pre := fmt.Sprintf("amqpsink: publish to exchange %q with routing key %q", r.exchange, r.key)
	if cs.conn.IsClosed() {
		return sink.Unavailable(fmt.Errorf("%s: connection to RabbitMQ lost: %w", pre, cause))
	}
	var ae *amqp.Error
	if !errors.As(cause, &ae) {
		return sink.Unavailable(fmt.Errorf("%s: %w", pre, cause))
	}
	return fmt.Errorf("%s: channel closed before the broker confirmed the message: %w", pre, cause)
}

// rejectedErr is the permanent error of a message that made the broker
// close its channel when published alone.
func (s *Sink) rejectedErr(cs *connState, m *sink.Message, r route, cause error) error {
	pre := fmt.Sprintf("amqpsink: publish to exchange %q with routing key %q", r.exchange, r.key)
	var ae *amqp.Error
	errors.As(cause, &ae)
	switch ae.Code {
	case amqp.NotFound:
		return sink.Permanent(fmt.Errorf("%s: %s: %w", pre, s.noExchange(r.exchange, cs.conn.Config.Vhost), cause))
	case amqp.AccessRefused:
		return sink.Permanent(fmt.Errorf("%s: %s: %w", pre, accessRefused(r.exchange, cs.conn.Config.Vhost), cause))
	default:
		return sink.Permanent(fmt.Errorf("%s: the broker rejected the message (body of %d bytes; a body over the broker's max_message_size is rejected like this): %w", pre, len(m.Value), cause))
	}
}

// Close stops the sink: later Publish calls fail with ErrClosed. It closes
// the connection if Dial opened it, or else the channels the sink opened on
// the caller's connection, and waits for Publish work in progress to end.
// Close is idempotent and always returns nil.
func (s *Sink) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	cs := s.cs
	s.mu.Unlock()
	s.cancel()
	if cs != nil && s.rawURL != "" {
		_ = cs.conn.CloseDeadline(time.Now().Add(closeTimeout))
	}
	s.wg.Wait()
	s.mu.Lock()
	cs = s.cs // a Publish may have dialed again meanwhile (and closed that)
	s.mu.Unlock()
	if cs != nil {
		cs.mu.Lock()
		idle := cs.idle
		cs.idle = nil
		cs.mu.Unlock()
		for _, pc := range idle {
			_ = pc.ch.Close()
		}
	}
	return nil
}

// System names the broker as OpenTelemetry's messaging.system attribute
// does: "rabbitmq".
func (s *Sink) System() string { return "rabbitmq" }
