package webhooksink

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/faultproxy"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/sinktest"
)

// conformanceLimit is the body size above which the conformance endpoint
// answers 413 Content Too Large.
const conformanceLimit = 1 << 20

// endpointEnv is one conformance test's receiver: an HTTP server that
// verifies and records webhooks, behind a fault proxy.
type endpointEnv struct {
	proxy  *faultproxy.Proxy
	mu     sync.Mutex
	got    []sinktest.Received
	active map[net.Conn]bool // connections with a request being read or answered
}

func TestConformance(t *testing.T) {
	env := sinktest.PerTest(func(t *testing.T) *endpointEnv {
		e := &endpointEnv{active: map[net.Conn]bool{}}
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				return
			}
			if err := Verify([]string{secret1}, r.Header, body, 0, time.Time{}); err != nil {
				t.Errorf("receiver: %v", err)
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			if len(body) > conformanceLimit {
				w.WriteHeader(http.StatusRequestEntityTooLarge)
				return
			}
			dest, err := url.PathUnescape(strings.TrimPrefix(r.URL.EscapedPath(), "/hooks/"))
			if err != nil {
				t.Errorf("receiver: path %s: %v", r.URL.EscapedPath(), err)
			}
			rec := sinktest.Received{ID: r.Header.Get(HeaderID), Destination: dest, Value: body, Headers: map[string][]string{}}
			for k, vs := range r.Header {
				rec.Headers[strings.ToLower(k)] = slices.Clone(vs)
			}
			if k := r.Header.Get(KeyBase64Header); k != "" {
				b, err := base64.StdEncoding.DecodeString(k)
				if err != nil {
					t.Errorf("receiver: %s: %v", KeyBase64Header, err)
				}
				rec.Headers[strings.ToLower(KeyHeader)] = []string{string(b)}
			}
			e.mu.Lock()
			e.got = append(e.got, rec)
			e.mu.Unlock()
			w.WriteHeader(http.StatusNoContent)
		}))
		srv.Config.ConnState = func(c net.Conn, st http.ConnState) {
			e.mu.Lock()
			defer e.mu.Unlock()
			if st == http.StateActive {
				e.active[c] = true
			} else {
				delete(e.active, c)
			}
		}
		srv.Start()
		t.Cleanup(srv.Close)
		p, err := faultproxy.Start(srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		e.proxy = p
		return e
	})
	sinktest.Run(t, sinktest.Harness{
		New: func(t *testing.T) sink.Sink {
			return newSink(t, Config{URL: "http://" + env(t).proxy.Addr() + "/hooks/${destination}", Timeout: 5 * time.Second})
		},
		Dest: func(t *testing.T, name string) string { return "conformance." + name },
		Read: func(t *testing.T, dests []string, want int) []sinktest.Received {
			e := env(t)
			// read returns what arrived, and whether a request is still
			// being received or answered.
			read := func() (out []sinktest.Received, busy bool) {
				e.mu.Lock()
				defer e.mu.Unlock()
				for _, r := range e.got {
					if slices.Contains(dests, r.Destination) {
						out = append(out, r)
					}
				}
				return out, len(e.active) > 0
			}
			// Wait up to 5s for want messages and then for the endpoint to
			// be idle, so that a duplicate the endpoint is still receiving
			// shows; the suite judges what arrived.
			var got []sinktest.Received
			_ = await.Poll(5*time.Second, func() error {
				var busy bool
				if got, busy = read(); busy {
					return errors.New("the endpoint is busy")
				}
				if len(got) < want {
					return fmt.Errorf("%d of %d messages arrived", len(got), want)
				}
				return nil
			})
			return got
		},
		KeyHeader: strings.ToLower(KeyHeader),
		TooLarge: func(t *testing.T, dest string) *sink.Message {
			return &sink.Message{Destination: dest, Key: []byte("big"), Value: make([]byte, conformanceLimit+1)}
		},
		Outage: func(t *testing.T) func() {
			p := env(t).proxy
			p.Cut()
			return p.Restore
		},
	})
}
