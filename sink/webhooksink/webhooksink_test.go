package webhooksink

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/sink"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var (
	secret1  = "whsec_" + base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))
	secret2  = "whsec_" + base64.StdEncoding.EncodeToString([]byte("the second, rotated secret key!!"))
	loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
)

// request is one request a test server received.
type request struct {
	Path   string
	Header http.Header
	Body   []byte
	At     time.Time
}

// server is a test endpoint that records requests and answers with the
// status its answer function returns (200 by default).
type server struct {
	*httptest.Server
	mu       sync.Mutex
	reqs     []request
	answer   func(w http.ResponseWriter, r *http.Request, n int) // n: 0-based request number
	inflight atomic.Int32
	maxIn    atomic.Int32
}

func newServer(t *testing.T, answer func(w http.ResponseWriter, r *http.Request, n int)) *server {
	s := &server{answer: answer}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in := s.inflight.Add(1)
		defer s.inflight.Add(-1)
		for {
			m := s.maxIn.Load()
			if in <= m || s.maxIn.CompareAndSwap(m, in) {
				break
			}
		}
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		n := len(s.reqs)
		s.reqs = append(s.reqs, request{Path: r.URL.EscapedPath(), Header: r.Header.Clone(), Body: body, At: time.Now()})
		s.mu.Unlock()
		if s.answer != nil {
			s.answer(w, r, n)
		}
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *server) requests() []request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.reqs)
}

