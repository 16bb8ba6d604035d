package redissink

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox/internal/confval"
	"github.com/outboxkit/outbox/sink"
)

// Defaults applied to zero Config fields.
const (
	// DefaultMaxMessageSize is Redis's default proto-max-bulk-len, the
	// largest string one command argument may carry.
	DefaultMaxMessageSize = 512 << 20
)

// ErrClosed is the (transient) error of every message published after Close.
var ErrClosed = errors.New("redissink: sink is closed")

// Config configures a Sink. The zero value (or a nil *Config) is usable:
// every zero field takes its documented default. New and Dial do not modify
// it.
type Config struct {
	// StreamPrefix is prepended to a message's Destination to name its
	// stream. Default: none.
	StreamPrefix string
	// MaxLen, when positive, makes every XADD trim its stream to about
	// MaxLen entries (XADD MAXLEN ~ MaxLen). Default 0: unbounded.
	MaxLen int64
	// MaxMessageSize is the largest payload (and key, and headers JSON)
	// Publish sends; larger ones fail permanently without being sent. Redis
	// closes the connection on an argument over its proto-max-bulk-len,
	// which would fail the whole batch. Negative means no limit. Default
	// 512 MiB.
	MaxMessageSize int
	// Logger receives the sink's log lines. Default: warnings and errors
	// as text on standard error.
	Logger *slog.Logger
}

// normalize returns a copy of cfg with defaults applied, or an error naming
// the invalid field.
func normalize(cfg *Config) (Config, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.MaxLen < 0 {
		return c, fmt.Errorf("redissink: invalid Config.MaxLen %d: must be positive (or 0 for unbounded streams)", c.MaxLen)
	}
	if c.MaxMessageSize == 0 {
		c.MaxMessageSize = DefaultMaxMessageSize
	}
	c.Logger = confval.Logger(c.Logger)
	return c, nil
}

// Sink appends messages to Redis streams. It is safe for concurrent use;
// order is kept within one Publish call, not across concurrent calls.
type Sink struct {
	client redis.UniversalClient
	owned  bool // Close closes client
	cfg    Config
	log    *slog.Logger

	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup // pipelines in progress
}

var _ sink.Sink = (*Sink)(nil)

// New returns a Sink that appends through client (a *redis.Client,
// *redis.ClusterClient, failover client or other redis.UniversalClient).
// It does no I/O. Close leaves the client open.
func New(client redis.UniversalClient, cfg *Config) (*Sink, error) {
	if client == nil {
		return nil, errors.New("redissink: New: nil redis client")
	}
	c, err := normalize(cfg)
	if err != nil {
		return nil, err
	}
	return &Sink{client: client, cfg: c, log: c.Logger}, nil
}

// Dial connects to the Redis server at rawURL (redis://[user:password@]host:port/db,
// rediss:// for TLS, or unix:///path; see redis.ParseURL for the query
// parameters), checks that it answers PING before ctx ends, and returns a
// Sink that owns the client: Close closes it. The client honours the
// deadlines of the contexts Publish gets and reconnects by itself after the
// connection is lost.
func Dial(ctx context.Context, rawURL string, cfg *Config) (*Sink, error) {
	c, err := normalize(cfg)
	if err != nil {
		return nil, err
	}
	opt, shown, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	opt.ContextTimeoutEnabled = true
	if opt.ClientName == "" {
		opt.ClientName = "outboxkit-redissink"
	}
	client := redis.NewClient(opt)
	if err := client.Ping(ctx).Err(); err != nil {
		_ = client.Close()
		hint := " (is redis-server running and listening there?)"
		if redis.IsAuthError(err) {
			hint = " (check the user name and password in the URL)"
		}
		return nil, fmt.Errorf("redissink: cannot reach %s: %v%s", shown, redact(err.Error(), opt.Password), hint)
	}
	c.Logger.Info("redissink: connected to Redis", "url", shown)
	return &Sink{client: client, owned: true, cfg: c, log: c.Logger.With("url", shown)}, nil
}

