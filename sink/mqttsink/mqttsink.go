package mqttsink

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/outboxkit/outbox/internal/confval"
	"github.com/outboxkit/outbox/sink"
)

// Defaults applied by New and Dial to zero Config fields.
const (
	// DefaultQoS is the default quality of service.
	DefaultQoS byte = 1
	// DefaultMaxInflight is the default bound on unacknowledged publishes of
	// one Publish call.
	DefaultMaxInflight = 100
	// DefaultAckTimeout is the default time to wait for one acknowledgement.
	DefaultAckTimeout = 10 * time.Second
	// DefaultConnectTimeout is the default time one connection attempt
	// (TCP, TLS and the MQTT handshake) may take.
	DefaultConnectTimeout = 10 * time.Second
	// DefaultKeepAlive is the default MQTT keep-alive interval.
	DefaultKeepAlive = 30 * time.Second
	// DefaultMaxReconnectInterval is the default longest wait between two
	// reconnection attempts.
	DefaultMaxReconnectInterval = 10 * time.Second
	// MaxMessageSize is the largest PUBLISH packet MQTT can express (its
	// "remaining length" limit) and the default of Config.MaxMessageSize.
	MaxMessageSize = 268_435_455
)

// maxTopicLen is the longest topic MQTT can encode (a 16-bit length).
const maxTopicLen = 65535

// ErrClosed is returned for every message published after Close.
var ErrClosed = errors.New("mqttsink: sink is closed")

// ErrNotConnected is the error (marked sink.Unavailable) for messages that
// were not sent because the sink has no connection to the broker.
var ErrNotConnected = errors.New("mqttsink: not connected to the MQTT broker")

// Config configures a Sink. The zero value (or a nil *Config) is usable: every
// zero field takes its documented default. New and Dial do not modify it.
type Config struct {
	// QoS is the quality of service of every publish: 1 (at least once) or 2
	// (exactly once between the sink and the broker). Default 1. QoS 0 is
	// not supported: it has no acknowledgement, so the sink could not know
	// whether a message arrived.
	QoS byte
	// TopicReplacer turns a Destination into a topic. Default
	// strings.NewReplacer(".", "/"); use strings.NewReplacer() to publish to
	// the Destination unchanged.
	TopicReplacer *strings.Replacer
	// RawPayload publishes Message.Value as is instead of the JSON envelope.
	// MQTT 3.1.1 has no headers, so then only the payload travels: the event
	// id, the key and the headers are lost. Default false (envelope).
	RawPayload bool
	// MaxInflight is the most publishes one Publish call keeps waiting for
	// their acknowledgement. Default 100.
	MaxInflight int
	// AckTimeout is how long Publish waits for the acknowledgement of one
	// message before it reports a sink.Unavailable error for it. It is also
	// Paho's write timeout: the longest handing one packet to the connection
	// and writing it may take (raise it for very large messages on slow
	// links). Default 10s.
	AckTimeout time.Duration
	// MaxMessageSize bounds the size of a PUBLISH packet (topic plus payload
	// plus 4 bytes); larger messages fail permanently without being sent.
	// Set it to the broker's limit (Mosquitto: max_packet_size or
	// message_size_limit), since brokers either drop an oversized message
	// silently or close the connection. Default and maximum 268435455, the
	// protocol's limit.
	MaxMessageSize int
	// ClientID is the MQTT client identifier Dial connects with. It must be
	// unique among the broker's clients: a second client with the same id
	// takes the session over and disconnects the first. Default "outbox"
	// followed by 16 random hex digits (valid for every 3.1.1 broker).
	ClientID string
	// TLSConfig is used for mqtts:// URLs. Default: the system's roots and
	// the URL's host name.
	TLSConfig *tls.Config
	// ConnectTimeout bounds one connection attempt: TCP connect, TLS and MQTT
	// handshake. Default 10s.
	ConnectTimeout time.Duration
	// KeepAlive is the MQTT keep-alive interval; a connection that stays
	// silent for longer (plus a ping timeout of at most 10s) is considered
	// lost. Default 30s.
	KeepAlive time.Duration
	// MaxReconnectInterval is the longest wait between two reconnection
	// attempts after the connection was lost; the wait starts at 100ms and
	// doubles. Default 10s.
	MaxReconnectInterval time.Duration
	// Logger receives connection events. Default: warnings and errors as
	// text on standard error.
	Logger *slog.Logger
}

