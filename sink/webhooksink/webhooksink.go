// Package webhooksink is a [sink.Sink] that delivers each message as an HTTP
// POST request, a webhook, signed as the Standard Webhooks specification
// (https://www.standardwebhooks.com) describes. Receivers check requests with
// [Verify].
//
// # Requests
//
// A message is posted to the URL of its destination: Config.URLs[destination]
// when there is one, otherwise Config.URL; "${destination}" in either is
// replaced by the destination, path-escaped (so "orders/eu" becomes
// "orders%2Feu"). The body is Message.Value byte for byte, with the
// Content-Type application/json when it is valid JSON, and
// application/octet-stream otherwise (none for an empty body); a message
// header "content-type" takes precedence. The request carries:
//
//	webhook-id         the event id (the same on every retry, for de-duplication)
//	webhook-timestamp  the time of this attempt, in Unix seconds
//	webhook-signature  "v1,<base64 HMAC-SHA256>" per secret, space-separated
//	Outbox-Key         Message.Key (Outbox-Key-Base64, standard base64, instead
//	                   when it is not UTF-8 or has control characters or white
//	                   space at either end)
//	Id                 the event id, when the message has no "id" header
//
// and, after those, Config.Header and the message's headers, in order (names
// may repeat). A message header whose name is not an HTTP token, whose value
// holds a control character, or whose name is reserved (the three webhook-
// headers above, Outbox-Key, Outbox-Key-Base64, Host, Content-Length and the
// other framing and hop-by-hop headers) fails the message permanently.
//
// The signature is HMAC-SHA256 over id + "." + timestamp + "." + body with the
// key of each secret in Config.Secrets: list two during a rotation and every
// request is signed with both, so receivers accept it whichever they know.
//
// # Results
//
// A 2xx answer acknowledges the message. Network errors, timeouts
// (Config.Timeout per request), 408, 429 and 5xx are transient; other 4xx
// and every 3xx are permanent: redirects are never followed. Status errors
// are [*StatusError] values, which carry the delay of a Retry-After header
// (see [RetryAfter] and [RetryAfterError]). Transient errors are not [sink.Unavailable]: one endpoint
// that is down says nothing about the other destinations, so its messages
// spend their attempts and are eventually dead-lettered as with any
// webhook provider. Response bodies are read up to 64 KiB, to reuse the
// connection, and discarded.
//
// # Order and concurrency
//
// Publish delivers the messages of one key one after the other, in slice
// order, each only once the previous one was answered; after a transient
// failure, the key's later messages in the batch are not sent (they fail
// too), so that none overtakes the failed one. Different keys are delivered
// concurrently, at most Config.Concurrency at a time.
//
// # Private networks
//
// A webhook URL comes from configuration or routing, and a host name can
// resolve to anything, so the sink refuses to connect to addresses that are
// not on the public Internet unless told otherwise: loopback, private
// (RFC 1918, fc00::/7), link-local (169.254.0.0/16, fe80::/10), unspecified,
// multicast, shared/CGNAT (100.64.0.0/10), reserved and benchmarking ranges,
// and those embedded in NAT64 and 6to4 addresses. The check runs on the
// address actually being connected to (a net.Dialer Control function), after
// name resolution, so DNS rebinding cannot get around it; HTTP proxies from
// the environment are not used, for the same reason. A refused address is a
// permanent [*BlockedAddressError]. Config.AllowPrivate lifts the restriction
// except for cloud metadata endpoints (169.254.169.254, fd00:ec2::254 and
// their kind); Config.Allow lets chosen prefixes through, metadata included.
package webhooksink

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/outboxkit/outbox/internal/confval"
	"github.com/outboxkit/outbox/sink"
)