// parseURL parses a Redis URL and returns its options and the URL with the
// password redacted.
func parseURL(rawURL string) (*redis.Options, string, error) {
	if strings.TrimSpace(rawURL) == "" {
		return nil, "", errors.New("redissink: empty URL; want redis://host:port/db")
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, "", errors.New("redissink: invalid URL (not shown, it may hold a password): want redis://[user:password@]host:port/db, with reserved characters in the user name or password percent-encoded")
	}
	shown := u.Redacted()
	switch u.Scheme {
	case "redis", "rediss", "unix":
	default:
		return nil, "", fmt.Errorf("redissink: invalid URL %s: scheme %q is not supported; use redis://, rediss:// or unix://", shown, u.Scheme)
	}
	opt, err := redis.ParseURL(rawURL)
	if err != nil {
		pw, _ := u.User.Password()
		return nil, "", fmt.Errorf("redissink: invalid URL %s: %s", shown, redact(err.Error(), pw))
	}
	return opt, shown, nil
}

// redact hides password in msg.
func redact(msg, password string) string {
	if password == "" {
		return msg
	}
	msg = strings.ReplaceAll(msg, password, "xxxxx")
	return strings.ReplaceAll(msg, url.QueryEscape(password), "xxxxx")
}

// entry is one message ready to append.
type entry struct {
	i       int // index in msgs
	stream  string
	headers []byte
}

// Publish appends msgs in one pipeline and returns one result per message,
// in order: nil once Redis appended the entry. When ctx ends first, every
// message not failed already gets ctx's error (wrapped); entries may have
// been appended nonetheless. See the package documentation for which errors
// are permanent.
//
// After ctx ended, the pipeline may still be sending msgs in the background
// when Publish returns: do not modify the messages' Key, Value or Headers
// afterwards.
func (s *Sink) Publish(ctx context.Context, msgs []sink.Message) []error {
	errs := make([]error, len(msgs))
	if len(msgs) == 0 {
		return errs
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return sink.Results(len(msgs), ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return sink.Results(len(msgs), err)
	}

	entries := make([]entry, 0, len(msgs))
	for i := range msgs {
		e, err := s.prepare(i, &msgs[i])
		if err != nil {
			errs[i] = sink.Permanent(err)
			continue
		}
		entries = append(entries, e)
	}
	if len(entries) == 0 {
		return errs
	}

	// The pipeline runs on its own goroutine so that Publish returns when
	// ctx ends even if the client does not honour ctx (a client built
	// without ContextTimeoutEnabled waits for its read timeout).
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return sink.Results(len(msgs), ErrClosed)
	}
	s.wg.Add(1)
	s.mu.Unlock()
	cmds := make([]*redis.StringCmd, len(entries))
	done := make(chan struct{})
	go func() {
		defer s.wg.Done()
		defer close(done)
		_, _ = s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for k, e := range entries {
				m := &msgs[e.i]
				cmds[k] = p.XAdd(ctx, &redis.XAddArgs{
					Stream: e.stream,
					MaxLen: s.cfg.MaxLen,
					Approx: s.cfg.MaxLen > 0,
					ID:     "*",
					Values: []any{"id", m.ID, "key", m.Key, "type", m.Type, "headers", e.headers, "payload", m.Value},
				})
			}
			return nil
		})
	}()
	select {
	case <-done:
	case <-ctx.Done():
		for _, e := range entries {
			errs[e.i] = fmt.Errorf("redissink: XADD to stream %q: %w", e.stream, ctx.Err())
		}
		return errs
	}
	for k, e := range entries {
		err := cmds[k].Err()
		if err != nil && ctx.Err() != nil {
			// The client reports a deadline as an I/O timeout.
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		errs[e.i] = classify(e.stream, err)
	}
	return errs
}

