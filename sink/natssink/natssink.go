package natssink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox/internal/confval"
	"github.com/outboxkit/outbox/sink"
)

// Defaults applied by New and Dial to zero Config fields.
const (
	// DefaultStream is the default stream name.
	DefaultStream = "OUTBOX"
	// KeyHeader carries Message.Key, since NATS messages have no key.
	KeyHeader = "key"
	// DefaultSubject is the default (and only) subject of the default stream.
	DefaultSubject = "outbox.event.>"
	// DefaultMaxPending is the default bound on unacknowledged publishes.
	DefaultMaxPending = 4096
	// DefaultAckTimeout is the default time to wait for one PubAck.
	DefaultAckTimeout = 5 * time.Second
)

// maxSubjectLen bounds the subject length. A NATS server closes the
// connection of a client that sends a protocol line longer than its
// max_control_line (4 KiB by default), which would fail every message in
// flight, so longer subjects are rejected before sending.
const maxSubjectLen = 3840

// reconnectWait is how long a lost connection of Dial's waits between
// tries of the server list: each try is one connection attempt, which a
// server that is down refuses at once.
const reconnectWait = 250 * time.Millisecond

// ErrClosed is returned for every message published after Close.
var ErrClosed = errors.New("natssink: sink is closed")

// Config configures a Sink. The zero value (or a nil *Config) is usable: every
// zero field takes its documented default. New and Dial do not modify it.
type Config struct {
	// Stream is the name of the JetStream stream that EnsureStream checks or
	// creates. Default "OUTBOX".
	Stream string
	// Subjects are the subjects of the stream EnsureStream creates; wildcards
	// are allowed. Every message Destination must match a subject of some
	// stream. Default ["outbox.event.>"].
	Subjects []string
	// NoCreateStream stops EnsureStream from creating a missing stream; it
	// then returns an error instead. The zero value creates the stream.
	NoCreateStream bool
	// MaxPending is the most publishes one Publish call keeps waiting for a
	// PubAck; Dial also sets it as the JetStream context's async publish
	// window. Default 4096.
	MaxPending int
	// AckTimeout is how long Publish waits for the PubAck of one message
	// before it reports a transient timeout error for it. Default 5s.
	AckTimeout time.Duration
	// Logger receives connection events and stream set-up messages.
	// Default: warnings and errors as text on standard error.
	Logger *slog.Logger
}

// normalize returns a copy of cfg with defaults applied, or an error naming
// the invalid field.
func normalize(cfg *Config) (Config, error) {
	var c Config
	if cfg != nil {
		c = *cfg
		c.Subjects = slices.Clone(cfg.Subjects)
	}
	if c.Stream == "" {
		c.Stream = DefaultStream
	}
	if strings.ContainsAny(c.Stream, ".*>/\\ \t\r\n") {
		return c, fmt.Errorf("natssink: invalid Config.Stream %q: a stream name cannot contain '.', '*', '>', '/', '\\' or whitespace", c.Stream)
	}
	if len(c.Subjects) == 0 {
		c.Subjects = []string{DefaultSubject}
	}
	for _, s := range c.Subjects {
		if err := checkFilterSubject(s); err != nil {
			return c, fmt.Errorf("natssink: invalid Config.Subjects entry %q: %v", s, err)
		}
	}
	if err := confval.PositiveOr("natssink", "MaxPending", &c.MaxPending, DefaultMaxPending); err != nil {
		return c, err
	}
	if err := confval.PositiveOr("natssink", "AckTimeout", &c.AckTimeout, DefaultAckTimeout); err != nil {
		return c, err
	}
	c.Logger = confval.Logger(c.Logger)
	return c, nil
}