// Defaults applied by New to zero Config fields, and limits.
const (
	// DefaultTimeout is the default time one request may take.
	DefaultTimeout = 10 * time.Second
	// DefaultConcurrency is the default number of keys delivered at the
	// same time by one Publish call.
	DefaultConcurrency = 8
	// DefaultTolerance is the default largest difference between a
	// request's webhook-timestamp and the receiver's clock that Verify
	// accepts.
	DefaultTolerance = 5 * time.Minute
	// DefaultUserAgent is the default User-Agent header.
	DefaultUserAgent = "outboxkit-webhooksink"
	// Placeholder is replaced by the path-escaped destination in URLs.
	Placeholder = "${destination}"
	// KeyHeader carries Message.Key.
	KeyHeader = "Outbox-Key"
	// KeyBase64Header carries Message.Key in standard base64 when it cannot
	// travel as a header value.
	KeyBase64Header = "Outbox-Key-Base64"
	// MaxRetryAfter caps the delay a Retry-After header can ask for.
	MaxRetryAfter = 24 * time.Hour
	// MinSecretBytes is the shortest signing key New accepts; the
	// specification recommends 24 to 64 bytes, and NewSecret makes 32.
	MinSecretBytes = 16
)

// Standard Webhooks headers.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// secretPrefix starts secrets in the specification's format.
const secretPrefix = "whsec_"

// maxDrain is how much of a response body is read (and discarded).
const maxDrain = 64 << 10

// ErrClosed is the error for messages published after Close, or cut short
// by it.
var ErrClosed = errors.New("webhooksink: sink is closed")

// Config configures a Sink. New does not modify it.
type Config struct {
	// URL is the endpoint for destinations not in URLs; Placeholder
	// ("${destination}") is replaced by the path-escaped destination, and
	// may appear in the path or query only. For example
	// "https://hooks.example.com/outbox/${destination}". Without it, only
	// the destinations in URLs can be delivered (others fail permanently).
	URL string
	// URLs maps destinations to their endpoints, overriding URL; the
	// placeholder works there too.
	URLs map[string]string
	// Secrets sign every request. Each is "whsec_" followed by the standard
	// base64 of a key of at least 16 bytes (NewSecret makes one); the
	// prefix may be left out. During a rotation list the new and the old
	// secret: each request then carries one signature per secret. Required.
	Secrets []string
	// Header is sent with every request, before the message's headers (an
	// Authorization header, for example). The reserved names described in
	// the package documentation are not allowed.
	Header http.Header
	// Timeout bounds one request, from connecting to reading the response
	// headers and (part of) the body. Default 10s.
	Timeout time.Duration
	// Concurrency is how many keys one Publish call delivers at the same
	// time; 1 delivers the whole batch sequentially. Default 8.
	Concurrency int
	// AllowPrivate allows connections to loopback, private, link-local,
	// CGNAT and the other non-public addresses (see the package
	// documentation), but not to cloud metadata endpoints.
	AllowPrivate bool
	// Allow lists prefixes the sink may connect to even though they are
	// not public, cloud metadata endpoints included; for example
	// netip.MustParsePrefix("10.1.2.0/24").
	Allow []netip.Prefix
	// Resolver resolves host names. Default net.DefaultResolver.
	Resolver *net.Resolver
	// TLSConfig configures HTTPS connections. Default: the system's roots.
	TLSConfig *tls.Config
	// UserAgent is the User-Agent header. Default "outboxkit-webhooksink".
	UserAgent string
	// Logger receives warnings. Default: warnings and errors as text on
	// standard error.
	Logger *slog.Logger
}

// Sink delivers messages as signed webhooks. It is safe for concurrent use;
// order is kept within one Publish call, not across concurrent calls.
type Sink struct {
	cfg       Config
	keys      [][]byte
	urls      map[string]*endpoint
	fallback  *endpoint // Config.URL; nil without one
	header    http.Header
	client    *http.Client
	transport *http.Transport
	log       *slog.Logger
	now       func() time.Time // the clock of webhook-timestamp: time.Now, a test's stub

	// ctx is cancelled by Close, with ErrClosed as its cause.
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu        sync.Mutex
	closed    bool
	inflight  sync.WaitGroup // Publish calls
	closeOnce sync.Once
}

var _ sink.Sink = (*Sink)(nil)

