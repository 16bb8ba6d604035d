package mqttsink

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"go.uber.org/goleak"

	"github.com/outboxkit/outbox/internal/faultproxy"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/sink"
)

const (
	brokerAddr = "127.0.0.1:1883"
	brokerURL  = "mqtt://" + brokerAddr
	startHint  = "start it with: mosquitto -d -c /etc/mosquitto/mosquitto.conf"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// requireBroker fails the test when Mosquitto is not reachable.
func requireBroker(t testing.TB) {
	t.Helper()
	c, err := net.DialTimeout("tcp", brokerAddr, 2*time.Second)
	if err != nil {
		t.Fatalf("MQTT broker (Mosquitto) is not reachable at %s: %v; %s", brokerAddr, err, startHint)
	}
	c.Close()
}

// prefix returns a unique destination prefix ("outboxtest.<hex>") and the
// topic filter that matches everything under it.
func prefix(t testing.TB) (dest, filter string) {
	id := testenv.Hex(t)
	return "outboxtest." + id, "outboxtest/" + id + "/#"
}

// dial returns a sink on url, closed when the test ends.
func dial(t testing.TB, url string, cfg *Config) *Sink {
	t.Helper()
	requireBroker(t)
	s, err := Dial(testenv.Context(t, 30*time.Second), url, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

type received struct {
	Topic   string
	Payload []byte
	QoS     byte
}

// subscriber collects the messages of one subscription, in arrival order.
type subscriber struct {
	mu   sync.Mutex
	msgs []received
}

// subscribe subscribes a separate client (directly on the broker) to filter.
func subscribe(t testing.TB, filter string, qos byte) *subscriber {
	t.Helper()
	requireBroker(t)
	sub := &subscriber{}
	o := mqtt.NewClientOptions().AddBroker(brokerURL).SetClientID("sub" + testenv.Hex(t)).
		SetCleanSession(true).SetAutoReconnect(false).SetOrderMatters(true)
	c := mqtt.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscriber cannot connect to %s: %v; %s", brokerURL, tok.Error(), startHint)
	}
	t.Cleanup(func() { c.Disconnect(100) })
	tok := c.Subscribe(filter, qos, func(_ mqtt.Client, m mqtt.Message) {
		sub.mu.Lock()
		sub.msgs = append(sub.msgs, received{Topic: m.Topic(), Payload: bytes.Clone(m.Payload()), QoS: m.Qos()})
		sub.mu.Unlock()
	})
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe %s: %v", filter, tok.Error())
	}
	return sub
}

// wait returns the received messages once there are at least n, failing
// after timeout.
func (s *subscriber) wait(t testing.TB, n int, timeout time.Duration) []received {
	t.Helper()
	var got []received
	await.Eventually(t, timeout, func() error {
		s.mu.Lock()
		got = append([]received(nil), s.msgs...)
		s.mu.Unlock()
		if len(got) < n {
			return fmt.Errorf("subscriber received %d messages, want %d", len(got), n)
		}
		return nil
	})
	return got
}

// settle returns what arrived, after waiting a little for stragglers.
func (s *subscriber) settle(d time.Duration) []received {
	time.Sleep(d)
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]received(nil), s.msgs...)
}

func requireNoErrors(t testing.TB, errs []error, n int) {
	t.Helper()
	if len(errs) != n {
		t.Fatalf("got %d results, want %d", len(errs), n)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
}

// envelope is the JSON envelope as a consumer decodes it.
type envelope struct {
	ID            string `json:"id"`
	Destination   string `json:"destination"`
	Key           *string
	KeyBase64     string `json:"key_base64"`
	Headers       []struct{ Key, Value string }
	Payload       json.RawMessage `json:"payload"`
	PayloadBase64 *string         `json:"payload_base64"`
}

func decode(t testing.TB, b []byte) envelope {
	t.Helper()
	var e envelope
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("envelope %q is not JSON: %v", b, err)
	}
	return e
}

