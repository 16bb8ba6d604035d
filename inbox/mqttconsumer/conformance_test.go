package mqttconsumer_test

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/inbox/consumertest"
	"github.com/outboxkit/outbox/inbox/internal/pgstore"
	"github.com/outboxkit/outbox/inbox/mqttconsumer"
	"github.com/outboxkit/outbox/internal/faultproxy"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/mqttsink"
)

const (
	brokerAddr = "127.0.0.1:1883"
	brokerURL  = "mqtt://" + brokerAddr
	startHint  = "start it with: mosquitto -d -c /etc/mosquitto/mosquitto.conf"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// disconnect disconnects a test's own client and waits until Paho's
// goroutine finished (its Disconnect may return before).
func disconnect(c mqtt.Client) {
	c.Disconnect(100)
	for deadline := time.Now().Add(5 * time.Second); c.IsConnected() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
}

// conformanceEnv is one conformance test's topic prefix and persistent
// session (created before anything is published, so the broker keeps every
// message for it), published to by mqttsink; each adapter connects under
// the session's client id through a fault proxy of its own.
type conformanceEnv struct {
	prefix  string
	session string
	sink    *mqttsink.Sink

	mu      sync.Mutex
	proxies map[consumertest.Adapter]*faultproxy.Proxy
}

func (e *conformanceEnv) config(url string) *mqttconsumer.Config {
	return &mqttconsumer.Config{URL: url, ClientID: e.session, Topics: []string{e.prefix + "/#"}, MaxReconnectInterval: time.Second}
}

func newConformanceEnv(t *testing.T) *conformanceEnv {
	t.Helper()
	e := &conformanceEnv{prefix: testenv.Name("c"), session: testenv.Name("session"), proxies: map[consumertest.Adapter]*faultproxy.Proxy{}}
	ctx := testenv.Context(t, 30*time.Second)
	if err := mqttconsumer.CreateSession(ctx, e.config(brokerURL)); err != nil {
		t.Fatalf("%v; %s", err, startHint)
	}
	t.Cleanup(func() { // end the session: a clean connect discards it
		o := mqtt.NewClientOptions().AddBroker("tcp://" + brokerAddr).SetClientID(e.session).SetCleanSession(true)
		c := mqtt.NewClient(o)
		if tok := c.Connect(); tok.WaitTimeout(10*time.Second) && tok.Error() == nil {
			disconnect(c)
		}
	})
	s, err := mqttsink.Dial(ctx, brokerURL, nil)
	if err != nil {
		t.Fatalf("%v; %s", err, startHint)
	}
	t.Cleanup(func() { _ = s.Close() })
	e.sink = s
	return e
}

// pending connects under the session's client id and counts what the
// broker sends before a marker published after connecting: the messages
// the session holds unacknowledged (sent again first) or queued. It
// acknowledges only the marker.
func (e *conformanceEnv) pending(t *testing.T) (int, error) {
	marker := []byte(testenv.Name("marker"))
	var n atomic.Int64
	seen := make(chan struct{})
	var once sync.Once
	o := mqtt.NewClientOptions().AddBroker("tcp://" + brokerAddr).SetClientID(e.session).SetCleanSession(false).
		SetAutoAckDisabled(true).SetAutoReconnect(false).
		SetDefaultPublishHandler(func(_ mqtt.Client, m mqtt.Message) {
			if bytes.Contains(m.Payload(), marker) {
				m.Ack()
				once.Do(func() { close(seen) })
				return
			}
			n.Add(1)
		})
	c := mqtt.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		return 0, fmt.Errorf("connect as the session: %v", tok.Error())
	}
	defer disconnect(c)
	consumertest.PublishAll(t, e.sink, []sink.Message{{ID: string(marker), Destination: e.prefix + ".marker", Value: []byte(`{}`)}})
	select {
	case <-seen:
		return int(n.Load()), nil
	case <-time.After(20 * time.Second):
		return 0, fmt.Errorf("the marker did not arrive within 20s behind %d messages (the broker's in-flight window may be full of unacknowledged ones)", n.Load())
	}
}

// TestConformance runs the consumer conformance suite on the real
// Mosquitto and PostgreSQL, publishing with mqttsink.
func TestConformance(t *testing.T) {
	env := consumertest.PerTest(newConformanceEnv)
	consumertest.Run(t, consumertest.Harness[pgx.Tx]{
		Store: pgstore.New,
		Dest:  func(t *testing.T, name string) string { return env(t).prefix + "." + name },
		Publish: func(t *testing.T, msgs []sink.Message) {
			consumertest.PublishAll(t, env(t).sink, msgs)
		},
		Start: func(t *testing.T, ib *inbox.Inbox[pgx.Tx], h consumer.Handler[pgx.Tx], cfg consumer.Config) consumertest.Adapter {
			e := env(t)
			proxy, err := faultproxy.Start(brokerAddr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = proxy.Close() })
			mc := e.config("mqtt://" + proxy.Addr())
			mc.Config = cfg
			c, err := mqttconsumer.New(ib, h, mc)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Start(testenv.Context(t, 10*time.Second)); err != nil {
				t.Fatalf("%v; %s", err, startHint)
			}
			e.mu.Lock()
			e.proxies[c] = proxy
			e.mu.Unlock()
			return c
		},
		Crash: func(t *testing.T, a consumertest.Adapter) {
			e := env(t)
			e.mu.Lock()
			defer e.mu.Unlock()
			e.proxies[a].Cut()
		},
		Pending: func(t *testing.T) (int, error) { return env(t).pending(t) },
		Ordered: true,
		Settle:  30 * time.Second,
	})
}