// New returns a Sink. It does no I/O; it checks the configuration (URLs,
// secrets, headers) and returns an error naming the invalid field.
func New(cfg *Config) (*Sink, error) {
	if cfg == nil {
		return nil, errors.New("webhooksink: New: nil Config; Config.URL (or URLs) and Config.Secrets are required")
	}
	c := *cfg
	c.URLs = maps.Clone(cfg.URLs)
	c.Allow = append([]netip.Prefix(nil), cfg.Allow...)
	s := &Sink{cfg: c, urls: map[string]*endpoint{}, now: time.Now}
	if c.URL == "" && len(c.URLs) == 0 {
		return nil, errors.New("webhooksink: Config.URL is empty and Config.URLs has no entry: no destination has an endpoint")
	}
	if c.URL != "" {
		e, err := parseEndpoint(c.URL)
		if err != nil {
			return nil, fmt.Errorf("webhooksink: invalid Config.URL: %v", err)
		}
		s.fallback = e
	}
	for d, raw := range c.URLs {
		e, err := parseEndpoint(raw)
		if err != nil {
			return nil, fmt.Errorf("webhooksink: invalid Config.URLs[%q]: %v", d, err)
		}
		s.urls[d] = e
	}
	if len(c.Secrets) == 0 {
		return nil, errors.New("webhooksink: Config.Secrets is empty: requests must be signed; create a secret with webhooksink.NewSecret")
	}
	for i, sec := range c.Secrets {
		k, err := parseSecret(sec)
		if err == nil && len(k) < MinSecretBytes {
			err = fmt.Errorf("its key has %d bytes, fewer than %d (24 to 64 are recommended; NewSecret makes 32)", len(k), MinSecretBytes)
		}
		if err != nil {
			return nil, fmt.Errorf("webhooksink: invalid Config.Secrets[%d]: %v", i, err)
		}
		s.keys = append(s.keys, k)
	}
	s.header = make(http.Header, len(c.Header))
	for name, vs := range c.Header {
		for _, v := range vs {
			if err := checkHeader(name, v); err != nil {
				return nil, fmt.Errorf("webhooksink: invalid Config.Header: %v", err)
			}
			s.header.Add(name, v)
		}
	}
	switch {
	case c.Timeout < 0:
		return nil, fmt.Errorf("webhooksink: invalid Config.Timeout %v: must be positive (or 0 for the default %v)", c.Timeout, DefaultTimeout)
	case c.Timeout == 0:
		s.cfg.Timeout = DefaultTimeout
	}
	switch {
	case c.Concurrency < 0:
		return nil, fmt.Errorf("webhooksink: invalid Config.Concurrency %d: must be positive (or 0 for the default %d)", c.Concurrency, DefaultConcurrency)
	case c.Concurrency == 0:
		s.cfg.Concurrency = DefaultConcurrency
	}
	for _, p := range c.Allow {
		if !p.IsValid() {
			return nil, errors.New("webhooksink: invalid Config.Allow: a prefix is the zero netip.Prefix")
		}
	}
	if c.UserAgent == "" {
		s.cfg.UserAgent = DefaultUserAgent
	}
	s.log = confval.Logger(c.Logger)

	dialer := &net.Dialer{
		Timeout:   s.cfg.Timeout,
		KeepAlive: 30 * time.Second,
		Resolver:  c.Resolver,
		Control:   s.control,
	}
	var tlsConfig *tls.Config
	if c.TLSConfig != nil {
		tlsConfig = c.TLSConfig.Clone()
	}
	s.transport = &http.Transport{
		Proxy:                  nil, // the address check must see the endpoint itself
		DialContext:            dialer.DialContext,
		TLSClientConfig:        tlsConfig,
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           100,
		MaxIdleConnsPerHost:    s.cfg.Concurrency,
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    s.cfg.Timeout,
		ExpectContinueTimeout:  time.Second,
		MaxResponseHeaderBytes: 64 << 10,
	}
	s.client = &http.Client{
		Transport: s.transport,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	return s, nil
}

// NewSecret returns a new random secret in the specification's format:
// "whsec_" and the standard base64 of 32 random bytes.
func NewSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails
	return secretPrefix + base64.StdEncoding.EncodeToString(b)
}

// parseSecret returns the key of a "whsec_<base64>" secret (the prefix is
// optional). Errors never show the secret.
func parseSecret(secret string) ([]byte, error) {
	k, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, secretPrefix))
	if err != nil {
		return nil, errors.New(`a secret is "whsec_" followed by standard base64 (with padding), and this one is not`)
	}
	if len(k) == 0 {
		return nil, errors.New("the secret is empty")
	}
	return k, nil
}

