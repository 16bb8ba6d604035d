package mqttconsumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/inbox/internal/envelope"
	"github.com/outboxkit/outbox/internal/confval"
)

// Defaults applied to zero Config fields.
const (
	// DefaultConnectTimeout bounds one connection attempt by default.
	DefaultConnectTimeout = 10 * time.Second
	// DefaultMaxReconnectInterval is the longest pause between two
	// reconnection attempts by default.
	DefaultMaxReconnectInterval = 10 * time.Second
	// DefaultShutdownGrace is how long Run lets handlers in flight finish.
	DefaultShutdownGrace = 30 * time.Second
)

// Config configures a Consumer. URL, ClientID and Topics are required.
type Config struct {
	// Config holds the concurrency, retry and dead-letter settings. Its
	// Logger defaults to warnings and errors as text on standard error.
	consumer.Config
	// URL is the broker: mqtt://host:port (or tcp://) or mqtts://host:port.
	// Required.
	URL string
	// ClientID names the persistent session: keep it the same across
	// restarts, and different for every running instance. Required.
	ClientID string
	// Topics are the topic filters subscribed to with QoS 1 (wildcards +
	// and # allowed). Required.
	Topics []string
	// Options, when set, adjusts the Paho client options (user name,
	// password, TLS) after the consumer set its own; do not change the
	// client id, the clean session, the acknowledgements or the handlers.
	Options func(*mqtt.ClientOptions)
	// ConnectTimeout bounds one connection attempt. Default 10s.
	ConnectTimeout time.Duration
	// MaxReconnectInterval is the longest pause between two reconnection
	// attempts after the connection was lost. Default 10s.
	MaxReconnectInterval time.Duration
	// ShutdownGrace is how long Run lets handlers in flight finish after
	// its context ended. Default 30s.
	ShutdownGrace time.Duration
}

// Consumer subscribes with a persistent session and handles the messages
// through an inbox.
type Consumer[TTx any] struct {
	cfg    Config
	broker string
	log    *slog.Logger
	eng    *consumer.Engine[TTx]

	mu      sync.Mutex
	started bool
	stopped bool
	client  mqtt.Client
	ctx     context.Context // ends at Stop: no more submissions
	stop    context.CancelFunc
	conn    chan struct{} // closed when the current connection is lost
	first   chan error    // the subscription of the first connection
}

// New returns a Consumer of cfg.Topics that handles messages with h through
// ib. It does no I/O; Start connects.
func New[TTx any](ib *inbox.Inbox[TTx], h consumer.Handler[TTx], cfg *Config) (*Consumer[TTx], error) {
	if ib == nil {
		return nil, errors.New("mqttconsumer: inbox is nil")
	}
	if h == nil {
		return nil, errors.New("mqttconsumer: handler is nil")
	}
	c, broker, err := normalize(cfg)
	if err != nil {
		return nil, err
	}
	c.Logger = confval.Logger(c.Logger)
	c.KeepAlive = 0 // MQTT has no acknowledgement timeout to extend
	eng, err := consumer.New(ib, h, &c.Config)
	if err != nil {
		return nil, fmt.Errorf("mqttconsumer: %w", err)
	}
	return &Consumer[TTx]{cfg: c, broker: broker, log: c.Logger.With("client_id", c.ClientID), eng: eng}, nil
}

// normalize validates cfg and returns a copy with defaults applied, and the
// broker URL in Paho's form.
func normalize(cfg *Config) (Config, string, error) {
	if cfg == nil {
		return Config{}, "", errors.New("mqttconsumer: config is nil: URL, ClientID and Topics are required")
	}
	c := *cfg
	c.Topics = append([]string(nil), cfg.Topics...)
	broker, err := checkURL(c.URL)
	if err != nil {
		return c, "", err
	}
	if strings.TrimSpace(c.ClientID) == "" {
		return c, "", errors.New("mqttconsumer: Config.ClientID is empty: name the persistent session (the same across restarts, one per instance)")
	}
	if len(c.Topics) == 0 {
		return c, "", errors.New("mqttconsumer: no Config.Topics: name the topic filters to subscribe to")
	}
	for _, t := range c.Topics {
		if t == "" || strings.ContainsRune(t, 0) {
			return c, "", fmt.Errorf("mqttconsumer: invalid topic filter %q", t)
		}
	}
	for _, err := range []error{
		confval.PositiveOr("mqttconsumer", "ConnectTimeout", &c.ConnectTimeout, DefaultConnectTimeout),
		confval.PositiveOr("mqttconsumer", "MaxReconnectInterval", &c.MaxReconnectInterval, DefaultMaxReconnectInterval),
		confval.PositiveOr("mqttconsumer", "ShutdownGrace", &c.ShutdownGrace, DefaultShutdownGrace),
	} {
		if err != nil {
			return c, "", err
		}
	}
	return c, broker, nil
}

