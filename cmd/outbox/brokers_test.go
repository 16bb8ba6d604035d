package main

// The relay pointed at each real broker in turn: every committed event
// arrives, in commit order per aggregate, with its id and key, read by a
// consumer on the broker side.

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/internal/workload"
)

// collector gathers deliveries from a consumer goroutine.
type collector struct {
	mu sync.Mutex
	ds []workload.Delivery
}

func (c *collector) add(d workload.Delivery) {
	c.mu.Lock()
	c.ds = append(c.ds, d)
	c.mu.Unlock()
}

// wait returns the deliveries once every committed event arrived.
func (c *collector) wait(t *testing.T, res *workload.Result) []workload.Delivery {
	t.Helper()
	var out []workload.Delivery
	// Up to 60s; the caller checks what arrived.
	_ = await.Poll(60*time.Second, func() error {
		c.mu.Lock()
		seen := map[string]bool{}
		for _, d := range c.ds {
			seen[d.ID] = true
		}
		out = append([]workload.Delivery(nil), c.ds...)
		c.mu.Unlock()
		if len(seen) < res.Committed() {
			return fmt.Errorf("%d of %d committed events arrived", len(seen), res.Committed())
		}
		return nil
	})
	return out
}

func TestEndToEndRabbitMQ(t *testing.T) {
	t.Parallel()
	tb, flags := migrated(t)
	conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		t.Fatalf("cannot reach RabbitMQ: %v; start it with: rabbitmq-server -detached", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	exchange := testenv.Name("x")
	if err := ch.ExchangeDeclare(exchange, "topic", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(q.Name, "#", exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var c collector
	go func() {
		for d := range deliveries {
			key, _ := d.Headers["key"].(string)
			if d.MessageId == "" || d.Headers["id"] != d.MessageId || d.DeliveryMode != amqp.Persistent || d.Type != "Changed" {
				t.Errorf("message %q: id header %v, delivery mode %d, type %q", d.MessageId, d.Headers["id"], d.DeliveryMode, d.Type)
			}
			c.add(workload.Delivery{ID: d.MessageId, Key: key, Payload: d.Body})
		}
	}()
	startRelay(t, append(flags, "--sink", "amqp://guest:guest@127.0.0.1:5672/", "--amqp-exchange", exchange)...)
	res, err := workload.Run(context.Background(), testenv.Pool(t), tb, workload.Config{Aggregates: 40, Transactions: 1500, Writers: 4, RollbackPct: 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := workload.Check(res, c.wait(t, res)); err != nil {
		t.Fatal(err)
	}
}

// TestRelayAMQPErrorsNameTheFlags: a relay whose --amqp-exchange does not
// exist stops at start-up with one line in RabbitMQ's words that names the
// flags that fix it.
func TestRelayAMQPErrorsNameTheFlags(t *testing.T) {
	t.Parallel()
	_, flags := migrated(t)
	missing := testenv.Name("missing")
	args := append([]string{"relay", "--sink", "amqp://guest:guest@127.0.0.1:5672/", "--amqp-exchange", missing}, flags...)
	_, stderr, code := run(t, []string{"OUTBOX_SINK="}, args...)
	lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
	last := lines[len(lines)-1]
	if code == 0 || !strings.HasPrefix(last, "outbox: ") {
		t.Fatalf("relay to a missing exchange: exit %d, stderr %q; want a failure ending with one \"outbox: \" line", code, stderr)
	}
	for _, want := range []string{fmt.Sprintf("the exchange %q does not exist in vhost", missing), "--amqp-exchange", "declare it", "--amqp-declare"} {
		if !strings.Contains(last, want) {
			t.Errorf("relay to a missing exchange: %q; want it to say %q", last, want)
		}
	}
}

func TestEndToEndMQTT(t *testing.T) {
	t.Parallel()
	tb, flags := migrated(t)
	prefix := testenv.Name("m")
	var c collector
	opts := mqtt.NewClientOptions().AddBroker("tcp://127.0.0.1:1883").SetClientID(prefix).SetCleanSession(true)
	client := mqtt.NewClient(opts)
	if tok := client.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("cannot reach Mosquitto: %v; start it with: mosquitto -d -c /etc/mosquitto/mosquitto.conf", tok.Error())
	}
	defer client.Disconnect(100)
	tok := client.Subscribe(prefix+"/#", 1, func(_ mqtt.Client, m mqtt.Message) {
		var env struct {
			ID      string          `json:"id"`
			Key     string          `json:"key"`
			Payload json.RawMessage `json:"payload"`
			Headers []struct{ Key, Value string }
		}
		if err := json.Unmarshal(m.Payload(), &env); err != nil {
			t.Errorf("envelope %q: %v", m.Payload(), err)
			return
		}
		if m.Topic() != prefix+"/order" {
			t.Errorf("topic %q", m.Topic())
		}
		c.add(workload.Delivery{ID: env.ID, Key: env.Key, Payload: env.Payload})
	})
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	startRelay(t, append(flags, "--sink", "mqtt://127.0.0.1:1883", "--route-replacement", prefix+".${routedByValue}")...)
	res, err := workload.Run(context.Background(), testenv.Pool(t), tb, workload.Config{Aggregates: 40, Transactions: 1500, Writers: 4, RollbackPct: 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := workload.Check(res, c.wait(t, res)); err != nil {
		t.Fatal(err)
	}
}

// TestEndToEndWebhook checks every request's signature with its own
// implementation of the Standard Webhooks scheme, independent of the
// sink's Verify.
func TestEndToEndWebhook(t *testing.T) {
	t.Parallel()
	tb, flags := migrated(t)
	key := make([]byte, 32)
	rand.Read(key)
	secret := "whsec_" + base64.StdEncoding.EncodeToString(key)
	var c collector
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		id, ts := r.Header.Get("webhook-id"), r.Header.Get("webhook-timestamp")
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(id + "." + ts + "." + string(body)))
		want := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
		ok := false
		for _, sig := range strings.Fields(r.Header.Get("webhook-signature")) {
			ok = ok || hmac.Equal([]byte(sig), []byte(want))
		}
		if !ok || r.URL.Path != "/hooks/outbox.event.order" {
			t.Errorf("request %s to %s: signature %q does not verify", id, r.URL.Path, r.Header.Get("webhook-signature"))
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		c.add(workload.Delivery{ID: id, Key: r.Header.Get("Outbox-Key"), Payload: body})
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	startRelay(t, append(flags, "--sink", srv.URL+"/hooks/${destination}", "--webhook-secret", secret, "--webhook-allow-private")...)
	res, err := workload.Run(context.Background(), testenv.Pool(t), tb, workload.Config{Aggregates: 40, Transactions: 1000, Writers: 4, RollbackPct: 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := workload.Check(res, c.wait(t, res)); err != nil {
		t.Fatal(err)
	}
}
