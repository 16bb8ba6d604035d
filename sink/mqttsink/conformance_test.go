package mqttsink

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/faultproxy"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/sinktest"
)

// conformanceLimit is the Config.MaxMessageSize of the conformance sinks.
const conformanceLimit = 256 << 10

// confEnv is one conformance test's namespace: its own destination prefix,
// a subscriber on it, and a fault proxy between the sink and Mosquitto.
type confEnv struct {
	dest  string // destination prefix
	sub   *subscriber
	proxy *faultproxy.Proxy
}

func TestConformance(t *testing.T) {
	requireBroker(t)
	env := sinktest.PerTest(func(t *testing.T) *confEnv {
		dest, filter := prefix(t)
		p, err := faultproxy.Start(brokerAddr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return &confEnv{dest: dest, sub: subscribe(t, filter, 2), proxy: p}
	})
	sinktest.Run(t, sinktest.Harness{
		New: func(t *testing.T) sink.Sink {
			e := env(t)
			return dial(t, "mqtt://"+e.proxy.Addr(), &Config{
				MaxMessageSize:       conformanceLimit,
				MaxReconnectInterval: 500 * time.Millisecond,
				AckTimeout:           5 * time.Second,
			})
		},
		Dest: func(t *testing.T, name string) string { return env(t).dest + "." + name },
		Read: func(t *testing.T, dests []string, want int) []sinktest.Received {
			e := env(t)
			// Up to 5s for want messages; the suite judges what arrived.
			_ = await.Poll(5*time.Second, func() error {
				if n := len(e.sub.received(t, dests)); n < want {
					return fmt.Errorf("%d of %d messages arrived", n, want)
				}
				return nil
			})
			// Let duplicates and stragglers show.
			time.Sleep(100 * time.Millisecond)
			return e.sub.received(t, dests)
		},
		KeyHeader: "key",
		TooLarge: func(t *testing.T, dest string) *sink.Message {
			return &sink.Message{Destination: dest, Value: bytes.Repeat([]byte("x"), conformanceLimit)}
		},
		Outage: func(t *testing.T) func() {
			p := env(t).proxy
			p.Cut()
			return p.Restore
		},
	})
}

// received decodes the envelopes that arrived for dests, in arrival order.
// The envelope's key is reported as the header "key".
func (s *subscriber) received(t *testing.T, dests []string) []sinktest.Received {
	t.Helper()
	topics := map[string]string{}
	for _, d := range dests {
		topics[strings.ReplaceAll(d, ".", "/")] = d
	}
	s.mu.Lock()
	msgs := slices.Clone(s.msgs)
	s.mu.Unlock()
	var out []sinktest.Received
	for _, m := range msgs {
		d, ok := topics[m.Topic]
		if !ok {
			continue
		}
		var e struct {
			ID            string  `json:"id"`
			Destination   string  `json:"destination"`
			Key           *string `json:"key"`
			KeyBase64     *string `json:"key_base64"`
			Headers       []struct{ Key, Value string }
			Payload       json.RawMessage `json:"payload"`
			PayloadBase64 *string         `json:"payload_base64"`
		}
		if err := json.Unmarshal(m.Payload, &e); err != nil {
			t.Errorf("topic %s: envelope %q is not JSON: %v", m.Topic, m.Payload, err)
			continue
		}
		r := sinktest.Received{ID: e.ID, Destination: d, Headers: map[string][]string{}}
		if e.Destination != d {
			r.Destination = "envelope says " + e.Destination + ", topic " + m.Topic
		}
		for _, h := range e.Headers {
			r.Headers[h.Key] = append(r.Headers[h.Key], h.Value)
		}
		switch {
		case e.KeyBase64 != nil:
			k, err := base64.StdEncoding.DecodeString(*e.KeyBase64)
			if err != nil {
				t.Errorf("key_base64: %v", err)
			}
			r.Headers["key"] = append(r.Headers["key"], string(k))
		case e.Key != nil && *e.Key != "":
			r.Headers["key"] = append(r.Headers["key"], *e.Key)
		}
		switch {
		case e.PayloadBase64 != nil:
			v, err := base64.StdEncoding.DecodeString(*e.PayloadBase64)
			if err != nil {
				t.Errorf("payload_base64: %v", err)
			}
			r.Value = v
		case string(e.Payload) != "null":
			r.Value = e.Payload
		}
		out = append(out, r)
	}
	return out
}