func TestRoundTripEnvelope(t *testing.T) {
	for _, qos := range []byte{0, 2} {
		t.Run(fmt.Sprintf("QoS=%d", qos), func(t *testing.T) {
			dest, filter := prefix(t)
			sub := subscribe(t, filter, 2)
			s := dial(t, brokerURL, &Config{QoS: qos, MaxInflight: 7})

			const n = 300
			msgs := make([]sink.Message, n)
			for i := range msgs {
				id := fmt.Sprintf("evt-%d", i)
				key := fmt.Sprintf("agg-%d", i%3)
				msgs[i] = sink.Message{
					ID:          id,
					Destination: fmt.Sprintf("%s.orders.%s", dest, key),
					Key:         []byte(key),
					Value:       fmt.Appendf(nil, `{"n": %d}`, i),
					Headers: []sink.Header{
						{Key: "id", Value: id},
						{Key: "type", Value: "order.created"},
						{Key: "trace", Value: "first"},
						{Key: "trace", Value: fmt.Sprint("second-", i)},
					},
				}
			}
			msgs[1].Value = nil                        // no payload
			msgs[2].Value = []byte{0xff, 0x00, 'x'}    // not JSON
			msgs[4].Key = []byte{0xfe, 0xff}           // not UTF-8
			msgs[5].Destination = dest + ".a..b"       // empty level
			msgs[6].Value = []byte(`"just a string"`)  // JSON string
			msgs[7].Value = []byte(" [1, 2,\n 3] \n ") // JSON with spaces

			requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), msgs), n)
			got := sub.wait(t, n, 10*time.Second)
			if extra := sub.settle(100 * time.Millisecond); len(extra) != n {
				t.Fatalf("subscriber received %d messages, want %d", len(extra), n)
			}
			for i, m := range msgs {
				r := got[i]
				wantTopic := strings.ReplaceAll(m.Destination, ".", "/")
				if r.Topic != wantTopic {
					t.Fatalf("message %d: topic %q, want %q (messages out of order?)", i, r.Topic, wantTopic)
				}
				e := decode(t, r.Payload)
				if e.ID != m.ID || e.Destination != m.Destination {
					t.Fatalf("message %d: id %q destination %q, want %q %q", i, e.ID, e.Destination, m.ID, m.Destination)
				}
				if utf8Key := e.Key; i == 4 {
					if utf8Key != nil || e.KeyBase64 != base64.StdEncoding.EncodeToString(m.Key) {
						t.Fatalf("message %d: key %v key_base64 %q", i, utf8Key, e.KeyBase64)
					}
				} else if utf8Key == nil || *utf8Key != string(m.Key) {
					t.Fatalf("message %d: key %v, want %q", i, utf8Key, m.Key)
				}
				if len(e.Headers) != len(m.Headers) {
					t.Fatalf("message %d: %d headers, want %d", i, len(e.Headers), len(m.Headers))
				}
				for j, h := range m.Headers {
					if e.Headers[j].Key != h.Key || e.Headers[j].Value != h.Value {
						t.Fatalf("message %d: header %d is %+v, want %+v", i, j, e.Headers[j], h)
					}
				}
				switch i {
				case 1:
					if string(e.Payload) != "null" || e.PayloadBase64 != nil {
						t.Fatalf("message %d: payload %s, payload_base64 %v; want null", i, e.Payload, e.PayloadBase64)
					}
				case 2:
					if e.Payload != nil || e.PayloadBase64 == nil || *e.PayloadBase64 != base64.StdEncoding.EncodeToString(m.Value) {
						t.Fatalf("message %d: payload %s payload_base64 %v", i, e.Payload, e.PayloadBase64)
					}
				default: // verbatim, less the whitespace around it
					if want := bytes.TrimSpace(m.Value); !bytes.Equal(e.Payload, want) {
						t.Fatalf("message %d: payload %q, want %q", i, e.Payload, want)
					}
				}
			}
		})
	}
}