// Sink publishes messages to NATS JetStream. It is safe for concurrent use;
// order is kept within one Publish call, not across concurrent calls.
type Sink struct {
	js  jetstream.JetStream
	cfg Config
	log *slog.Logger

	// owned is the connection Dial opened; nil for New.
	owned *nats.Conn
	// connClosed is closed by the owned connection's closed handler.
	connClosed chan struct{}

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

var _ sink.Sink = (*Sink)(nil)

// New returns a Sink that publishes through js. It does no I/O; call
// EnsureStream to check or create the stream. Close does not close the
// connection behind js.
//
// When js was created by the caller, give it an async publish window at least
// as large as Config.MaxPending (jetstream.WithPublishAsyncMaxPending; the
// jetstream package's default is 4000), or concurrent Publish calls may stall.
func New(js jetstream.JetStream, cfg *Config) (*Sink, error) {
	if js == nil {
		return nil, errors.New("natssink: New: nil jetstream.JetStream")
	}
	c, err := normalize(cfg)
	if err != nil {
		return nil, err
	}
	return &Sink{js: js, cfg: c, log: c.Logger}, nil
}

// Dial connects to the NATS server at rawURL (nats://host:port or
// tls://host:port; several URLs may be separated by commas), creates a
// JetStream context whose async publish window is Config.MaxPending and
// returns a Sink that owns the connection: Close drains and closes it. The
// connection reconnects without limit after it is lost, trying every
// reconnectWait (plus the client's jitter, up to 100 ms) rather than the
// client's default 2 s, so that a relay publishes again within about a
// second of the server's return. Like New, Dial does not touch the stream;
// call EnsureStream.
func Dial(ctx context.Context, rawURL string, cfg *Config) (*Sink, error) {
	c, err := normalize(cfg)
	if err != nil {
		return nil, err
	}
	shown, err := checkURL(rawURL)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("natssink: cannot connect to %s: %w", shown, err)
	}
	log := c.Logger.With("url", shown)
	connClosed := make(chan struct{})
	opts := []nats.Option{
		nats.Name("outboxkit-natssink"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(reconnectWait),
		// Fail publishes at once while disconnected instead of buffering
		// them: the outbox is the buffer.
		nats.ReconnectBufSize(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("natssink: disconnected from NATS", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("natssink: reconnected to NATS", "server", nc.ConnectedUrlRedacted())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Warn("natssink: NATS error", "err", err)
		}),
		nats.ClosedHandler(func(*nats.Conn) { close(connClosed) }),
	}
	if dl, ok := ctx.Deadline(); ok {
		if d := time.Until(dl); d < nats.DefaultTimeout {
			opts = append(opts, nats.Timeout(max(d, time.Millisecond)))
		}
	}
	nc, err := nats.Connect(rawURL, opts...)
	if err != nil {
		return nil, fmt.Errorf("natssink: cannot connect to %s: %v (is nats-server running with -js?)", shown, err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(c.MaxPending))
	if err != nil {
		nc.Close()
		<-connClosed
		return nil, fmt.Errorf("natssink: jetstream context for %s: %w", shown, err)
	}
	log.Info("natssink: connected to NATS", "server", nc.ConnectedUrlRedacted())
	return &Sink{js: js, cfg: c, log: c.Logger, owned: nc, connClosed: connClosed}, nil
}

// checkURL validates a NATS server URL list and returns it with passwords
// redacted, for error messages.
func checkURL(rawURL string) (string, error) {
	if strings.TrimSpace(rawURL) == "" {
		return "", errors.New("natssink: empty NATS URL; want nats://host:port")
	}
	var shown []string
	for _, part := range strings.Split(rawURL, ",") {
		part = strings.TrimSpace(part)
		u, err := url.Parse(part)
		if err != nil || u.Host == "" || u.Opaque != "" {
			return "", fmt.Errorf("natssink: invalid NATS URL %q: want nats://host:port", part)
		}
		if u.Scheme != "nats" && u.Scheme != "tls" {
			return "", fmt.Errorf("natssink: invalid NATS URL %s: scheme %q is not supported; use nats:// or tls://", u.Redacted(), u.Scheme)
		}
		if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
			return "", fmt.Errorf("natssink: invalid NATS URL %s: unexpected path, query or fragment; want %s://host:port", u.Redacted(), u.Scheme)
		}
		shown = append(shown, u.Redacted())
	}
	return strings.Join(shown, ","), nil
}

// DialStream is Dial followed by EnsureStream: a Sink whose stream exists
// (created, unless Config.NoCreateStream is set). On an error nothing is
// left open.
func DialStream(ctx context.Context, rawURL string, cfg *Config) (*Sink, error) {
	s, err := Dial(ctx, rawURL, cfg)
	if err != nil {
		return nil, err
	}
	if err := s.EnsureStream(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// EnsureStream makes sure Config.Stream exists. A missing stream is created
// with Config.Subjects and file storage, unless Config.NoCreateStream is set,
// in which case EnsureStream returns an error. An existing stream is left
// as it is, even if its subjects differ from Config.Subjects (that is
// logged, unless NoCreateStream is set: Config.Subjects then means nothing).
func (s *Sink) EnsureStream(ctx context.Context) error {
	name := s.cfg.Stream
	st, err := s.js.Stream(ctx, name)
	if err == nil {
		subjects := st.CachedInfo().Config.Subjects
		// With creation off, Config.Subjects describes no stream: the
		// stream's own subjects are the operator's, nothing to compare.
		if !s.cfg.NoCreateStream && !sameSet(subjects, s.cfg.Subjects) {
			s.log.Warn("natssink: stream exists with other subjects than configured; leaving it unchanged",
				"stream", name, "stream_subjects", subjects, "configured_subjects", s.cfg.Subjects)
		} else {
			s.log.Debug("natssink: stream exists", "stream", name)
		}
		return nil
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("natssink: look up stream %q: %w%s", name, err, jetStreamHint(err))
	}
	if s.cfg.NoCreateStream {
		return fmt.Errorf("natssink: stream %q does not exist and Config.NoCreateStream is set: create it (e.g. nats stream add %s --subjects %q) or allow creation",
			name, name, strings.Join(s.cfg.Subjects, ","))
	}
	_, err = s.js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     name,
		Subjects: s.cfg.Subjects,
		Storage:  jetstream.FileStorage,
	})
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		// Created concurrently with another configuration: it exists now,
		// and existing streams are left alone.
		s.log.Warn("natssink: stream was created concurrently with another configuration; leaving it unchanged", "stream", name)
		return nil
	}
	if err != nil {
		return fmt.Errorf("natssink: create stream %q with subjects %q: %w%s", name, s.cfg.Subjects, err, jetStreamHint(err))
	}
	s.log.Info("natssink: created stream", "stream", name, "subjects", s.cfg.Subjects)
	return nil
}