// normalize returns a copy of cfg with defaults applied, or an error naming
// the invalid field.
func normalize(cfg *Config) (Config, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	switch c.QoS {
	case 0:
		c.QoS = DefaultQoS
	case 1, 2:
	default:
		return c, fmt.Errorf("mqttsink: invalid Config.QoS %d: must be 1 or 2 (QoS 0 has no acknowledgement and is not supported)", c.QoS)
	}
	if c.TopicReplacer == nil {
		c.TopicReplacer = strings.NewReplacer(".", "/")
	}
	if err := confval.PositiveOr("mqttsink", "MaxInflight", &c.MaxInflight, DefaultMaxInflight); err != nil {
		return c, err
	}
	if c.MaxInflight > 65535 {
		return c, fmt.Errorf("mqttsink: invalid Config.MaxInflight %d: MQTT allows at most 65535 unacknowledged publishes", c.MaxInflight)
	}
	if err := confval.PositiveOr("mqttsink", "MaxMessageSize", &c.MaxMessageSize, MaxMessageSize); err != nil {
		return c, err
	}
	if c.MaxMessageSize > MaxMessageSize {
		return c, fmt.Errorf("mqttsink: invalid Config.MaxMessageSize %d: MQTT packets cannot exceed %d bytes", c.MaxMessageSize, MaxMessageSize)
	}
	for _, d := range []struct {
		p    *time.Duration
		def  time.Duration
		name string
	}{
		{&c.AckTimeout, DefaultAckTimeout, "AckTimeout"},
		{&c.ConnectTimeout, DefaultConnectTimeout, "ConnectTimeout"},
		{&c.KeepAlive, DefaultKeepAlive, "KeepAlive"},
		{&c.MaxReconnectInterval, DefaultMaxReconnectInterval, "MaxReconnectInterval"},
	} {
		if err := confval.PositiveOr("mqttsink", d.name, d.p, d.def); err != nil {
			return c, err
		}
	}
	if c.KeepAlive < time.Second {
		return c, fmt.Errorf("mqttsink: invalid Config.KeepAlive %v: MQTT counts it in whole seconds; use at least 1s", c.KeepAlive)
	}
	if c.ClientID == "" {
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		c.ClientID = "outbox" + hex.EncodeToString(b)
	} else if !utf8.ValidString(c.ClientID) || len(c.ClientID) > maxTopicLen || strings.ContainsRune(c.ClientID, 0) {
		return c, fmt.Errorf("mqttsink: invalid Config.ClientID %q: must be valid UTF-8 without NUL, at most 65535 bytes", c.ClientID)
	}
	c.Logger = confval.Logger(c.Logger)
	return c, nil
}

// conn is one connected Paho client of a sink made by Dial.
type conn struct {
	c    mqtt.Client
	lost chan struct{} // closed when the connection is lost
	once sync.Once
	err  error // why the connection was lost; set before lost is closed
}

func (cn *conn) markLost(err error) {
	cn.once.Do(func() {
		if err == nil {
			err = errors.New("connection closed")
		}
		cn.err = err
		close(cn.lost)
	})
}

// Sink publishes messages to an MQTT broker. It is safe for concurrent use;
// order is kept within one Publish call, not across concurrent calls.
type Sink struct {
	cfg Config
	log *slog.Logger

	// borrowed is the caller's client (New); nil for Dial.
	borrowed mqtt.Client

	// Dial only:
	broker *url.URL // without user info
	user   *url.Userinfo
	shown  string // the redacted URL, for messages
	mu     sync.Mutex
	cur    *conn // nil while reconnecting
	down   error // why cur is nil
	stop   chan struct{}
	done   chan struct{} // closed when the reconnect loop ended

	// senders are the goroutines calling the client's Publish.
	senders   sync.WaitGroup
	closed    atomic.Bool // set under mu
	closeOnce sync.Once
}