// newSink returns a sink allowed to reach 127.0.0.1, closed when the test
// ends.
func newSink(t *testing.T, cfg Config) *Sink {
	t.Helper()
	if cfg.Secrets == nil {
		cfg.Secrets = []string{secret1}
	}
	if cfg.Allow == nil && !cfg.AllowPrivate {
		cfg.Allow = loopback
	}
	s, err := New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func msg(id, dest, key, value string, headers ...string) sink.Message {
	m := sink.Message{ID: id, Destination: dest, Value: []byte(value)}
	if key != "" {
		m.Key = []byte(key)
	}
	if value == "" {
		m.Value = nil
	}
	for i := 0; i+1 < len(headers); i += 2 {
		m.Headers = append(m.Headers, sink.Header{Key: headers[i], Value: headers[i+1]})
	}
	return m
}

func requireNoErrors(t *testing.T, errs []error) {
	t.Helper()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
}

func TestDeliverySignedWithRotatedSecrets(t *testing.T) {
	srv := newServer(t, nil)
	s := newSink(t, Config{URL: srv.URL + "/hooks/${destination}", Secrets: []string{secret1, secret2},
		Header: http.Header{"Authorization": {"Bearer t0ken"}}})
	msgs := []sink.Message{
		msg("evt-1", "orders.created", "order-1", `{"total": 5}`,
			"id", "evt-1", "type", "order.created", "type", "again", "traceparent", "00-abc-def-01", "x-empty", ""),
		msg("evt-2", "orders/eu?x", "\x00binary", "not json \xff"),
		msg("evt-3", "orders.created", "", ""),
		msg("evt-4", "orders.created", "k", `"s"`, "content-type", "application/vnd.custom+json"),
	}
	requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), msgs))
	reqs := srv.requests()
	if len(reqs) != len(msgs) {
		t.Fatalf("server received %d requests, want %d", len(reqs), len(msgs))
	}
	byID := map[string]request{}
	for _, r := range reqs {
		byID[r.Header.Get(HeaderID)] = r
	}
	for _, m := range msgs {
		r, ok := byID[m.ID]
		if !ok {
			t.Fatalf("no request with webhook-id %q", m.ID)
		}
		if !bytes.Equal(r.Body, m.Value) {
			t.Errorf("%s: body %q, want %q", m.ID, r.Body, m.Value)
		}
		// Verifies with both secrets, and with each alone (rotation).
		for _, secrets := range [][]string{{secret1, secret2}, {secret1}, {secret2}} {
			if err := Verify(secrets, r.Header, r.Body, 0, time.Time{}); err != nil {
				t.Errorf("%s: Verify with %d secret(s): %v", m.ID, len(secrets), err)
			}
		}
		if err := Verify([]string{NewSecret()}, r.Header, r.Body, 0, time.Time{}); !errors.Is(err, ErrSignature) {
			t.Errorf("%s: Verify with an unrelated secret: %v, want ErrSignature", m.ID, err)
		}
		if sigs := strings.Fields(r.Header.Get(HeaderSignature)); len(sigs) != 2 || !strings.HasPrefix(sigs[0], "v1,") {
			t.Errorf("%s: webhook-signature %q, want two v1 signatures", m.ID, sigs)
		}
		ts, err := strconv.ParseInt(r.Header.Get(HeaderTimestamp), 10, 64)
		if err != nil || time.Since(time.Unix(ts, 0)).Abs() > 5*time.Second {
			t.Errorf("%s: webhook-timestamp %q", m.ID, r.Header.Get(HeaderTimestamp))
		}
		if got := r.Header.Get("Authorization"); got != "Bearer t0ken" {
			t.Errorf("%s: Authorization %q", m.ID, got)
		}
		if got := r.Header.Get("User-Agent"); got != DefaultUserAgent {
			t.Errorf("%s: User-Agent %q", m.ID, got)
		}
		if got := r.Header.Values("Id"); !slices.Equal(got, []string{m.ID}) {
			t.Errorf("%s: Id headers %q, want exactly [%q]", m.ID, got, m.ID)
		}
	}

	r := byID["evt-1"]
	if r.Path != "/hooks/orders.created" || r.Header.Get("Content-Type") != "application/json" ||
		r.Header.Get(KeyHeader) != "order-1" || !slices.Equal(r.Header.Values("Type"), []string{"order.created", "again"}) ||
		r.Header.Get("Traceparent") != "00-abc-def-01" || !slices.Equal(r.Header.Values("X-Empty"), []string{""}) {
		t.Errorf("evt-1: path %s headers %v", r.Path, r.Header)
	}
	r = byID["evt-2"]
	if r.Path != "/hooks/orders%2Feu%3Fx" || r.Header.Get("Content-Type") != "application/octet-stream" ||
		r.Header.Get(KeyHeader) != "" || r.Header.Get(KeyBase64Header) != base64.StdEncoding.EncodeToString([]byte("\x00binary")) {
		t.Errorf("evt-2: path %s headers %v", r.Path, r.Header)
	}
	r = byID["evt-3"]
	if r.Header.Get("Content-Type") != "" || r.Header.Get(KeyHeader) != "" || len(r.Body) != 0 {
		t.Errorf("evt-3: headers %v body %q", r.Header, r.Body)
	}
	if got := byID["evt-4"].Header.Values("Content-Type"); !slices.Equal(got, []string{"application/vnd.custom+json"}) {
		t.Errorf("evt-4: Content-Type %q, want the message's own", got)
	}
}

func TestURLsOverride(t *testing.T) {
	a, b := newServer(t, nil), newServer(t, nil)
	s := newSink(t, Config{URL: a.URL + "/all?d=${destination}", URLs: map[string]string{"special": b.URL + "/fixed"}})
	requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), []sink.Message{msg("1", "x y", "", "{}"), msg("2", "special", "", "{}")}))
	if ra, rb := a.requests(), b.requests(); len(ra) != 1 || len(rb) != 1 || rb[0].Path != "/fixed" {
		t.Fatalf("requests: %v / %v", ra, rb)
	}

	only := newSink(t, Config{URLs: map[string]string{"special": b.URL + "/fixed"}})
	errs := only.Publish(testenv.Context(t, 30*time.Second), []sink.Message{msg("3", "other", "", "{}")})
	if !sink.IsPermanent(errs[0]) || !strings.Contains(errs[0].Error(), `no endpoint for destination "other"`) {
		t.Fatalf("unknown destination: %v", errs[0])
	}
}