// endpoint is a parsed URL template.
type endpoint struct {
	raw      string
	template bool // contains Placeholder
	fixed    *url.URL
}

// parseEndpoint checks a URL template.
func parseEndpoint(raw string) (*endpoint, error) {
	const marker = "outboxdestinationmarker"
	u, err := url.Parse(strings.ReplaceAll(raw, Placeholder, marker))
	if err != nil {
		return nil, fmt.Errorf("%q is not a URL", redactRaw(raw))
	}
	shown := redact(u)
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("%s: scheme %q is not supported; use https:// (or http://)", shown, u.Scheme)
	case u.Host == "" || u.Opaque != "":
		return nil, fmt.Errorf("%s: no host; want https://host/path", shown)
	case strings.Contains(u.Host, marker) || strings.Contains(u.User.String(), marker):
		return nil, fmt.Errorf("%s: %s may appear in the path or query only", shown, Placeholder)
	case u.Fragment != "":
		return nil, fmt.Errorf("%s: a URL fragment is not sent to the server; remove it", shown)
	}
	e := &endpoint{raw: raw, template: strings.Contains(raw, Placeholder)}
	if !e.template {
		e.fixed = u
	}
	return e, nil
}

// url returns the endpoint's URL for dest.
func (e *endpoint) url(dest string) (*url.URL, error) {
	if !e.template {
		return e.fixed, nil
	}
	return url.Parse(strings.ReplaceAll(e.raw, Placeholder, url.PathEscape(dest)))
}

// redact returns u for messages: without user info and with the query
// replaced, since either may hold credentials.
func redact(u *url.URL) string {
	v := *u
	v.User = nil
	if v.RawQuery != "" {
		v.RawQuery = "redacted"
	}
	v.ForceQuery = false
	return v.String()
}

// redactRaw hides the user info of a URL that does not parse.
func redactRaw(raw string) string {
	if i := strings.Index(raw, "@"); i >= 0 {
		if j := strings.Index(raw, "://"); j >= 0 && j < i {
			return raw[:j+3] + "…" + raw[i:]
		}
		return "…" + raw[i:]
	}
	return raw
}

// reserved are header names a message or Config.Header cannot set, in
// canonical form.
var reserved = map[string]bool{
	"Webhook-Id": true, "Webhook-Timestamp": true, "Webhook-Signature": true,
	http.CanonicalHeaderKey(KeyHeader): true, http.CanonicalHeaderKey(KeyBase64Header): true,
	"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Connection": true,
	"Keep-Alive": true, "Proxy-Connection": true, "Proxy-Authorization": true, "Proxy-Authenticate": true,
	"Te": true, "Trailer": true, "Upgrade": true, "Expect": true,
}

// checkHeader reports why a header cannot be sent, or nil.
func checkHeader(name, value string) error {
	if !validToken(name) {
		return fmt.Errorf("header name %q is not an HTTP token", name)
	}
	canon := http.CanonicalHeaderKey(name)
	if reserved[canon] {
		return fmt.Errorf("header %q is reserved (set by the sink or by HTTP itself)", name)
	}
	if !validValue(value) {
		return fmt.Errorf("header %q: its value holds a control character (CR, LF, NUL, ...), which HTTP does not allow", name)
	}
	return nil
}

// validToken reports whether s is an RFC 9110 token.
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x80 || c <= ' ' || c == 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// validValue reports whether s can be a header value: no control characters
// but tab.
func validValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// cleanValue reports whether s travels as a header value unchanged: valid
// UTF-8, no control characters, no white space at either end (parsers trim
// it).
func cleanValue(s string) bool {
	return utf8.ValidString(s) && validValue(s) && !strings.ContainsRune(s, '\t') &&
		strings.TrimSpace(s) == s
}