// prepare checks message i and builds its entry.
func (s *Sink) prepare(i int, m *sink.Message) (entry, error) {
	if m.Destination == "" {
		return entry{}, errors.New("redissink: publish: empty destination")
	}
	e := entry{i: i, stream: s.cfg.StreamPrefix + m.Destination}
	h, err := headersJSON(m)
	if err != nil {
		return entry{}, fmt.Errorf("redissink: XADD to stream %q: %w", e.stream, err)
	}
	e.headers = h
	if limit := s.cfg.MaxMessageSize; limit > 0 {
		for _, f := range []struct {
			name string
			n    int
		}{{"payload", len(m.Value)}, {"key", len(m.Key)}, {"headers JSON", len(h)}, {"stream name", len(e.stream)}} {
			if f.n > limit {
				return entry{}, fmt.Errorf("redissink: XADD to stream %q: %s of %d bytes exceeds Config.MaxMessageSize of %d bytes (Redis's proto-max-bulk-len, 512 MiB by default, is the hard limit)",
					e.stream, f.name, f.n, limit)
			}
		}
	}
	return e, nil
}

// headersJSON encodes the headers of m, with "id" unless m has one, as a JSON
// object of name to values.
func headersJSON(m *sink.Message) ([]byte, error) {
	names := make([]string, 0, len(m.Headers)+1)
	vals := make(map[string][]string, len(m.Headers)+1)
	if _, ok := m.Header("id"); !ok {
		names = append(names, "id")
		vals["id"] = []string{m.ID}
	}
	for _, h := range m.Headers {
		if !utf8.ValidString(h.Key) || !utf8.ValidString(h.Value) {
			return nil, fmt.Errorf("header %q is not valid UTF-8; the headers field is JSON, which holds only UTF-8", h.Key)
		}
		if _, ok := vals[h.Key]; !ok {
			names = append(names, h.Key)
		}
		vals[h.Key] = append(vals[h.Key], h.Value)
	}
	// Names in first-appearance order: encode the object by hand.
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	b.WriteByte('{')
	for k, name := range names {
		if k > 0 {
			b.WriteByte(',')
		}
		if err := enc.Encode(name); err != nil {
			return nil, err
		}
		b.Truncate(b.Len() - 1) // Encode's newline
		b.WriteByte(':')
		if err := enc.Encode(vals[name]); err != nil {
			return nil, err
		}
		b.Truncate(b.Len() - 1)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// classify wraps the XADD result for stream and marks what retrying cannot
// fix as permanent and what says nothing about the message as unavailable.
func classify(stream string, err error) error {
	if err == nil {
		return nil
	}
	wrapped := fmt.Errorf("redissink: XADD to stream %q: %w", stream, err)
	var rerr redis.Error
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return wrapped
	case redis.HasErrorPrefix(err, "WRONGTYPE"):
		return sink.Permanent(fmt.Errorf("redissink: XADD to stream %q: the key exists and is not a stream; delete or rename it, or route the destination elsewhere: %w", stream, err))
	case redis.IsPermissionError(err):
		return sink.Permanent(fmt.Errorf("redissink: XADD to stream %q: the Redis user may not run XADD on this key (check its ACL): %w", stream, err))
	case redis.IsOOMError(err):
		return fmt.Errorf("redissink: XADD to stream %q: Redis is out of memory (maxmemory reached); trim the streams (Config.MaxLen), let consumers delete entries, or raise maxmemory: %w", stream, err)
	case redis.IsLoadingError(err), redis.IsReadOnlyError(err), redis.IsMasterDownError(err),
		redis.IsClusterDownError(err), redis.IsTryAgainError(err), redis.IsMaxClientsError(err),
		redis.IsAuthError(err), redis.HasErrorPrefix(err, "BUSY "):
		// The server is there but cannot serve now, or not us.
		return sink.Unavailable(wrapped)
	case errors.As(err, &rerr):
		return wrapped
	default:
		// No reply: connection refused, reset or timed out, client closed.
		return sink.Unavailable(fmt.Errorf("redissink: XADD to stream %q: no reply from Redis: %w", stream, err))
	}
}

// Close stops the sink: later Publish calls fail with ErrClosed. It closes
// the client if Dial created it (a client passed to New is left open) and
// waits for pipelines in progress. Close is idempotent and always returns
// nil.
func (s *Sink) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	if s.owned {
		if err := s.client.Close(); err != nil {
			s.log.Warn("redissink: close client", "err", err)
		}
	}
	s.wg.Wait()
	return nil
}

// System names the broker as OpenTelemetry's messaging.system attribute
// does: "redis".
func (s *Sink) System() string { return "redis" }