func TestRetryAfter500GetsSameIDAndFreshSignature(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 0 {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	s := newSink(t, Config{URL: srv.URL + "/${destination}"})
	// The sink's clock, so that the retry comes a second later without
	// waiting for one.
	var clock atomic.Int64
	clock.Store(time.Now().Unix())
	s.now = func() time.Time { return time.Unix(clock.Load(), 0) }
	m := []sink.Message{msg("evt-retry", "orders", "k", `{"a":1}`)}
	errs := s.Publish(testenv.Context(t, 30*time.Second), m)
	if errs[0] == nil || sink.IsPermanent(errs[0]) || sink.IsUnavailable(errs[0]) {
		t.Fatalf("500: got %v, want a transient (not unavailable) error", errs[0])
	}
	var se *StatusError
	if !errors.As(errs[0], &se) || se.StatusCode != 500 {
		t.Fatalf("500: %v is not a *StatusError", errs[0])
	}
	clock.Add(1) // a second later, so the timestamp changes
	requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), m))
	reqs := srv.requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests, want 2", len(reqs))
	}
	for i, r := range reqs {
		if r.Header.Get(HeaderID) != "evt-retry" {
			t.Fatalf("attempt %d: webhook-id %q", i, r.Header.Get(HeaderID))
		}
		if err := Verify([]string{secret1}, r.Header, r.Body, time.Minute, time.Now()); err != nil {
			t.Fatalf("attempt %d: %v", i, err)
		}
	}
	if reqs[0].Header.Get(HeaderTimestamp) == reqs[1].Header.Get(HeaderTimestamp) ||
		reqs[0].Header.Get(HeaderSignature) == reqs[1].Header.Get(HeaderSignature) {
		t.Fatal("the retry reused the first attempt's timestamp and signature")
	}
	// The first attempt's signature does not cover the second's timestamp.
	h := reqs[1].Header.Clone()
	h.Set(HeaderSignature, reqs[0].Header.Get(HeaderSignature))
	if err := Verify([]string{secret1}, h, reqs[1].Body, time.Minute, time.Now()); !errors.Is(err, ErrSignature) {
		t.Fatalf("replayed signature with a new timestamp: %v", err)
	}
}

func TestStatusClassification(t *testing.T) {
	date := time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)
	for _, tc := range []struct {
		status     int
		retryAfter string
		permanent  bool
		delay      time.Duration // minimum
	}{
		{429, "7", false, 7 * time.Second},
		{503, date, false, 80 * time.Second},
		{503, "", false, 0},
		{500, "soon", false, 0},
		{408, "", false, 0},
		{502, "999999999999", false, MaxRetryAfter},
		{404, "", true, 0},
		{400, "", true, 0},
		{401, "", true, 0},
		{410, "", true, 0},
		{413, "", true, 0},
	} {
		t.Run(fmt.Sprintf("%d_%s", tc.status, tc.retryAfter), func(t *testing.T) {
			srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
				if tc.retryAfter != "" {
					w.Header().Set("Retry-After", tc.retryAfter)
				}
				w.WriteHeader(tc.status)
				fmt.Fprint(w, "response body that is discarded")
			})
			s := newSink(t, Config{URL: srv.URL + "/x"})
			err := s.Publish(testenv.Context(t, 30*time.Second), []sink.Message{msg("1", "d", "", "{}")})[0]
			if err == nil || sink.IsPermanent(err) != tc.permanent || sink.IsUnavailable(err) {
				t.Fatalf("got %v (permanent %v), want permanent=%v", err, sink.IsPermanent(err), tc.permanent)
			}
			if strings.Contains(err.Error(), "discarded") {
				t.Fatalf("the error holds the response body: %v", err)
			}
			d, ok := RetryAfter(err)
			if ok != (tc.delay > 0) || d < tc.delay || (tc.delay > 0 && d > tc.delay+15*time.Second && tc.delay != MaxRetryAfter) {
				t.Fatalf("RetryAfter(%v) = %v, %v; want at least %v", err, d, ok, tc.delay)
			}
			t.Logf("%v", err)
		})
	}
}