var _ sink.Sink = (*Sink)(nil)

// New returns a Sink that publishes through client, which the caller
// connects, reconnects and disconnects; New does no I/O and Close leaves the
// client alone. Config.ClientID, TLSConfig, ConnectTimeout, KeepAlive and
// MaxReconnectInterval do not apply.
//
// Give the client a clean session and no automatic reconnect (or accept
// duplicates): with Paho's AutoReconnect, publishes in flight when the
// connection dropped stay in its store and are resent after reconnecting,
// although Publish already reported them as failed (it notices a lost
// connection within about 100ms) and the relay publishes them again.
func New(client mqtt.Client, cfg *Config) (*Sink, error) {
	if client == nil {
		return nil, errors.New("mqttsink: New: nil mqtt.Client")
	}
	c, err := normalize(cfg)
	if err != nil {
		return nil, err
	}
	return &Sink{cfg: c, log: c.Logger, borrowed: client}, nil
}

// Dial connects to the MQTT broker at rawURL and returns a Sink that owns the
// connection: it reconnects after losing it (see the package documentation)
// and Close disconnects it. rawURL is mqtt://host:port (tcp:// also works;
// port 1883 by default) or mqtts://host:port for TLS (tls:// and ssl:// also
// work; port 8883 by default), with an optional user:password@ for the
// broker's authentication. Dial fails when the first connection attempt
// fails or ctx ends first.
func Dial(ctx context.Context, rawURL string, cfg *Config) (*Sink, error) {
	c, err := normalize(cfg)
	if err != nil {
		return nil, err
	}
	broker, user, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	shown := redacted(broker, user)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("mqttsink: cannot connect to %s: %w", shown, err)
	}
	first := c.ConnectTimeout
	if dl, ok := ctx.Deadline(); ok {
		first = max(min(first, time.Until(dl)), time.Millisecond)
	}
	s := &Sink{
		cfg: c, log: c.Logger.With("broker", shown),
		broker: broker, user: user, shown: shown,
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	cn, err := s.connect(ctx, first)
	if err != nil {
		return nil, fmt.Errorf("mqttsink: cannot connect to %s: %w%s", shown, err, connectHint(err))
	}
	s.cur = cn
	s.log.Info("mqttsink: connected to MQTT broker", "client_id", c.ClientID)
	go s.reconnectLoop(cn)
	return s, nil
}

// parseURL validates a broker URL and returns it for Paho, without user
// info, and the user info.
func parseURL(rawURL string) (*url.URL, *url.Userinfo, error) {
	if strings.TrimSpace(rawURL) == "" {
		return nil, nil, errors.New("mqttsink: empty MQTT URL; want mqtt://host:port or mqtts://host:port")
	}
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" || u.Opaque != "" {
		shown := rawURL
		if err == nil {
			shown = u.Redacted()
		} else if i := strings.LastIndex(rawURL, "@"); i >= 0 {
			shown = "…@" + rawURL[i+1:]
		}
		return nil, nil, fmt.Errorf("mqttsink: invalid MQTT URL %q: want mqtt://host:port or mqtts://host:port", shown)
	}
	port := ""
	switch u.Scheme {
	case "mqtt", "tcp":
		u.Scheme, port = "mqtt", "1883"
	case "mqtts", "tls", "ssl":
		u.Scheme, port = "mqtts", "8883"
	default:
		return nil, nil, fmt.Errorf("mqttsink: invalid MQTT URL %s: scheme %q is not supported; use mqtt:// or mqtts://", u.Redacted(), u.Scheme)
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return nil, nil, fmt.Errorf("mqttsink: invalid MQTT URL %s: unexpected path, query or fragment; want %s://host:port", u.Redacted(), u.Scheme)
	}
	if u.Port() == "" {
		u.Host = net.JoinHostPort(u.Hostname(), port)
	}
	user := u.User
	u.User, u.Path = nil, ""
	return u, user, nil
}

// redacted returns the broker URL with a password replaced by "xxxxx".
func redacted(broker *url.URL, user *url.Userinfo) string {
	u := *broker
	u.User = user
	return u.Redacted()
}