// jetStreamHint explains errors that mean JetStream is not available.
func jetStreamHint(err error) string {
	if errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) ||
		errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) {
		return " (is JetStream enabled? start nats-server with -js)"
	}
	return ""
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}

// pending is a publish waiting for its PubAck.
type pending struct {
	i        int
	f        jetstream.PubAckFuture
	deadline time.Time
}

// Publish publishes msgs and returns one result per message, in order: nil
// once the stream acknowledged the message (or reported it a duplicate).
// Messages are submitted in slice order, at most Config.MaxPending of them
// unacknowledged at a time. When ctx is done, messages without a result get
// ctx.Err(). See the package documentation for which errors are permanent.
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

	// connClosed fires if the connection closes while we wait: the futures
	// of a closed connection never resolve.
	var connClosed <-chan nats.Status
	var nc *nats.Conn
	if nc = s.js.Conn(); nc != nil {
		// A disconnect ends the wait too: acknowledgements sent before it
		// are lost, and the relay republishes (JetStream drops the copies
		// by Nats-Msg-Id).
		ch := nc.StatusChanged(nats.DISCONNECTED, nats.CLOSED)
		defer nc.RemoveStatusListener(ch)
		connClosed = ch
		if nc.IsClosed() {
			return s.fail(msgs, errs, 0, nats.ErrConnectionClosed)
		}
		if nc.IsReconnecting() {
			return s.fail(msgs, errs, 0, nats.ErrDisconnected)
		}
	}

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	w := &waiter{s: s, msgs: msgs, errs: errs, ctx: ctx, timer: timer, connClosed: connClosed}

	// window is a FIFO ring of unacknowledged publishes.
	window := make([]pending, min(len(msgs), s.cfg.MaxPending))
	head, n := 0, 0
	popWait := func() bool {
		ok := w.wait(window[head])
		window[head] = pending{}
		head = (head + 1) % len(window)
		n--
		return ok
	}

	for i := range msgs {
		if n == len(window) && !popWait() {
			return w.abandon(window, head, n, i)
		}
		if err := ctx.Err(); err != nil {
			return w.abandon(window, head, n, i)
		}
		m := &msgs[i]
		if err := checkSubject(m.Destination); err != nil {
			errs[i] = sink.Permanent(fmt.Errorf("natssink: publish to subject %q: invalid subject: %w", m.Destination, err))
			continue
		}
		if err := checkLineBreaks(m); err != nil {
			errs[i] = sink.Permanent(fmt.Errorf("natssink: publish to subject %q: %w", m.Destination, err))
			continue
		}
		nm := toNATS(m)
		var opts []jetstream.PublishOpt
		if m.ID != "" {
			opts = append(opts, jetstream.WithMsgID(m.ID))
		}
		f, err := s.js.PublishMsgAsync(nm, opts...)
		// The JetStream context's own window is shared with other callers;
		// when it is full, make room by waiting for our oldest publish.
		for errors.Is(err, jetstream.ErrTooManyStalledMsgs) && n > 0 {
			if !popWait() {
				return w.abandon(window, head, n, i)
			}
			f, err = s.js.PublishMsgAsync(nm, opts...)
		}
		if err != nil {
			errs[i] = s.classify(m, err)
			continue
		}
		window[(head+n)%len(window)] = pending{i: i, f: f, deadline: time.Now().Add(s.cfg.AckTimeout)}
		n++
	}
	for n > 0 {
		if !popWait() {
			return w.abandon(window, head, n, len(msgs))
		}
	}
	return errs
}