func TestRedirectNotFollowed(t *testing.T) {
	var followed atomic.Bool
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if r.URL.Path == "/new" {
			followed.Store(true)
			return
		}
		http.Redirect(w, r, "/new?token=secret", http.StatusMovedPermanently)
	})
	s := newSink(t, Config{URL: srv.URL + "/old"})
	err := s.Publish(testenv.Context(t, 30*time.Second), []sink.Message{msg("1", "d", "", "{}")})[0]
	if !sink.IsPermanent(err) || !strings.Contains(err.Error(), "301") || !strings.Contains(err.Error(), "redirects are not followed") {
		t.Fatalf("got %v, want a permanent redirect error", err)
	}
	if strings.Contains(err.Error(), "secret") {
		t.Fatalf("the error shows the redirect's query: %v", err)
	}
	if followed.Load() || len(srv.requests()) != 1 {
		t.Fatal("the redirect was followed")
	}
	t.Logf("%v", err)
}

func TestDefaultRefusesLoopback(t *testing.T) {
	srv := newServer(t, nil)
	s, err := New(&Config{URL: srv.URL + "/x", Secrets: []string{secret1}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.Publish(testenv.Context(t, 30*time.Second), []sink.Message{msg("1", "d", "", "{}")})[0]
	var be *BlockedAddressError
	if !sink.IsPermanent(err) || !errors.As(err, &be) || be.Addr != netip.MustParseAddr("127.0.0.1") {
		t.Fatalf("got %v, want a permanent *BlockedAddressError for 127.0.0.1", err)
	}
	for _, want := range []string{"refusing to connect to 127.0.0.1", "loopback address", "Config.AllowPrivate"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q does not say %q", err, want)
		}
	}
	if n := len(srv.requests()); n != 0 {
		t.Fatalf("the server received %d requests", n)
	}
	t.Logf("%v", err)

	// AllowPrivate and an allow-list both let it through.
	for _, cfg := range []Config{{AllowPrivate: true}, {Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}} {
		cfg.URL = srv.URL + "/x"
		requireNoErrors(t, newSink(t, cfg).Publish(testenv.Context(t, 30*time.Second), []sink.Message{msg("1", "d", "", "{}")}))
	}
}

// fakeDNS answers every A query with 127.0.0.1 and AAAA queries with
// nothing: a public-looking name that resolves to loopback, as after DNS
// rebinding.
func fakeDNS(t *testing.T) *net.Resolver {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { pc.Close(); wg.Wait() })
	wg.Go(func() {
		buf := make([]byte, 1500)
		for {
			n, addr, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			q := buf[:n]
			if len(q) < 12 {
				continue
			}
			// The question: labels up to the root, then type and class.
			end := 12
			for end < len(q) && q[end] != 0 {
				end += int(q[end]) + 1
			}
			end += 5
			if end > len(q) {
				continue
			}
			qtype := binary.BigEndian.Uint16(q[end-4:])
			resp := append([]byte(nil), q[:2]...)
			resp = append(resp, 0x81, 0x80, 0, 1, 0, 0, 0, 0, 0, 0) // response, recursion available; 1 question
			resp = append(resp, q[12:end]...)
			if qtype == 1 { // A
				resp[7] = 1 // one answer
				resp = append(resp, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 127, 0, 0, 1)
			}
			pc.WriteTo(resp, addr)
		}
	})
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", pc.LocalAddr().String())
	}}
}