// Publish delivers msgs and returns one result per message, in order: nil
// once the endpoint answered 2xx. See the package documentation for order,
// concurrency and which errors are permanent. When ctx is done, messages
// without a result get ctx's error.
func (s *Sink) Publish(ctx context.Context, msgs []sink.Message) []error {
	errs := make([]error, len(msgs))
	if len(msgs) == 0 {
		return errs
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return sink.Results(len(msgs), ErrClosed)
	}
	s.inflight.Add(1)
	s.mu.Unlock()
	defer s.inflight.Done()
	if err := ctx.Err(); err != nil {
		return sink.Results(len(msgs), err)
	}
	// Close cancels what is in flight.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer context.AfterFunc(s.ctx, func() { cancel(ErrClosed) })()

	var order []string
	groups := map[string][]int{}
	for i := range msgs {
		k := string(msgs[i].Key)
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], i)
	}
	work := make(chan []int)
	var wg sync.WaitGroup
	for range min(s.cfg.Concurrency, len(order)) {
		wg.Go(func() {
			for g := range work {
				s.deliverKey(ctx, msgs, errs, g)
			}
		})
	}
	for _, k := range order {
		work <- groups[k]
	}
	close(work)
	wg.Wait()
	return errs
}

// deliverKey delivers the messages idx (of one key) one after the other.
func (s *Sink) deliverKey(ctx context.Context, msgs []sink.Message, errs []error, idx []int) {
	var failed error
	for _, i := range idx {
		m := &msgs[i]
		switch {
		case ctx.Err() != nil:
			errs[i] = context.Cause(ctx)
		case failed != nil:
			errs[i] = fmt.Errorf("webhooksink: message %q not sent: an earlier message with the same key failed: %w", m.ID, failed)
		default:
			errs[i] = s.deliver(ctx, m)
			if errs[i] != nil && !sink.IsPermanent(errs[i]) {
				failed = errs[i]
			}
		}
	}
}

// deliver posts one message.
func (s *Sink) deliver(ctx context.Context, m *sink.Message) error {
	e := s.urls[m.Destination]
	if e == nil {
		e = s.fallback
	}
	if e == nil {
		return sink.Permanent(fmt.Errorf("webhooksink: no endpoint for destination %q: it is not in Config.URLs and Config.URL is empty", m.Destination))
	}
	u, err := e.url(m.Destination)
	if err != nil {
		return sink.Permanent(fmt.Errorf("webhooksink: destination %q does not make a valid URL: %v", m.Destination, err))
	}
	shown := redact(u)
	fail := func(format string, args ...any) error {
		return sink.Permanent(fmt.Errorf("webhooksink: POST %s: message %q: "+format, append([]any{shown, m.ID}, args...)...))
	}
	if m.ID == "" {
		return fail("empty id: %s is required", HeaderID)
	}
	if !cleanValue(m.ID) {
		return fail("the id cannot travel as the %s header: it has control characters or white space at its ends", HeaderID)
	}

	rctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, u.String(), bytes.NewReader(m.Value))
	if err != nil {
		return fail("%v", err)
	}
	h := req.Header
	maps.Copy(h, s.header.Clone())
	hasID, hasType := false, false
	for _, hd := range m.Headers {
		if err := checkHeader(hd.Key, hd.Value); err != nil {
			return fail("%v", err)
		}
		switch http.CanonicalHeaderKey(hd.Key) {
		case "Id":
			hasID = true
		case "Content-Type":
			hasType = true
		}
	}
	if !hasID {
		h.Set("Id", m.ID)
	}
	for _, hd := range m.Headers {
		h.Add(hd.Key, hd.Value)
	}
	switch {
	case hasType || len(m.Value) == 0:
	case json.Valid(m.Value):
		h.Set("Content-Type", "application/json")
	default:
		h.Set("Content-Type", "application/octet-stream")
	}
	if len(m.Key) > 0 {
		if k := string(m.Key); cleanValue(k) {
			h.Set(KeyHeader, k)
		} else {
			h.Set(KeyBase64Header, base64.StdEncoding.EncodeToString(m.Key))
		}
	}
	if h.Get("User-Agent") == "" {
		h.Set("User-Agent", s.cfg.UserAgent)
	}
	ts := strconv.FormatInt(s.now().Unix(), 10)
	// Set directly: the specification spells them in lower case.
	h[HeaderID] = []string{m.ID}
	h[HeaderTimestamp] = []string{ts}
	h[HeaderSignature] = []string{signature(s.keys, m.ID, ts, m.Value)}

	resp, err := s.client.Do(req)
	if err != nil {
		return s.requestError(ctx, rctx, shown, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrain))
	resp.Body.Close()
	return statusError(resp, shown)
}