// fail sets err for messages from..len(msgs) and returns errs.
func (s *Sink) fail(msgs []sink.Message, errs []error, from int, err error) []error {
	for i := from; i < len(msgs); i++ {
		errs[i] = s.classify(&msgs[i], err)
	}
	return errs
}

// waiter waits for PubAck futures of one Publish call.
type waiter struct {
	s          *Sink
	msgs       []sink.Message
	errs       []error
	ctx        context.Context
	timer      *time.Timer
	connClosed <-chan nats.Status
	// stop is the error for every message without a result once waiting
	// stopped: ctx.Err() or a connection-closed error.
	stop error
}

// wait stores the result of p and reports whether Publish may go on.
func (w *waiter) wait(p pending) bool {
	w.timer.Reset(time.Until(p.deadline))
	select {
	case <-p.f.Ok():
		return true
	case err := <-p.f.Err():
		w.errs[p.i] = w.s.classify(&w.msgs[p.i], err)
		return true
	case <-w.timer.C:
		if !w.poll(p) {
			w.errs[p.i] = fmt.Errorf("natssink: publish to subject %q: no PubAck within %v: %w",
				w.msgs[p.i].Destination, w.s.cfg.AckTimeout, jetstream.ErrAsyncPublishTimeout)
		}
		return true
	case <-w.ctx.Done():
		w.stop = w.ctx.Err()
	case st := <-w.connClosed:
		w.stop = nats.ErrConnectionClosed
		if st == nats.DISCONNECTED {
			w.stop = nats.ErrDisconnected
		}
	}
	if !w.poll(p) {
		w.errs[p.i] = w.stopErr(p.i)
	}
	return false
}

// poll stores the result of p if it has one already.
func (w *waiter) poll(p pending) bool {
	select {
	case <-p.f.Ok():
		return true
	case err := <-p.f.Err():
		w.errs[p.i] = w.s.classify(&w.msgs[p.i], err)
		return true
	default:
		return false
	}
}

// stopErr is the result of message i once waiting stopped: ctx.Err() as is,
// or a wrapped connection error.
func (w *waiter) stopErr(i int) error {
	return w.s.classify(&w.msgs[i], w.stop)
}

// abandon gives every message without a result the stop error (keeping
// results that already arrived) and returns the results.
func (w *waiter) abandon(window []pending, head, n, next int) []error {
	if w.stop == nil {
		w.stop = w.ctx.Err()
	}
	for k := range n {
		p := window[(head+k)%len(window)]
		if !w.poll(p) {
			w.errs[p.i] = w.stopErr(p.i)
		}
	}
	for i := next; i < len(w.msgs); i++ {
		if w.errs[i] == nil {
			w.errs[i] = w.stopErr(i)
		}
	}
	return w.errs
}