func TestHostnameResolvingToLoopbackRefusedAtConnect(t *testing.T) {
	srv := newServer(t, nil)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	res := fakeDNS(t)
	target := "http://rebound.example.com:" + port + "/x"

	s, err := New(&Config{URL: target, Secrets: []string{secret1}, Resolver: res})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.Publish(testenv.Context(t, 30*time.Second), []sink.Message{msg("1", "d", "", "{}")})[0]
	var be *BlockedAddressError
	if !sink.IsPermanent(err) || !errors.As(err, &be) || be.Addr.String() != "127.0.0.1" {
		t.Fatalf("got %v, want a permanent refusal of 127.0.0.1", err)
	}
	if !strings.Contains(err.Error(), "POST http://rebound.example.com:"+port+"/x") {
		t.Fatalf("error %q does not name the URL", err)
	}
	t.Logf("%v", err)

	// The same resolver with loopback allowed: the name did resolve to the
	// test server, so the refusal above happened at connect time.
	ok := newSink(t, Config{URL: target, Resolver: res})
	requireNoErrors(t, ok.Publish(testenv.Context(t, 30*time.Second), []sink.Message{msg("1", "d", "", "{}")}))
	if n := len(srv.requests()); n != 1 {
		t.Fatalf("server received %d requests, want 1", n)
	}

	// "localhost" from /etc/hosts is refused too.
	l, err := New(&Config{URL: "http://localhost:" + port + "/x", Secrets: []string{secret1}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Publish(testenv.Context(t, 30*time.Second), []sink.Message{msg("1", "d", "", "{}")})[0]; !errors.As(err, &be) {
		t.Fatalf("localhost: %v", err)
	}
}

func TestBlockedAddresses(t *testing.T) {
	def, _ := New(&Config{URL: "https://example.com", Secrets: []string{secret1}})
	priv, _ := New(&Config{URL: "https://example.com", Secrets: []string{secret1}, AllowPrivate: true})
	list, _ := New(&Config{URL: "https://example.com", Secrets: []string{secret1},
		Allow: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("169.254.169.254/32")}})
	for _, s := range []*Sink{def, priv, list} {
		defer s.Close()
	}
	for _, tc := range []struct {
		ip                     string
		dflt, private, allowed bool // allowed by default / with AllowPrivate / with the list
	}{
		{"93.184.216.34", true, true, true},
		{"2606:2800:220:1:248:1893:25c8:1946", true, true, true},
		{"8.8.8.8", true, true, true},
		{"127.0.0.1", false, true, false},
		{"127.1.2.3", false, true, false},
		{"::1", false, true, false},
		{"10.0.0.1", false, true, false},
		{"10.1.2.3", false, true, true},
		{"172.16.5.4", false, true, false},
		{"192.168.1.1", false, true, false},
		{"fc00::1", false, true, false},
		{"fd12:3456::1", false, true, false},
		{"169.254.1.1", false, true, false},
		{"fe80::1", false, true, false},
		{"0.0.0.0", false, true, false},
		{"::", false, true, false},
		{"224.0.0.1", false, true, false},
		{"ff02::1", false, true, false},
		{"100.64.0.1", false, true, false},
		{"100.127.255.254", false, true, false},
		{"255.255.255.255", false, true, false},
		{"198.18.0.1", false, true, false},
		{"64:ff9b::7f00:1", false, true, false},  // NAT64 of 127.0.0.1
		{"64:ff9b::5db8:d822", true, true, true}, // NAT64 of a public address
		{"2002:7f00:1::1", false, true, false},   // 6to4 of 127.0.0.1
		{"169.254.169.254", false, false, true},  // metadata: not even with AllowPrivate
		{"fd00:ec2::254", false, false, false},   // metadata
		{"100.100.100.200", false, false, false}, // Alibaba metadata
		{"::ffff:169.254.169.254", false, false, true},
	} {
		ip := netip.MustParseAddr(tc.ip).Unmap()
		for i, s := range []*Sink{def, priv, list} {
			want := []bool{tc.dflt, tc.private, tc.allowed}[i]
			if got := s.blocked(ip) == ""; got != want {
				t.Errorf("%s with config %d: allowed=%v, want %v (%q)", tc.ip, i, got, want, s.blocked(ip))
			}
		}
	}
	if err := def.control("tcp", "[::ffff:127.0.0.1]:80", nil); err == nil {
		t.Error("control allowed an IPv4-mapped loopback address")
	}
	if err := def.control("tcp", "[fe80::1%eth0]:80", nil); err == nil {
		t.Error("control allowed a zoned link-local address")
	}
	if err := def.control("tcp", "93.184.216.34:443", nil); err != nil {
		t.Errorf("control refused a public address: %v", err)
	}
	e := &BlockedAddressError{Addr: netip.MustParseAddr("169.254.169.254"), Reason: "cloud metadata endpoint"}
	if !strings.Contains(e.Error(), "Config.AllowPrivate does not cover") {
		t.Errorf("metadata error: %v", e)
	}
}

func TestCancelledContext(t *testing.T) {
	t.Run("before", func(t *testing.T) {
		srv := newServer(t, nil)
		s := newSink(t, Config{URL: srv.URL + "/x"})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		for i, err := range s.Publish(ctx, []sink.Message{msg("1", "d", "a", "{}"), msg("2", "d", "b", "{}")}) {
			if !errors.Is(err, context.Canceled) || sink.IsPermanent(err) {
				t.Fatalf("message %d: %v", i, err)
			}
		}
		if len(srv.requests()) != 0 {
			t.Fatal("a request was sent with a cancelled context")
		}
	})
	t.Run("during", func(t *testing.T) {
		// The endpoint cancels the ctx when the first request reaches it,
		// so that Publish is mid-flight, and holds every request.
		ctx, cancel := context.WithCancel(testenv.Context(t, 30*time.Second))
		defer cancel()
		var cancelledAt atomic.Int64 // UnixNano
		release := make(chan struct{})
		srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
			if n == 0 {
				cancelledAt.Store(time.Now().UnixNano())
				cancel()
			}
			select {
			case <-release:
			case <-r.Context().Done():
			}
		})
		defer close(release)
		s := newSink(t, Config{URL: srv.URL + "/x"})
		errs := s.Publish(ctx, []sink.Message{msg("1", "d", "a", "{}"), msg("2", "d", "a", "{}"), msg("3", "d", "b", "{}")})
		at := cancelledAt.Load()
		if at == 0 {
			t.Fatalf("no request reached the endpoint: %v", errs)
		}
		if d := time.Since(time.Unix(0, at)); d > 2*time.Second {
			t.Fatalf("Publish returned %v after the cancel", d)
		}
		for i, err := range errs {
			if !errors.Is(err, context.Canceled) || sink.IsPermanent(err) {
				t.Fatalf("message %d: %v", i, err)
			}
		}
	})
}

func TestTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	s := newSink(t, Config{URL: srv.URL + "/x", Timeout: 200 * time.Millisecond})
	start := time.Now()
	err := s.Publish(testenv.Context(t, 30*time.Second), []sink.Message{msg("1", "d", "", "{}")})[0]
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("took %v", d)
	}
	if err == nil || sink.IsPermanent(err) || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no response within 200ms") {
		t.Fatalf("got %v, want a transient timeout error", err)
	}
}

func TestOrderPerKeyAndConcurrency(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		time.Sleep(time.Duration(n%3) * time.Millisecond)
	})
	s := newSink(t, Config{URL: srv.URL + "/x", Concurrency: 3})
	var msgs []sink.Message
	for i := range 120 {
		key := fmt.Sprint("k", (i*7)%6)
		msgs = append(msgs, msg(fmt.Sprint(i), "d", key, fmt.Sprintf(`{"i":%d}`, i)))
	}
	requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), msgs))
	last := map[string]int{}
	for _, r := range srv.requests() {
		i, _ := strconv.Atoi(r.Header.Get(HeaderID))
		k := r.Header.Get(KeyHeader)
		if prev, ok := last[k]; ok && prev > i {
			t.Fatalf("key %s: message %d delivered after %d", k, i, prev)
		}
		last[k] = i
	}
	if m := srv.maxIn.Load(); m > 3 || m < 2 {
		t.Fatalf("at most %d requests in flight, want 2..3 (Concurrency 3)", m)
	}
}