// connectHint explains network errors.
func connectHint(err error) string {
	var ne net.Error
	if errors.As(err, &ne) || strings.Contains(err.Error(), "network Error") {
		return " (is the broker running and reachable?)"
	}
	return ""
}

// options returns fresh Paho options for one connection.
func (s *Sink) options(cn *conn, connectTimeout time.Duration) *mqtt.ClientOptions {
	o := mqtt.NewClientOptions()
	o.AddBroker(s.broker.String())
	o.SetClientID(s.cfg.ClientID)
	if s.user != nil {
		o.SetUsername(s.user.Username())
		if p, ok := s.user.Password(); ok {
			o.SetPassword(p)
		}
	}
	if s.cfg.TLSConfig != nil {
		o.SetTLSConfig(s.cfg.TLSConfig.Clone())
	}
	o.SetProtocolVersion(4) // 3.1.1, no fall-back to 3.1
	// No session state survives a connection: the outbox republishes what
	// was not acknowledged.
	o.SetCleanSession(true)
	o.SetAutoReconnect(false)
	o.SetConnectRetry(false)
	o.SetResumeSubs(false)
	o.SetStore(mqtt.NewMemoryStore())
	o.SetKeepAlive(s.cfg.KeepAlive)
	o.SetPingTimeout(min(10*time.Second, s.cfg.KeepAlive))
	o.SetConnectTimeout(connectTimeout)
	o.SetDialer(&net.Dialer{Timeout: connectTimeout, KeepAlive: 30 * time.Second})
	o.SetWriteTimeout(s.cfg.AckTimeout)
	o.SetConnectionLostHandler(func(_ mqtt.Client, err error) { cn.markLost(err) })
	return o
}

// connect makes one connection attempt with a fresh client.
func (s *Sink) connect(ctx context.Context, timeout time.Duration) (*conn, error) {
	cn := &conn{lost: make(chan struct{})}
	c := mqtt.NewClient(s.options(cn, timeout))
	cn.c = c
	tok := c.Connect()
	select {
	case <-tok.Done():
	case <-ctx.Done():
		// Paho cannot abort a connection attempt; it ends within the
		// connect timeout. Disconnect the client if it succeeded after all.
		go func() {
			<-tok.Done()
			if tok.Error() == nil {
				c.Disconnect(0)
			}
		}()
		return nil, ctx.Err()
	}
	if err := tok.Error(); err != nil {
		return nil, err
	}
	return cn, nil
}

// reconnectLoop waits for the connection cn to be lost, then reconnects,
// until Close.
func (s *Sink) reconnectLoop(cn *conn) {
	defer close(s.done)
	for {
		select {
		case <-s.stop:
			// Give an acknowledgement or the DISCONNECT packet a moment.
			cn.c.Disconnect(250)
			return
		case <-cn.lost:
		}
		s.mu.Lock()
		s.cur, s.down = nil, cn.err
		s.mu.Unlock()
		s.log.Warn("mqttsink: lost the connection to the MQTT broker; reconnecting", "err", cn.err)

		wait := 100 * time.Millisecond
		timer := time.NewTimer(0) // first attempt at once
		for {
			select {
			case <-s.stop:
				timer.Stop()
				return
			case <-timer.C:
			}
			// Not cancelled by Close, so that no client outlives the sink:
			// an attempt ends within Config.ConnectTimeout.
			next, err := s.connect(context.Background(), s.cfg.ConnectTimeout)
			if err == nil {
				cn = next
				break
			}
			s.mu.Lock()
			s.down = err
			s.mu.Unlock()
			s.log.Debug("mqttsink: reconnection attempt failed", "err", err, "retry_in", wait)
			timer.Reset(wait)
			wait = min(2*wait, s.cfg.MaxReconnectInterval)
		}
		s.mu.Lock()
		s.cur, s.down = cn, nil
		s.mu.Unlock()
		s.log.Info("mqttsink: reconnected to the MQTT broker")
	}
}