// requestError classifies an error of client.Do.
func (s *Sink) requestError(ctx, rctx context.Context, shown string, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // its message repeats the whole URL
	}
	var be *BlockedAddressError
	switch {
	case errors.As(err, &be):
		return sink.Permanent(fmt.Errorf("webhooksink: POST %s: %w", shown, be))
	case ctx.Err() != nil:
		return fmt.Errorf("webhooksink: POST %s: %w", shown, context.Cause(ctx))
	case rctx.Err() != nil:
		return fmt.Errorf("webhooksink: POST %s: no response within %v (Config.Timeout): %v", shown, s.cfg.Timeout, err)
	default:
		return fmt.Errorf("webhooksink: POST %s: %w", shown, err)
	}
}

// StatusError is the error for a response that is not 2xx.
type StatusError struct {
	// StatusCode is the response's status code.
	StatusCode int
	// URL is the endpoint, without user info and query.
	URL string
	// Delay is what the response's Retry-After header asked for (at most
	// MaxRetryAfter); 0 when it had none.
	Delay time.Duration
	// Location is a redirect's target, without user info and query.
	Location string
}

// Error describes the response.
func (e *StatusError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "webhooksink: POST %s: %d %s", e.URL, e.StatusCode, http.StatusText(e.StatusCode))
	switch {
	case e.StatusCode >= 300 && e.StatusCode < 400:
		b.WriteString(": redirects are not followed")
		if e.Location != "" {
			fmt.Fprintf(&b, " (to %s); configure the final URL", e.Location)
		}
	case e.Delay > 0:
		fmt.Fprintf(&b, " (Retry-After %v)", e.Delay)
	}
	return b.String()
}

// RetryAfter returns Delay.
func (e *StatusError) RetryAfter() time.Duration { return e.Delay }

// RetryAfterError is implemented by errors that know how long to wait before
// trying again, such as a *StatusError from a 429 or 503 response with a
// Retry-After header.
type RetryAfterError interface {
	error
	RetryAfter() time.Duration
}

// RetryAfter returns the delay a RetryAfterError in err's chain asks for,
// and whether it asks for one (a positive delay).
func RetryAfter(err error) (time.Duration, bool) {
	var ra RetryAfterError
	if errors.As(err, &ra) && ra.RetryAfter() > 0 {
		return ra.RetryAfter(), true
	}
	return 0, false
}

// statusError classifies a response.
func statusError(resp *http.Response, shown string) error {
	code := resp.StatusCode
	if code >= 200 && code < 300 {
		return nil
	}
	e := &StatusError{StatusCode: code, URL: shown}
	switch {
	case code >= 300 && code < 400:
		if loc, err := resp.Location(); err == nil {
			e.Location = redact(loc)
		}
		return sink.Permanent(e)
	case code == http.StatusRequestTimeout, code == http.StatusTooManyRequests, code >= 500 && code < 600:
		e.Delay = parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
		return e
	case code >= 400 && code < 500:
		return sink.Permanent(e)
	default:
		return e
	}
}

// parseRetryAfter parses a Retry-After value: seconds or an HTTP date.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	var d time.Duration
	if n, err := strconv.ParseUint(v, 10, 64); err == nil || errors.Is(err, strconv.ErrRange) {
		d = MaxRetryAfter
		if n < uint64(MaxRetryAfter/time.Second) {
			d = time.Duration(n) * time.Second
		}
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	}
	return min(max(d, 0), MaxRetryAfter)
}

// BlockedAddressError is the (permanent) error for a connection the sink
// refused to make because the address is not public.
type BlockedAddressError struct {
	// Addr is the refused address.
	Addr netip.Addr
	// Reason names its kind, such as "loopback address".
	Reason string
}

// Error explains the refusal and how to allow the address.
func (e *BlockedAddressError) Error() string {
	how := "set Config.AllowPrivate or list it in Config.Allow"
	if isMetadata(e.Addr) {
		how = "list it in Config.Allow (Config.AllowPrivate does not cover cloud metadata endpoints)"
	}
	return fmt.Sprintf("refusing to connect to %s, a %s, to prevent request forgery against internal services; to deliver webhooks there, %s", e.Addr, e.Reason, how)
}