func TestFailureStopsTheKey(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		switch r.Header.Get(HeaderID) {
		case "a1":
			w.WriteHeader(http.StatusServiceUnavailable)
		case "b1":
			w.WriteHeader(http.StatusNotFound)
		}
	})
	s := newSink(t, Config{URL: srv.URL + "/x", Concurrency: 1})
	msgs := []sink.Message{msg("a1", "d", "A", "{}"), msg("b1", "d", "B", "{}"), msg("a2", "d", "A", "{}"), msg("b2", "d", "B", "{}")}
	errs := s.Publish(testenv.Context(t, 30*time.Second), msgs)
	if errs[0] == nil || sink.IsPermanent(errs[0]) {
		t.Fatalf("a1: %v", errs[0])
	}
	if !sink.IsPermanent(errs[1]) {
		t.Fatalf("b1: %v", errs[1])
	}
	if errs[2] == nil || sink.IsPermanent(errs[2]) || !strings.Contains(errs[2].Error(), "earlier message with the same key failed") {
		t.Fatalf("a2: %v, want a transient not-sent error", errs[2])
	}
	if errs[3] != nil {
		t.Fatalf("b2 (after a permanent failure of its key): %v", errs[3])
	}
	var ids []string
	for _, r := range srv.requests() {
		ids = append(ids, r.Header.Get(HeaderID))
	}
	if !slices.Equal(ids, []string{"a1", "b1", "b2"}) {
		t.Fatalf("requests %q, want a1 b1 b2", ids)
	}
}

func TestInvalidMessagesArePermanent(t *testing.T) {
	srv := newServer(t, nil)
	s := newSink(t, Config{URL: srv.URL + "/x"})
	for _, m := range []sink.Message{
		msg("", "d", "", "{}"),
		msg("a\nb", "d", "", "{}"),
		msg("1", "d", "", "{}", "bad name", "v"),
		msg("1", "d", "", "{}", "x", "line\r\nInjected: yes"),
		msg("1", "d", "", "{}", "Webhook-Signature", "v1,forged"),
		msg("1", "d", "", "{}", "host", "evil.example"),
		msg("1", "d", "", "{}", "Outbox-Key", "other"),
	} {
		err := s.Publish(testenv.Context(t, 30*time.Second), []sink.Message{m})[0]
		if !sink.IsPermanent(err) {
			t.Errorf("%+v: got %v, want a permanent error", m, err)
			continue
		}
		t.Logf("%v", err)
	}
	if n := len(srv.requests()); n != 0 {
		t.Fatalf("server received %d requests", n)
	}
}