// client returns the client to publish with, the channel that reports its
// loss (nil for a borrowed client) and an error when there is none.
func (s *Sink) client() (mqtt.Client, <-chan struct{}, error) {
	if s.borrowed != nil {
		if !s.borrowed.IsConnectionOpen() {
			return nil, nil, ErrNotConnected
		}
		return s.borrowed, nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	down := s.down
	if s.cur != nil {
		select {
		case <-s.cur.lost:
			down = s.cur.err
		default:
			return s.cur.c, s.cur.lost, nil
		}
	}
	return nil, nil, fmt.Errorf("%w at %s (reconnecting; last error: %v)", ErrNotConnected, s.shown, down)
}

// pending is a publish waiting for its acknowledgement.
type pending struct {
	i        int
	topic    string
	tok      mqtt.Token
	deadline time.Time
}

// sender calls the client's Publish for one Publish call. Paho's Publish
// blocks while the packet is handed to the connection, for up to its write
// timeout when the connection is dropped meanwhile; the sender lets Publish
// stop waiting for it then. Close waits for senders that are still busy.
type sender struct {
	jobs chan job
	toks chan mqtt.Token
	quit chan struct{}
}

type job struct {
	topic   string
	payload []byte
}

// startSender starts a sender on c, or returns false once the sink is
// closed.
func (s *Sink) startSender(c mqtt.Client) (*sender, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return nil, false
	}
	sd := &sender{jobs: make(chan job), toks: make(chan mqtt.Token), quit: make(chan struct{})}
	s.senders.Go(func() {
		for {
			select {
			case j := <-sd.jobs:
				tok := c.Publish(j.topic, s.cfg.QoS, false, j.payload)
				select {
				case sd.toks <- tok:
				case <-sd.quit:
					return
				}
			case <-sd.quit:
				return
			}
		}
	})
	return sd, true
}