// toNATS converts m to a NATS message.
func toNATS(m *sink.Message) *nats.Msg {
	nm := &nats.Msg{Subject: m.Destination, Data: m.Value}
	if len(m.Headers) > 0 || len(m.Key) > 0 || m.ID != "" {
		nm.Header = make(nats.Header, len(m.Headers)+2)
		if _, ok := m.Header("id"); !ok && m.ID != "" {
			nm.Header.Set("id", m.ID)
		}
		for _, h := range m.Headers {
			nm.Header.Add(h.Key, h.Value)
		}
		if _, ok := m.Header(KeyHeader); !ok && len(m.Key) > 0 {
			nm.Header.Set(KeyHeader, string(m.Key))
		}
	}
	return nm
}

// classify wraps a publish error of m with context and marks the permanent
// ones.
func (s *Sink) classify(m *sink.Message, err error) error {
	subj := m.Destination
	switch {
	case errors.Is(err, nats.ErrMaxPayload):
		limit := int64(-1)
		if nc := s.js.Conn(); nc != nil {
			limit = nc.MaxPayload()
		}
		return sink.Permanent(fmt.Errorf("natssink: publish to subject %q: message of about %d bytes (payload plus headers) exceeds the server's max_payload of %d bytes: %w",
			subj, messageSize(m), limit, err))
	case errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum):
		return sink.Permanent(fmt.Errorf("natssink: publish to subject %q: message of about %d bytes exceeds the stream's max_msg_size: %w", subj, messageSize(m), err))
	case errors.Is(err, nats.ErrBadSubject):
		return sink.Permanent(fmt.Errorf("natssink: publish to subject %q: invalid subject: %w", subj, err))
	case errors.Is(err, nats.ErrBadHeaderMsg):
		return sink.Permanent(fmt.Errorf("natssink: publish to subject %q: invalid header name (NATS header names are printable ASCII without spaces or any of \"():;<=>?@[\\]{}/,): %w", subj, err))
	case refusedForGood(err):
		return sink.Permanent(fmt.Errorf("natssink: publish to subject %q: the stream refuses this message as it is (a header it cannot satisfy, or a feature the stream has off); publishing it again cannot succeed: %w", subj, err))
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		return fmt.Errorf("natssink: publish to subject %q: no stream listens on subject %q (check Config.Subjects %q of stream %q, and that the stream exists): %w",
			subj, subj, s.cfg.Subjects, s.cfg.Stream, err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.Is(err, nats.ErrDisconnected), errors.Is(err, nats.ErrConnectionClosed),
		errors.Is(err, nats.ErrConnectionReconnecting), errors.Is(err, nats.ErrReconnectBufExceeded),
		errors.Is(err, nats.ErrTimeout),
		errors.Is(err, jetstream.ErrAsyncPublishTimeout):
		// The server was not there to answer: nothing is wrong with the
		// message.
		return sink.Unavailable(fmt.Errorf("natssink: publish to subject %q: %w", subj, err))
	default:
		return fmt.Errorf("natssink: publish to subject %q: %w", subj, err)
	}
}

// refusedForGood reports whether err is the stream's refusal of the
// message itself, by JetStream API error code: a header it cannot satisfy
// (Nats-Expected-Stream, Nats-Expected-Last-Msg-Id,
// Nats-Expected-Last-Sequence, Nats-Expected-Last-Subject-Sequence) or
// that asks for something the stream does not allow (headers too large,
// rollup, per-message TTL, counters, schedules, atomic or batch publish).
// The same message meets the same refusal every time. Refusals that say
// nothing about the message (no stream, no space, a sealed stream, too
// many requests, a condition that is "temporarily unavailable") stay
// transient.
func refusedForGood(err error) bool {
	var jsErr jetstream.JetStreamError
	if !errors.As(err, &jsErr) || jsErr.APIError() == nil {
		return false
	}
	switch c := jsErr.APIError().ErrorCode; c {
	case 10060, // JSStreamNotMatchErr: expected stream does not match
		10070, // JSStreamWrongLastMsgIDErrF
		jetstream.JSErrCodeStreamWrongLastSequence,         // 10071
		jetstream.JSErrCodeStreamWrongLastSequenceConstant, // 10164
		10193, // JSStreamExpectedLastSeqPerSubjectInvalid
		10097, // JSStreamHeaderExceedsMaximumErr
		10111, // JSStreamRollupFailedF: rollup not permitted or invalid
		10165, // JSMessageTTLInvalidErr
		10166, // JSMessageTTLDisabledErr
		10227: // JSMessageSourceHdrNotAllowedErr
		return true
	default:
		return c >= 10168 && c <= 10172 || // message counters
			c >= 10174 && c <= 10179 || // atomic publish
			c >= 10188 && c <= 10192 || c == 10203 || c == 10212 || c == 10223 || // message schedules
			c >= 10199 && c <= 10201 || // atomic publish batches
			c >= 10205 && c <= 10208 // batch publish
	}
}