// checkURL validates the broker URL and returns it in Paho's form.
func checkURL(raw string) (string, error) {
	if strings.TrimSpace(raw) == "" {
		return "", errors.New("mqttconsumer: Config.URL is empty; want mqtt://host:port or mqtts://host:port")
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "", errors.New("mqttconsumer: invalid Config.URL (not shown, it may hold a password): want mqtt://host:port or mqtts://host:port")
	}
	switch u.Scheme {
	case "mqtt", "tcp":
		u.Scheme = "tcp"
	case "mqtts", "ssl", "tls":
		u.Scheme = "ssl"
	default:
		return "", fmt.Errorf("mqttconsumer: invalid Config.URL %s: scheme %q is not supported; use mqtt:// or mqtts://", u.Redacted(), u.Scheme)
	}
	return u.String(), nil
}

// Start connects with the persistent session, subscribes, and handles the
// messages in the background; it returns once connected. It fails when the
// broker cannot be reached or refuses the subscription, or if the
// Consumer was already started.
func (c *Consumer[TTx]) Start(ctx context.Context) error {
	c.mu.Lock()
	if c.started {
		c.mu.Unlock()
		return errors.New("mqttconsumer: already started")
	}
	if err := c.eng.Start(ctx); err != nil {
		c.mu.Unlock()
		return fmt.Errorf("mqttconsumer: %w", err)
	}
	c.ctx, c.stop = context.WithCancel(context.WithoutCancel(ctx))
	c.conn = make(chan struct{})
	c.first = make(chan error, 1)
	o := c.options().SetDefaultPublishHandler(c.receive).
		SetOnConnectHandler(c.connected).
		SetConnectionLostHandler(c.lost)
	client := mqtt.NewClient(o)
	c.client = client
	c.started = true
	first := c.first
	c.mu.Unlock() // the handlers Paho calls while connecting take the lock
	tok := client.Connect()
	var err error
	if tok.WaitTimeout(c.cfg.ConnectTimeout) && tok.Error() == nil {
		select {
		case err = <-first:
		case <-time.After(c.cfg.ConnectTimeout):
			err = errors.New("the subscription was not confirmed in time")
		}
		if err == nil {
			return nil
		}
	} else {
		err = tokenErr(tok)
	}
	c.mu.Lock()
	c.stopped = true
	c.stop()
	c.mu.Unlock()
	disconnect(client)
	_ = c.eng.Stop(context.Background())
	return fmt.Errorf("mqttconsumer: connect to %s as %q: %w", c.broker, c.cfg.ClientID, err)
}

// options are the Paho options of the consumer's client: the persistent
// session, manual acknowledgements, arrival order, reconnection.
func (c *Consumer[TTx]) options() *mqtt.ClientOptions {
	o := mqtt.NewClientOptions().AddBroker(c.broker).
		SetConnectTimeout(c.cfg.ConnectTimeout).
		SetAutoReconnect(true).SetMaxReconnectInterval(c.cfg.MaxReconnectInterval)
	if c.cfg.Options != nil {
		c.cfg.Options(o)
	}
	return o.SetClientID(c.cfg.ClientID).SetCleanSession(false).SetAutoAckDisabled(true).
		SetOrderMatters(true).SetResumeSubs(false)
}

// connected subscribes (again) on every connection. The session keeps the
// subscriptions; subscribing again is harmless and covers a session the
// broker expired.
func (c *Consumer[TTx]) connected(client mqtt.Client) {
	c.mu.Lock()
	select {
	case <-c.conn: // the previous connection was lost: a fresh signal
		c.conn = make(chan struct{})
	default:
	}
	c.mu.Unlock()
	err := subscribe(client, c.cfg.Topics, c.cfg.ConnectTimeout)
	if err != nil {
		c.log.Error("mqttconsumer: subscribing failed", "topics", c.cfg.Topics, "err", err)
	}
	select {
	case c.first <- err:
	default:
	}
}

// subscribe subscribes client to topics with QoS 1 and waits for the
// broker's answer.
func subscribe(client mqtt.Client, topics []string, timeout time.Duration) error {
	filters := make(map[string]byte, len(topics))
	for _, t := range topics {
		filters[t] = 1
	}
	tok := client.SubscribeMultiple(filters, nil)
	if !tok.WaitTimeout(timeout) {
		return fmt.Errorf("the subscription to %v was not confirmed within %v", topics, timeout)
	}
	if err := tok.Error(); err != nil {
		return fmt.Errorf("subscribe to %v: %w", topics, err)
	}
	if st, ok := tok.(*mqtt.SubscribeToken); ok {
		for t, code := range st.Result() {
			if code == 0x80 {
				return fmt.Errorf("the broker refused the subscription to %q (check its ACL)", t)
			}
		}
	}
	return nil
}