// control is the dialer's Control function: it refuses non-public
// addresses after resolution, right before connecting.
func (s *Sink) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("webhooksink: cannot check the address %q being dialed: %v", address, err)
	}
	ip := ap.Addr().WithZone("").Unmap()
	if reason := s.blocked(ip); reason != "" {
		return &BlockedAddressError{Addr: ip, Reason: reason}
	}
	return nil
}

// blocked returns why the sink must not connect to ip, or "".
func (s *Sink) blocked(ip netip.Addr) string {
	for _, p := range s.cfg.Allow {
		if p.Contains(ip) {
			return ""
		}
	}
	if isMetadata(ip) {
		return "cloud metadata endpoint"
	}
	if s.cfg.AllowPrivate {
		return ""
	}
	return nonPublic(ip)
}

// metadata are cloud metadata endpoints (AWS, GCP, Azure, Oracle, ECS, EKS,
// Alibaba).
var metadata = []netip.Addr{
	netip.MustParseAddr("169.254.169.254"),
	netip.MustParseAddr("169.254.170.2"),
	netip.MustParseAddr("169.254.170.23"),
	netip.MustParseAddr("100.100.100.200"),
	netip.MustParseAddr("fd00:ec2::254"),
	netip.MustParseAddr("fd00:ec2::23"),
}

func isMetadata(ip netip.Addr) bool {
	for _, m := range metadata {
		if ip == m {
			return true
		}
	}
	return false
}

var nonPublicPrefixes = []struct {
	p      netip.Prefix
	reason string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), `"this network" address`},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared (CGNAT) address"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol address"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking address"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved address"},
	{netip.MustParsePrefix("::/96"), "IPv4-compatible (deprecated) address"},
	{netip.MustParsePrefix("fec0::/10"), "site-local (deprecated) address"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "local-use NAT64 address"},
	{netip.MustParsePrefix("100::/64"), "discard-only address"},
}

var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
)

// nonPublic returns what kind of non-public address ip is, or "".
func nonPublic(ip netip.Addr) string {
	switch {
	case !ip.IsValid():
		return "invalid address"
	case ip.IsUnspecified():
		return "unspecified address"
	case ip.IsLoopback():
		return "loopback address"
	case ip.IsPrivate():
		return "private address"
	case ip.IsLinkLocalUnicast():
		return "link-local address"
	case ip.IsMulticast():
		return "multicast address"
	}
	for _, np := range nonPublicPrefixes {
		if np.p.Contains(ip) {
			return np.reason
		}
	}
	b := ip.As16()
	switch {
	case nat64.Contains(ip):
		if r := nonPublic(netip.AddrFrom4([4]byte(b[12:16]))); r != "" {
			return r + " in a NAT64 address"
		}
	case sixToFour.Contains(ip):
		if r := nonPublic(netip.AddrFrom4([4]byte(b[2:6]))); r != "" {
			return r + " in a 6to4 address"
		}
	}
	return ""
}

// Close stops the sink: later Publish calls fail with ErrClosed, requests in
// flight are cancelled (their messages fail with ErrClosed), and once the
// Publish calls have returned, idle connections are closed. Close is
// idempotent and returns nil.
func (s *Sink) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.cancel(ErrClosed)
		s.inflight.Wait()
		s.transport.CloseIdleConnections()
	})
	return nil
}

// signature returns the webhook-signature header value: one "v1,<base64>"
// per key, space-separated.
func signature(keys [][]byte, id, timestamp string, body []byte) string {
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString("v1,")
		b.WriteString(base64.StdEncoding.EncodeToString(mac(k, id, timestamp, body)))
	}
	return b.String()
}

// mac is HMAC-SHA256(key, id.timestamp.body).
func mac(key []byte, id, timestamp string, body []byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(id))
	h.Write([]byte{'.'})
	h.Write([]byte(timestamp))
	h.Write([]byte{'.'})
	h.Write(body)
	return h.Sum(nil)
}