func TestRawPayloadAndTopicReplacer(t *testing.T) {
	dest, filter := prefix(t)
	base := strings.ReplaceAll(dest, ".", "/")
	sub := subscribe(t, filter, 1)
	s := dial(t, brokerURL, &Config{RawPayload: true, TopicReplacer: strings.NewReplacer()})
	msgs := []sink.Message{
		{ID: "1", Destination: base + "/raw/a.b", Value: []byte{0, 1, 2}, Headers: []sink.Header{{Key: "id", Value: "1"}}},
		{ID: "2", Destination: base + "/raw/empty"},
	}
	requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), msgs), len(msgs))
	got := sub.wait(t, 2, 10*time.Second)
	if got[0].Topic != base+"/raw/a.b" || !bytes.Equal(got[0].Payload, []byte{0, 1, 2}) {
		t.Fatalf("got %q %q", got[0].Topic, got[0].Payload)
	}
	if got[1].Topic != base+"/raw/empty" || len(got[1].Payload) != 0 {
		t.Fatalf("got %q %q", got[1].Topic, got[1].Payload)
	}
	if got[0].QoS != 1 {
		t.Fatalf("delivered with QoS %d, want 1", got[0].QoS)
	}
}

func TestInvalidTopicIsPermanent(t *testing.T) {
	dest, filter := prefix(t)
	sub := subscribe(t, filter, 1)
	s := dial(t, brokerURL, nil)
	bad := []string{"", dest + ".+.x", dest + ".#", dest + ".a\x00b", dest + ".a\x01b", dest + ".a\u0085b",
		dest + ".\xff", dest + ".\ufffe", dest + "." + strings.Repeat("x", 70000)}
	var msgs []sink.Message
	for i, d := range bad {
		msgs = append(msgs,
			sink.Message{ID: fmt.Sprint("ok-", i), Destination: fmt.Sprintf("%s.ok.%d", dest, i), Value: []byte("{}")},
			sink.Message{ID: fmt.Sprint("bad-", i), Destination: d, Value: []byte("{}")})
	}
	errs := s.Publish(testenv.Context(t, 30*time.Second), msgs)
	for i, err := range errs {
		if i%2 == 0 {
			if err != nil {
				t.Fatalf("valid message %d failed: %v", i, err)
			}
			continue
		}
		if !sink.IsPermanent(err) || !strings.Contains(err.Error(), "invalid topic") {
			t.Fatalf("destination %.40q: got %v, want a permanent invalid-topic error", msgs[i].Destination, err)
		}
	}
	t.Logf("example: %v", errs[3])
	// The connection survived: every valid message arrived, and only those.
	if got := sub.wait(t, len(bad), 10*time.Second); len(sub.settle(100*time.Millisecond)) != len(bad) {
		t.Fatalf("subscriber received %d messages, want %d", len(got), len(bad))
	}
}

func TestTooLargeIsPermanent(t *testing.T) {
	dest, filter := prefix(t)
	sub := subscribe(t, filter, 1)
	s := dial(t, brokerURL, &Config{MaxMessageSize: 1000})
	msgs := []sink.Message{
		{ID: "a", Destination: dest + ".a", Value: []byte(`"small"`)},
		{ID: "b", Destination: dest + ".b", Value: bytes.Repeat([]byte("x"), 1000)},
		{ID: "c", Destination: dest + ".c", Value: []byte(`"small"`)},
	}
	errs := s.Publish(testenv.Context(t, 30*time.Second), msgs)
	if errs[0] != nil || errs[2] != nil {
		t.Fatalf("small messages failed: %v", errs)
	}
	if !sink.IsPermanent(errs[1]) || !strings.Contains(errs[1].Error(), "exceeds Config.MaxMessageSize") {
		t.Fatalf("got %v, want a permanent size error", errs[1])
	}
	sub.wait(t, 2, 10*time.Second)

	if _, err := normalize(&Config{MaxMessageSize: MaxMessageSize + 1}); err == nil {
		t.Fatal("MaxMessageSize above the protocol limit accepted")
	}
}