// checkLineBreaks reports a key or header value with a CR or LF: a NATS
// header cannot carry one (the client would send a space instead), and
// the message must arrive as it was written.
func checkLineBreaks(m *sink.Message) error {
	if bytes.ContainsAny(m.Key, "\r\n") {
		return fmt.Errorf("the key contains a line break (CR or LF), which the NATS header %q cannot carry unchanged", KeyHeader)
	}
	for _, h := range m.Headers {
		if strings.ContainsAny(h.Value, "\r\n") {
			return fmt.Errorf("the value of header %q contains a line break (CR or LF), which a NATS header cannot carry unchanged", h.Key)
		}
	}
	return nil
}

func messageSize(m *sink.Message) int {
	n := len(m.Value)
	for _, h := range m.Headers {
		n += len(h.Key) + len(h.Value) + 4
	}
	return n
}

// checkSubject reports why subj cannot be published to, or nil.
func checkSubject(subj string) error {
	if subj == "" {
		return errors.New("subject is empty")
	}
	if len(subj) > maxSubjectLen {
		return fmt.Errorf("subject is %d bytes long, more than %d", len(subj), maxSubjectLen)
	}
	for i := 0; i < len(subj); i++ {
		switch c := subj[i]; {
		case c == '*' || c == '>':
			return fmt.Errorf("subject contains the wildcard %q; messages are published to literal subjects", c)
		case c <= ' ' || c == 0x7f:
			return errors.New("subject contains whitespace or a control character")
		}
	}
	if slices.Contains(strings.Split(subj, "."), "") {
		return errors.New("subject has an empty token (leading, trailing or doubled '.')")
	}
	return nil
}

// checkFilterSubject reports why a stream subject (wildcards allowed) is
// invalid, or nil.
func checkFilterSubject(subj string) error {
	if subj == "" {
		return errors.New("subject is empty")
	}
	if strings.ContainsAny(subj, " \t\r\n") {
		return errors.New("subject contains whitespace")
	}
	tokens := strings.Split(subj, ".")
	for i, t := range tokens {
		switch {
		case t == "":
			return errors.New("subject has an empty token (leading, trailing or doubled '.')")
		case t == ">" && i != len(tokens)-1:
			return errors.New("'>' must be the last token")
		case t != "*" && t != ">" && strings.ContainsAny(t, "*>"):
			return errors.New("wildcards '*' and '>' must be whole tokens")
		}
	}
	return nil
}

// Close stops the sink: later Publish calls fail with ErrClosed. A sink made
// by Dial drains and closes its connection, waiting for publishes in flight;
// a sink made by New leaves the caller's connection open. Close is
// idempotent.
func (s *Sink) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		if s.owned == nil {
			return
		}
		if err := s.owned.Drain(); err != nil {
			s.owned.Close()
		}
		// Drain closes the connection within its drain timeout (30s by
		// default); wait a little longer in case it hangs.
		select {
		case <-s.connClosed:
		case <-time.After(s.owned.Opts.DrainTimeout + 5*time.Second):
			s.owned.Close()
			<-s.connClosed
			s.closeErr = errors.New("natssink: close: draining the NATS connection timed out")
		}
		s.log.Info("natssink: NATS connection closed")
	})
	return s.closeErr
}

// System names the broker as OpenTelemetry's messaging.system attribute
// does: "nats".
func (s *Sink) System() string { return "nats" }