func TestLargeResponseDiscarded(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		for range 160 { // 10 MiB
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})
	s := newSink(t, Config{URL: srv.URL + "/x"})
	requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), []sink.Message{msg("1", "d", "", "{}"), msg("2", "d", "", "{}")}))
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  *Config
		want string
	}{
		{nil, "nil Config"},
		{&Config{Secrets: []string{secret1}}, "no destination has an endpoint"},
		{&Config{URL: "https://h/x"}, "Config.Secrets is empty"},
		{&Config{URL: "https://h/x", Secrets: []string{"whsec_not base64!"}}, "Config.Secrets[0]"},
		{&Config{URL: "https://h/x", Secrets: []string{"whsec_" + base64.StdEncoding.EncodeToString([]byte("short"))}}, "fewer than 16"},
		{&Config{URL: "ftp://h/x", Secrets: []string{secret1}}, `scheme "ftp"`},
		{&Config{URL: "https://${destination}.example.com/", Secrets: []string{secret1}}, "path or query only"},
		{&Config{URL: "/relative", Secrets: []string{secret1}}, `scheme ""`},
		{&Config{URL: "https:///x", Secrets: []string{secret1}}, "no host"},
		{&Config{URL: "https://user:pw@h/x#frag", Secrets: []string{secret1}}, "fragment"},
		{&Config{URLs: map[string]string{"d": "http//missing"}, Secrets: []string{secret1}}, `Config.URLs["d"]`},
		{&Config{URL: "https://h/x", Secrets: []string{secret1}, Timeout: -1}, "Config.Timeout"},
		{&Config{URL: "https://h/x", Secrets: []string{secret1}, Concurrency: -1}, "Config.Concurrency"},
		{&Config{URL: "https://h/x", Secrets: []string{secret1}, Header: http.Header{"Content-Length": {"1"}}}, "reserved"},
		{&Config{URL: "https://h/x", Secrets: []string{secret1}, Allow: []netip.Prefix{{}}}, "Config.Allow"},
	} {
		_, err := New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v): %v, want an error containing %q", tc.cfg, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), "pw") || strings.Contains(err.Error(), "not base64!") {
			t.Errorf("error shows a credential: %v", err)
		}
	}
	sec := NewSecret()
	if !strings.HasPrefix(sec, "whsec_") {
		t.Fatal(sec)
	}
	if k, err := parseSecret(sec); err != nil || len(k) != 32 {
		t.Fatalf("NewSecret: %d bytes, %v", len(k), err)
	}
	// The prefix is optional.
	if _, err := New(&Config{URL: "https://h/x", Secrets: []string{strings.TrimPrefix(sec, "whsec_")}}); err != nil {
		t.Fatal(err)
	}
}

func TestClose(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}) // closed when the second request is at the endpoint
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 0 {
			return
		}
		if n == 1 {
			close(arrived)
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	s := newSink(t, Config{URL: srv.URL + "/x"})
	requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), []sink.Message{msg("1", "d", "", "{}")}))
	done := make(chan []error, 1)
	go func() { done <- s.Publish(context.Background(), []sink.Message{msg("2", "d", "", "{}")}) }()
	select {
	case <-arrived:
	case errs := <-done:
		t.Fatalf("Publish returned %v before its request reached the endpoint", errs)
	case <-time.After(10 * time.Second):
		t.Fatal("the second request did not reach the endpoint within 10s")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case errs := <-done:
		if !errors.Is(errs[0], ErrClosed) || sink.IsPermanent(errs[0]) {
			t.Fatalf("Publish cut short by Close: %v", errs[0])
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Publish still runs 10s after Close")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if errs := s.Publish(testenv.Context(t, 30*time.Second), []sink.Message{msg("3", "d", "", "{}")}); !errors.Is(errs[0], ErrClosed) {
		t.Fatalf("Publish after Close: %v", errs[0])
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"":                              0,
		"0":                             0,
		"120":                           2 * time.Minute,
		" 5 ":                           5 * time.Second,
		"-5":                            0,
		"1.5":                           0,
		"99999999999999999999":          MaxRetryAfter,
		"Fri, 02 Jan 2026 03:05:05 GMT": time.Minute,
		"Fri, 02 Jan 2026 03:00:00 GMT": 0, // in the past
		"Sat, 02 Jan 2027 03:00:00 GMT": MaxRetryAfter,
	} {
		if got := parseRetryAfter(v, now); got != want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", v, got, want)
		}
	}
	if d, ok := RetryAfter(sink.Permanent(&StatusError{StatusCode: 429, Delay: time.Second})); !ok || d != time.Second {
		t.Errorf("RetryAfter through Permanent: %v %v", d, ok)
	}
	if _, ok := RetryAfter(errors.New("x")); ok {
		t.Error("RetryAfter of a plain error")
	}
}

func TestRedact(t *testing.T) {
	u, _ := url.Parse("https://user:pw@hooks.example.com/a/b?token=abc")
	if got := redact(u); got != "https://hooks.example.com/a/b?redacted" {
		t.Fatal(got)
	}
}