// TestOutage cuts the connection to the broker: publishes fail quickly as
// unavailable (never success), and succeed again once it is back.
func TestOutage(t *testing.T) {
	requireBroker(t)
	p, err := faultproxy.Start(brokerAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	dest, filter := prefix(t)
	sub := subscribe(t, filter, 1)
	s := dial(t, "mqtt://"+p.Addr(), &Config{MaxReconnectInterval: 200 * time.Millisecond})
	m := func(id string) []sink.Message {
		return []sink.Message{{ID: id, Destination: dest + ".x", Value: []byte(`{}`)}}
	}
	requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), m("before")), 1)

	p.Cut()
	start := time.Now()
	var outage []error
	for i := range 5 {
		errs := s.Publish(testenv.Context(t, 30*time.Second), m(fmt.Sprint("during-", i)))
		if errs[0] == nil { // nothing can acknowledge it: the proxy is cut
			t.Fatalf("publish %d during the outage succeeded", i)
		}
		if !sink.IsUnavailable(errs[0]) || sink.IsPermanent(errs[0]) {
			t.Fatalf("publish during the outage: %v, want a sink.Unavailable error", errs[0])
		}
		outage = append(outage, errs[0])
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("5 publishes during the outage took %v; they should fail fast", d)
	}
	t.Logf("during the outage: %v", outage[len(outage)-1])

	p.Restore()
	await.Eventually(t, 15*time.Second, func() error {
		errs := s.Publish(testenv.Context(t, 30*time.Second), m("after"))
		if errs[0] != nil && !sink.IsUnavailable(errs[0]) {
			t.Fatalf("publish after restore: %v", errs[0])
		}
		if errs[0] != nil {
			return fmt.Errorf("still failing since the broker came back: %w", errs[0])
		}
		return nil
	})
	got := sub.wait(t, 2, 10*time.Second)
	ids := []string{decode(t, got[0].Payload).ID, decode(t, got[len(got)-1].Payload).ID}
	if ids[0] != "before" || ids[1] != "after" {
		t.Fatalf("received ids %q, want before … after", ids)
	}
	for _, r := range got {
		if id := decode(t, r.Payload).ID; strings.HasPrefix(id, "during-") {
			t.Fatalf("message %s, reported failed, was delivered later (resent from a session store?)", id)
		}
	}
}