// CreateSession creates the persistent session of cfg.ClientID with its
// subscriptions and disconnects, so that the broker keeps the messages
// published from then on until the consumer first starts. Run it at
// deployment, before the relay publishes: MQTT keeps messages only for
// subscriptions that exist. Start does the same on its first connect.
func CreateSession(ctx context.Context, cfg *Config) error {
	nc, broker, err := normalize(cfg)
	if err != nil {
		return err
	}
	c := &Consumer[struct{}]{cfg: nc, broker: broker}
	o := c.options().SetDefaultPublishHandler(func(mqtt.Client, mqtt.Message) {}) // nothing is acknowledged
	client := mqtt.NewClient(o)
	timeout := c.cfg.ConnectTimeout
	if d, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(d))
	}
	tok := client.Connect()
	if !tok.WaitTimeout(timeout) || tok.Error() != nil {
		disconnect(client)
		return fmt.Errorf("mqttconsumer: connect to %s as %q: %w", c.broker, c.cfg.ClientID, tokenErr(tok))
	}
	defer disconnect(client)
	if err := subscribe(client, c.cfg.Topics, timeout); err != nil {
		return fmt.Errorf("mqttconsumer: %w", err)
	}
	return nil
}

func tokenErr(tok mqtt.Token) error {
	if err := tok.Error(); err != nil {
		return err
	}
	return errors.New("timed out")
}

// lost abandons the messages of the lost connection.
func (c *Consumer[TTx]) lost(_ mqtt.Client, err error) {
	c.mu.Lock()
	select {
	case <-c.conn:
	default:
		close(c.conn)
	}
	c.mu.Unlock()
	c.log.Warn("mqttconsumer: connection lost; reconnecting (the broker sends the unacknowledged messages again)", "err", err)
}

// receive submits one message; Paho calls it in arrival order.
func (c *Consumer[TTx]) receive(_ mqtt.Client, m mqtt.Message) {
	c.mu.Lock()
	ctx, gone := c.ctx, c.conn
	c.mu.Unlock()
	if ctx.Err() != nil {
		return // stopping: it stays unacknowledged in the session
	}
	d := &delivery{m: m, msg: message(m), gone: gone}
	d.key = d.msg.Destination + "\x00" + d.msg.AggregateID
	if err := c.eng.Submit(ctx, d); err != nil {
		return // stopping
	}
}

// message reads mqttsink's envelope; anything else becomes a message
// without an event id, whose payload is what was received.
func message(m mqtt.Message) inbox.Message {
	msg := envelope.Message(m.Topic(), m.Payload())
	msg.System = "mqtt"
	return msg
}

// Stop stops taking messages, lets the handlers in flight finish and
// acknowledge, then disconnects, and returns when every goroutine has
// exited. The messages not finished stay unacknowledged in the session.
// If ctx ends first, the handlers in flight are cancelled. Stop is
// idempotent and safe when Start never ran.
func (c *Consumer[TTx]) Stop(ctx context.Context) error {
	c.mu.Lock()
	if !c.started || c.stopped {
		c.mu.Unlock()
		return nil
	}
	c.stopped = true
	c.stop()
	client := c.client
	c.mu.Unlock()
	err := c.eng.Stop(ctx)
	disconnect(client)
	return err
}

// disconnect disconnects client, letting the last acknowledgements out,
// and waits (for up to 5s) until Paho finished: its Disconnect returns
// after the quiesce time while its own goroutine may still be closing the
// connection.
func disconnect(client mqtt.Client) {
	client.Disconnect(250)
	deadline := time.Now().Add(5 * time.Second)
	for client.IsConnected() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
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

// delivery adapts an MQTT message to consumer.Delivery.
type delivery struct {
	m    mqtt.Message
	msg  inbox.Message
	key  string
	gone <-chan struct{}
}

func (d *delivery) Message() inbox.Message { return d.msg }

func (d *delivery) Key() string { return d.key }

// Attempts is 0: MQTT 3.1.1 tells only that a message was sent before
// (DUP), not how often.
func (d *delivery) Attempts() int { return 0 }

// Ack sends the PUBACK on the connection the message came on; Paho drops
// it if that connection is gone (the broker then sends the message again).
func (d *delivery) Ack(context.Context) error {
	select {
	case <-d.gone:
		return errors.New("the connection the message came on is gone; the broker sends it again after the reconnect")
	default:
	}
	d.m.Ack()
	return nil
}

// Release does nothing: MQTT cannot hand a message back; it stays
// unacknowledged in the session.
func (d *delivery) Release(time.Duration) error { return nil }

func (d *delivery) KeepAlive() error { return nil }

// Abandoned is closed when the connection the message came on is lost.
func (d *delivery) Abandoned() <-chan struct{} { return d.gone }