// Sign returns the webhook-signature header value for a message with the
// given id, timestamp and body: one "v1,<base64>" signature per secret,
// space-separated. It is what the sink sends, for tests and other senders.
func Sign(secrets []string, id string, timestamp time.Time, body []byte) (string, error) {
	keys, err := parseSecrets(secrets)
	if err != nil {
		return "", err
	}
	return signature(keys, id, strconv.FormatInt(timestamp.Unix(), 10), body), nil
}

func parseSecrets(secrets []string) ([][]byte, error) {
	if len(secrets) == 0 {
		return nil, errors.New("webhooksink: no secrets")
	}
	keys := make([][]byte, len(secrets))
	for i, sec := range secrets {
		k, err := parseSecret(sec)
		if err != nil {
			return nil, fmt.Errorf("webhooksink: secrets[%d]: %v", i, err)
		}
		keys[i] = k
	}
	return keys, nil
}

// Errors of Verify; the error it returns wraps one of them.
var (
	// ErrMissingHeaders: webhook-id, webhook-timestamp or webhook-signature
	// is missing or empty.
	ErrMissingHeaders = errors.New("webhooksink: missing webhook-id, webhook-timestamp or webhook-signature header")
	// ErrTimestamp: webhook-timestamp is not a Unix time within the
	// tolerance of now.
	ErrTimestamp = errors.New("webhooksink: webhook-timestamp is invalid or outside the tolerance")
	// ErrSignature: no signature in webhook-signature matches any secret.
	ErrSignature = errors.New("webhooksink: no valid signature")
)

// Verify checks a webhook request as a receiver: that headers hold a
// webhook-id, a webhook-timestamp within tolerance of now (DefaultTolerance
// when tolerance is 0 or less; time.Now() when now is zero) and a
// webhook-signature with at least one "v1,<base64>" signature (of possibly
// several, space-separated, or in several header lines) that is the
// HMAC-SHA256 of id.timestamp.body under one of secrets ("whsec_<base64>",
// the prefix optional). Signatures are compared in constant time; other
// versions (such as "v1a,") are ignored. It returns nil or an error wrapping
// ErrMissingHeaders, ErrTimestamp or ErrSignature, or one about an invalid
// secret.
//
// body must be the raw request body, byte for byte, before any parsing.
func Verify(secrets []string, headers http.Header, body []byte, tolerance time.Duration, now time.Time) error {
	keys, err := parseSecrets(secrets)
	if err != nil {
		return err
	}
	// Canonical keys, as servers parse them, or the lower-case ones the
	// sink sets when headers come from an outgoing request.
	values := func(k string) []string {
		if v := headers.Values(k); len(v) > 0 {
			return v
		}
		return headers[k]
	}
	first := func(k string) string {
		if v := values(k); len(v) > 0 {
			return v[0]
		}
		return ""
	}
	id := first(HeaderID)
	ts := first(HeaderTimestamp)
	sigs := values(HeaderSignature)
	if id == "" || ts == "" || len(sigs) == 0 {
		return ErrMissingHeaders
	}
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	if now.IsZero() {
		now = time.Now()
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || ts[0] == '+' || ts[0] == '-' {
		return fmt.Errorf("%w: %q is not a number of seconds", ErrTimestamp, ts)
	}
	tol := int64(tolerance / time.Second)
	if n := now.Unix(); sec < n-tol || sec > n+tol {
		return fmt.Errorf("%w: %d is more than %v away from now (%d)", ErrTimestamp, sec, tolerance, n)
	}
	want := make([][]byte, len(keys))
	for i, k := range keys {
		want[i] = mac(k, id, ts, body)
	}
	ok := 0
	for _, line := range sigs {
		for _, sig := range strings.Fields(line) {
			b64, found := strings.CutPrefix(sig, "v1,")
			if !found {
				continue
			}
			got, err := base64.StdEncoding.DecodeString(b64)
			if err != nil {
				continue
			}
			for _, w := range want {
				if hmac.Equal(got, w) {
					ok++
				}
			}
		}
	}
	if ok == 0 {
		return ErrSignature
	}
	return nil
}

// System names the broker as OpenTelemetry's messaging.system attribute
// does: "webhook".
func (s *Sink) System() string { return "webhook" }