// TestCutMidBatch cuts the connection while a large batch is in flight:
// every message reported published must have reached the broker.
func TestCutMidBatch(t *testing.T) {
	requireBroker(t)
	p, err := faultproxy.Start(brokerAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	dest, filter := prefix(t)
	sub := subscribe(t, filter, 1)
	// AckTimeout also bounds how long Close waits for a packet being handed
	// to the connection that was cut (Paho's write timeout).
	s := dial(t, "mqtt://"+p.Addr(), &Config{MaxReconnectInterval: 200 * time.Millisecond, MaxInflight: 50, AckTimeout: 2 * time.Second})

	const n = 5000
	msgs := make([]sink.Message, n)
	for i := range msgs {
		msgs[i] = sink.Message{ID: fmt.Sprint(i), Destination: dest + ".x", Value: []byte(`{"pad":"` + strings.Repeat("p", 200) + `"}`)}
	}
	done := make(chan []error)
	go func() { done <- s.Publish(context.Background(), msgs) }()
	// Cut once some messages arrived.
	sub.wait(t, 100, 10*time.Second)
	p.Cut()
	var errs []error
	select {
	case errs = <-done:
	case <-time.After(5 * time.Second):
		buf := make([]byte, 1<<20)
		t.Fatalf("Publish did not return within 5s of the cut\n%s", buf[:runtime.Stack(buf, true)])
	}
	p.Restore()

	ok, failed := 0, 0
	firstFailed := -1
	for i, err := range errs {
		if err == nil {
			ok++
			if firstFailed >= 0 && i > firstFailed+50 {
				t.Fatalf("message %d succeeded although message %d failed and the batch stops sending after a failure", i, firstFailed)
			}
			continue
		}
		failed++
		if firstFailed < 0 {
			firstFailed = i
		}
		if !sink.IsUnavailable(err) {
			t.Fatalf("message %d: %v, want a sink.Unavailable error", i, err)
		}
	}
	if failed == 0 {
		t.Fatal("no message failed; the cut came too late to test anything")
	}
	arrived := map[string]bool{}
	for _, r := range sub.settle(500 * time.Millisecond) {
		arrived[decode(t, r.Payload).ID] = true
	}
	for i, err := range errs {
		if err == nil && !arrived[msgs[i].ID] {
			t.Fatalf("message %d was reported published but never arrived", i)
		}
	}
	t.Logf("%d published, %d failed (first failure: %v)", ok, failed, errs[firstFailed])
}

// fakeBroker accepts MQTT connections, answers CONNECT and PINGREQ, and never
// acknowledges a PUBLISH.
type fakeBroker struct {
	ln        net.Listener
	mu        sync.Mutex
	publishes int
	conns     []net.Conn
	wg        sync.WaitGroup
}

func startFakeBroker(t *testing.T) *fakeBroker {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return startFakeBrokerOn(t, ln)
}

func startFakeBrokerOn(t *testing.T, ln net.Listener) *fakeBroker {
	b := &fakeBroker{ln: ln}
	b.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			b.conns = append(b.conns, c)
			b.mu.Unlock()
			b.wg.Go(func() { b.serve(c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		b.mu.Lock()
		for _, c := range b.conns {
			c.Close()
		}
		b.mu.Unlock()
		b.wg.Wait()
	})
	return b
}

func (b *fakeBroker) url() string { return "mqtt://" + b.ln.Addr().String() }

// TestTLS connects with mqtts:// to a fake broker behind TLS, with the
// certificate of an httptest TLS server (valid for 127.0.0.1).
func TestTLS(t *testing.T) {
	hs := httptest.NewTLSServer(http.NotFoundHandler())
	cert, pool := hs.TLS.Certificates[0], x509.NewCertPool()
	pool.AddCert(hs.Certificate())
	hs.Close()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := startFakeBrokerOn(t, tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}}))
	addr := ln.Addr().String()

	// Without the CA the handshake fails with a clear error.
	_, err = Dial(testenv.Context(t, 30*time.Second), "mqtts://"+addr, &Config{ConnectTimeout: 2 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("Dial without the CA: %v", err)
	}
	s := dial(t, "mqtts://"+addr, &Config{TLSConfig: &tls.Config{RootCAs: pool}, AckTimeout: 200 * time.Millisecond})
	errs := s.Publish(testenv.Context(t, 30*time.Second), []sink.Message{{ID: "1", Destination: "t.x"}})
	if !strings.Contains(fmt.Sprint(errs[0]), "no acknowledgement") || b.count() != 1 {
		t.Fatalf("publish over TLS: %v (broker saw %d publishes)", errs[0], b.count())
	}
}

func (b *fakeBroker) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.publishes
}

func (b *fakeBroker) serve(c net.Conn) {
	defer c.Close()
	var hdr [1]byte
	for {
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		n, mul := 0, 1
		for {
			var d [1]byte
			if _, err := io.ReadFull(c, d[:]); err != nil {
				return
			}
			n += int(d[0]&0x7f) * mul
			mul *= 128
			if d[0]&0x80 == 0 {
				break
			}
		}
		if _, err := io.CopyN(io.Discard, c, int64(n)); err != nil {
			return
		}
		switch hdr[0] >> 4 {
		case 1: // CONNECT
			c.Write([]byte{0x20, 0x02, 0x00, 0x00})
		case 3: // PUBLISH
			b.mu.Lock()
			b.publishes++
			b.mu.Unlock()
		case 12: // PINGREQ
			c.Write([]byte{0xd0, 0x00})
		case 14: // DISCONNECT
			return
		}
	}
}