// Publish publishes msgs and returns one result per message, in order: nil
// once the broker acknowledged the message. Messages are sent in slice
// order, at most Config.MaxInflight of them unacknowledged at a time; after
// a failure the rest is not sent. When ctx is done, messages without a
// result get ctx.Err(). See the package documentation for which errors are
// permanent.
func (s *Sink) Publish(ctx context.Context, msgs []sink.Message) []error {
	errs := make([]error, len(msgs))
	if len(msgs) == 0 {
		return errs
	}
	if s.closed.Load() {
		return sink.Results(len(msgs), ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return sink.Results(len(msgs), err)
	}
	c, lost, err := s.client()
	if err != nil {
		for i := range msgs {
			errs[i] = s.unsent(&msgs[i], err)
		}
		return errs
	}
	sd, ok := s.startSender(c)
	if !ok {
		return sink.Results(len(msgs), ErrClosed)
	}
	defer close(sd.quit)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	w := &waiter{s: s, c: c, msgs: msgs, errs: errs, ctx: ctx, timer: timer, lost: lost}
	if lost == nil {
		// A borrowed client gives no notice of a lost connection: look.
		w.tick = time.NewTicker(100 * time.Millisecond)
		defer w.tick.Stop()
	}

	window := make([]pending, min(len(msgs), s.cfg.MaxInflight))
	head, n := 0, 0
	popWait := func() bool {
		ok := w.wait(window[head])
		window[head] = pending{}
		head = (head + 1) % len(window)
		n--
		return ok
	}
	next := 0
	for ; next < len(msgs); next++ {
		if n == len(window) && !popWait() {
			break
		}
		if err := ctx.Err(); err != nil {
			w.stop = err
			break
		}
		m := &msgs[next]
		if w.halt != nil {
			errs[next] = s.unsent(m, w.halt)
			continue
		}
		topic, payload, err := s.encode(m)
		if err != nil {
			errs[next] = err
			continue
		}
		tok := w.send(sd, job{topic: topic, payload: payload})
		if tok == nil {
			break // w.stop is set; abandon gives message next its result
		}
		window[(head+n)%len(window)] = pending{i: next, topic: topic, tok: tok, deadline: time.Now().Add(s.cfg.AckTimeout)}
		n++
	}
	if w.stop == nil {
		for n > 0 && popWait() {
		}
	}
	if w.stop != nil {
		w.abandon(window, head, n, next)
	}
	return errs
}

// unsent is the result of a message that was not sent because of err.
func (s *Sink) unsent(m *sink.Message, err error) error {
	if errors.Is(err, ErrNotConnected) {
		return sink.Unavailable(err)
	}
	topic := s.cfg.TopicReplacer.Replace(m.Destination)
	return sink.Unavailable(fmt.Errorf("mqttsink: publish to topic %q: not sent after an earlier message of the batch failed: %w", topic, err))
}

// waiter waits for the acknowledgements of one Publish call.
type waiter struct {
	s     *Sink
	c     mqtt.Client
	msgs  []sink.Message
	errs  []error
	ctx   context.Context
	timer *time.Timer
	lost  <-chan struct{}
	tick  *time.Ticker // for a borrowed client; nil otherwise
	// halt is why the rest of the batch is not sent; the messages already
	// sent are still waited for.
	halt error
	// stop is why waiting stopped: ctx.Err() or a lost connection. Every
	// message without a result gets it.
	stop error
}

// send hands j to the sender and returns its token, or nil when waiting
// stopped first (w.stop says why).
func (w *waiter) send(sd *sender, j job) mqtt.Token {
	var tick <-chan time.Time
	if w.tick != nil {
		tick = w.tick.C
	}
	sent := false
	for {
		var jobs chan job
		if !sent {
			jobs = sd.jobs
		}
		select {
		case jobs <- j:
			sent = true
			continue
		case tok := <-sd.toks:
			return tok
		case <-w.ctx.Done():
			w.stop = w.ctx.Err()
		case <-w.lost:
			w.stop = w.lostErr()
		case <-tick:
			if w.c.IsConnectionOpen() {
				continue
			}
			w.stop = w.lostErr()
		}
		return nil
	}
}

// wait stores the result of p and reports whether Publish may go on waiting.
func (w *waiter) wait(p pending) bool {
	var tick <-chan time.Time
	if w.tick != nil {
		tick = w.tick.C
	}
	w.timer.Reset(time.Until(p.deadline))
	for {
		select {
		case <-p.tok.Done():
			w.result(p)
			return true
		case <-w.timer.C:
			if w.poll(p) {
				return true
			}
			err := fmt.Errorf("no acknowledgement within %v (Config.AckTimeout)", w.s.cfg.AckTimeout)
			w.errs[p.i] = sink.Unavailable(fmt.Errorf("mqttsink: publish to topic %q: %w", p.topic, err))
			if w.halt == nil {
				w.halt = err
			}
			return true
		case <-w.ctx.Done():
			w.stop = w.ctx.Err()
		case <-w.lost:
			w.stop = w.lostErr()
		case <-tick:
			if w.c.IsConnectionOpen() {
				continue
			}
			w.stop = w.lostErr()
		}
		if !w.poll(p) {
			w.errs[p.i] = w.stopErr(p)
		}
		return false
	}
}

// result stores the result of the completed publish p.
func (w *waiter) result(p pending) {
	err := p.tok.Error()
	if err == nil {
		return
	}
	// Every token error says the broker did not take the message (the
	// connection was lost or is not there), not that the message is wrong.
	w.errs[p.i] = sink.Unavailable(fmt.Errorf("mqttsink: publish to topic %q: %w", p.topic, err))
	if w.halt == nil {
		w.halt = err
	}
}

// poll stores the result of p if it has one already.
func (w *waiter) poll(p pending) bool {
	select {
	case <-p.tok.Done():
		w.result(p)
		return true
	default:
		return false
	}
}

func (w *waiter) lostErr() error {
	return errors.New("connection to the broker lost before the acknowledgement arrived")
}

// stopErr is the result of a message without a result once waiting stopped.
func (w *waiter) stopErr(p pending) error {
	if errors.Is(w.stop, context.Canceled) || errors.Is(w.stop, context.DeadlineExceeded) {
		return w.stop
	}
	return sink.Unavailable(fmt.Errorf("mqttsink: publish to topic %q: %w", p.topic, w.stop))
}

// abandon gives every message without a result the stop error, keeping
// results that already arrived.
func (w *waiter) abandon(window []pending, head, n, next int) {
	for k := range n {
		p := window[(head+k)%len(window)]
		if !w.poll(p) {
			w.errs[p.i] = w.stopErr(p)
		}
	}
	for i := next; i < len(w.msgs); i++ {
		if w.errs[i] == nil {
			w.errs[i] = w.stopErr(pending{i: i, topic: w.s.cfg.TopicReplacer.Replace(w.msgs[i].Destination)})
		}
	}
}

// encode returns the topic and payload of m, or a permanent error.
func (s *Sink) encode(m *sink.Message) (string, []byte, error) {
	topic := s.cfg.TopicReplacer.Replace(m.Destination)
	if err := CheckTopic(topic); err != nil {
		return "", nil, sink.Permanent(fmt.Errorf("mqttsink: publish to topic %q (destination %q): invalid topic: %w", topic, m.Destination, err))
	}
	payload := m.Value
	if !s.cfg.RawPayload {
		b, err := sink.Envelope(m)
		if err != nil {
			return "", nil, sink.Permanent(fmt.Errorf("mqttsink: publish to topic %q: encode envelope: %w", topic, err))
		}
		payload = b
	}
	if payload == nil {
		payload = []byte{}
	}
	// PUBLISH: 2-byte topic length, topic, 2-byte packet id, payload.
	if size := 2 + len(topic) + 2 + len(payload); size > s.cfg.MaxMessageSize {
		what := "message"
		if !s.cfg.RawPayload {
			what = "message (in its JSON envelope)"
		}
		return "", nil, sink.Permanent(fmt.Errorf("mqttsink: publish to topic %q: %s of %d bytes exceeds Config.MaxMessageSize of %d bytes", topic, what, size, s.cfg.MaxMessageSize))
	}
	return topic, payload, nil
}

// Envelope returns the JSON envelope the sink publishes for m unless
// Config.RawPayload is set: sink.Envelope.
func Envelope(m *sink.Message) ([]byte, error) { return sink.Envelope(m) }

// CheckTopic reports why topic cannot be published to, or nil. A topic must
// be 1 to 65535 bytes of UTF-8 without the wildcards '+' and '#', NUL,
// control characters (U+0001–U+001F, U+007F–U+009F) or non-characters: a
// broker closes the connection of a client that publishes to such a topic.
func CheckTopic(topic string) error {
	if topic == "" {
		return errors.New("topic is empty")
	}
	if len(topic) > maxTopicLen {
		return fmt.Errorf("topic is %d bytes long, more than %d", len(topic), maxTopicLen)
	}
	if !utf8.ValidString(topic) {
		return errors.New("topic is not valid UTF-8")
	}
	for _, r := range topic {
		switch {
		case r == '+' || r == '#':
			return fmt.Errorf("topic contains the wildcard %q; messages are published to literal topics", r)
		case r == 0:
			return errors.New("topic contains NUL")
		case r < 0x20 || (r >= 0x7f && r <= 0x9f):
			return fmt.Errorf("topic contains the control character %U", r)
		case (r >= 0xfdd0 && r <= 0xfdef) || r&0xfffe == 0xfffe:
			return fmt.Errorf("topic contains the non-character %U", r)
		}
	}
	return nil
}

// Close stops the sink: later Publish calls fail with ErrClosed. A sink made
// by Dial stops reconnecting and disconnects (publishes still waiting fail);
// a sink made by New leaves the caller's client connected. Close returns
// once no goroutine of the sink is left, which may take up to
// Config.AckTimeout (a client given to New: its write timeout) when a
// packet was being handed to a connection that just dropped. Close is
// idempotent and returns nil.
func (s *Sink) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed.Store(true)
		s.mu.Unlock()
		if s.borrowed == nil {
			close(s.stop)
			<-s.done
			s.log.Info("mqttsink: disconnected from the MQTT broker")
		}
		s.senders.Wait()
	})
	return nil
}

// System names the broker as OpenTelemetry's messaging.system attribute
// does: "mqtt".
func (s *Sink) System() string { return "mqtt" }