func TestNoAcknowledgement(t *testing.T) {
	b := startFakeBroker(t)
	s := dial(t, b.url(), &Config{AckTimeout: 300 * time.Millisecond, MaxInflight: 3})
	msgs := make([]sink.Message, 10)
	for i := range msgs {
		msgs[i] = sink.Message{ID: fmt.Sprint(i), Destination: "t.x", Value: []byte("{}")}
	}
	start := time.Now()
	errs := s.Publish(testenv.Context(t, 30*time.Second), msgs)
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Publish took %v", d)
	}
	for i, err := range errs {
		if !sink.IsUnavailable(err) {
			t.Fatalf("message %d: %v, want a sink.Unavailable error", i, err)
		}
		want := "no acknowledgement within 300ms"
		if i >= 3 {
			want = "not sent after an earlier message of the batch failed"
		}
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("message %d: %q, want it to say %q", i, err, want)
		}
	}
	time.Sleep(50 * time.Millisecond)
	if got := b.count(); got != 3 {
		t.Fatalf("broker received %d publishes, want 3 (the rest is not sent after a failure)", got)
	}
}

func TestCancelledContext(t *testing.T) {
	t.Run("before", func(t *testing.T) {
		b := startFakeBroker(t)
		s := dial(t, b.url(), nil)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		errs := s.Publish(ctx, []sink.Message{{ID: "1", Destination: "a"}, {ID: "2", Destination: "b"}})
		for i, err := range errs {
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("message %d: %v, want context.Canceled", i, err)
			}
		}
		if b.count() != 0 {
			t.Fatal("a message was sent with a cancelled context")
		}
	})
	t.Run("while waiting", func(t *testing.T) {
		b := startFakeBroker(t)
		s := dial(t, b.url(), &Config{MaxInflight: 2})
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(200*time.Millisecond, cancel)
		msgs := make([]sink.Message, 5)
		for i := range msgs {
			msgs[i] = sink.Message{ID: fmt.Sprint(i), Destination: "t.x"}
		}
		start := time.Now()
		errs := s.Publish(ctx, msgs)
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("Publish returned %v after the cancel", d)
		}
		for i, err := range errs {
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("message %d: %v, want context.Canceled", i, err)
			}
		}
	})
}

func TestDialErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := ln.Addr().String()
	ln.Close()

	for _, tc := range []struct{ url, want string }{
		{"", "empty MQTT URL"},
		{"nats://127.0.0.1:4222", `scheme "nats" is not supported`},
		{"mqtt://127.0.0.1:1883/topic", "unexpected path"},
		{"127.0.0.1:1883", "invalid MQTT URL"},
		{"mqtt://user:s3cret@" + closedPort, "is the broker running"},
	} {
		_, err := Dial(testenv.Context(t, 30*time.Second), tc.url, &Config{ConnectTimeout: 2 * time.Second})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Dial(%q): %v, want an error containing %q", tc.url, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Dial(%q): error shows the password: %v", tc.url, err)
		}
		t.Logf("%s: %v", tc.url, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Dial(ctx, brokerURL, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("Dial with a cancelled context: %v", err)
	}
}

func TestConfig(t *testing.T) {
	c, err := normalize(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.QoS != 1 || c.MaxInflight != DefaultMaxInflight || c.AckTimeout != DefaultAckTimeout ||
		c.MaxMessageSize != MaxMessageSize || len(c.ClientID) != 22 || c.TopicReplacer.Replace("a.b") != "a/b" {
		t.Fatalf("defaults: %+v", c)
	}
	for _, bad := range []Config{{QoS: 3}, {MaxInflight: -1}, {MaxInflight: 70000}, {AckTimeout: -1},
		{KeepAlive: time.Millisecond}, {ClientID: "a\x00"}, {MaxReconnectInterval: -time.Second}} {
		if _, err := normalize(&bad); err == nil {
			t.Errorf("%+v accepted", bad)
		} else if !strings.HasPrefix(err.Error(), "mqttsink: invalid Config.") {
			t.Errorf("unclear error %q", err)
		}
	}
	if _, err := New(nil, nil); err == nil {
		t.Fatal("New(nil) accepted")
	}
}

func TestCheckTopic(t *testing.T) {
	for _, ok := range []string{"a", "a/b", "/a", "a//b", "a/", "ünï/cödé", "$aws/things/x", "a b"} {
		if err := CheckTopic(ok); err != nil {
			t.Errorf("CheckTopic(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "+", "a/#", "a+b", "a\x00", "\x7f", "\ufdd0", "\U0001fffe", "\xc0\x80"} {
		if err := CheckTopic(bad); err == nil {
			t.Errorf("CheckTopic(%q) accepted", bad)
		}
	}
}

func TestCloseAndBorrowedClient(t *testing.T) {
	requireBroker(t)
	dest, filter := prefix(t)
	sub := subscribe(t, filter, 1)
	o := mqtt.NewClientOptions().AddBroker(brokerURL).SetClientID("own" + testenv.Hex(t)).SetAutoReconnect(false)
	c := mqtt.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	defer c.Disconnect(100)
	s, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := []sink.Message{{ID: "1", Destination: dest + ".b", Value: []byte("{}")}}
	requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), m), 1)
	sub.wait(t, 1, 10*time.Second)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if !c.IsConnectionOpen() {
		t.Fatal("Close disconnected the caller's client")
	}
	if errs := s.Publish(testenv.Context(t, 30*time.Second), m); !errors.Is(errs[0], ErrClosed) {
		t.Fatalf("Publish after Close: %v", errs[0])
	}

	// A borrowed client that is not connected: unavailable at once.
	s2, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Disconnect(100)
	if errs := s2.Publish(testenv.Context(t, 30*time.Second), m); !sink.IsUnavailable(errs[0]) || !errors.Is(errs[0], ErrNotConnected) {
		t.Fatalf("Publish on a disconnected client: %v", errs[0])
	}

	// Dial's sink: Close disconnects, Publish after Close fails.
	d := dial(t, brokerURL, nil)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if errs := d.Publish(testenv.Context(t, 30*time.Second), m); !errors.Is(errs[0], ErrClosed) {
		t.Fatalf("Publish after Close: %v", errs[0])
	}
}

func TestEnvelope(t *testing.T) {
	m := sink.Message{ID: "e-1", Destination: "orders.created", Key: []byte("o<1>&"),
		Value:   []byte("{\"total\": 5,\n \"html\": \"<b>\u2028\"}"),
		Headers: []sink.Header{{Key: "type", Value: "Created"}, {Key: "type", Value: "again"}}}
	b, err := Envelope(&m)
	if err != nil {
		t.Fatal(err)
	}
	want := "{\"id\":\"e-1\",\"destination\":\"orders.created\",\"key\":\"o<1>&\"," +
		"\"headers\":[{\"key\":\"id\",\"value\":\"e-1\"},{\"key\":\"type\",\"value\":\"Created\"},{\"key\":\"type\",\"value\":\"again\"}]," +
		"\"payload\":" + string(m.Value) + "}"
	if string(b) != want {
		t.Fatalf("envelope\n%s\nwant\n%s", b, want)
	}
	var e struct{ Payload json.RawMessage }
	if err := json.Unmarshal(b, &e); err != nil || !bytes.Equal(e.Payload, m.Value) {
		t.Fatalf("payload %q (%v), want the value byte for byte", e.Payload, err)
	}

	// An "id" header of the message's own is not repeated; invalid UTF-8
	// in a JSON-looking value goes base64.
	m = sink.Message{ID: "e-2", Headers: []sink.Header{{Key: "a", Value: "1"}, {Key: "id", Value: "e-2"}}, Value: []byte("\"\xff\"")}
	b, _ = Envelope(&m)
	if !strings.Contains(string(b), `"headers":[{"key":"a","value":"1"},{"key":"id","value":"e-2"}]`) ||
		!strings.Contains(string(b), `"payload_base64":"Iv8i"`) || !strings.Contains(string(b), `"key":""`) {
		t.Fatalf("envelope %s", b)
	}
}
