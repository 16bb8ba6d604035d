package mqttconsumer_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumertest"
	"github.com/outboxkit/outbox/inbox/internal/pgstore"
	"github.com/outboxkit/outbox/inbox/mqttconsumer"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/sink"
)

func start(t *testing.T, ib *inbox.Inbox[pgx.Tx], h func(context.Context, pgx.Tx, inbox.Message) error, cfg *mqttconsumer.Config) *mqttconsumer.Consumer[pgx.Tx] {
	t.Helper()
	c, err := mqttconsumer.New(ib, h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(testenv.Context(t, 10*time.Second)); err != nil {
		t.Fatalf("%v; %s", err, startHint)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	return c
}

// TestMessagesArriveWhileAway stops the consumer, publishes while it is
// away, and starts it again under the same client id: the persistent
// session delivers what was published meanwhile.
func TestMessagesArriveWhileAway(t *testing.T) {
	e := newConformanceEnv(t)
	ib := pgstore.New(t).Inbox(t, "away", nil)
	var handled atomic.Int64
	h := func(context.Context, pgx.Tx, inbox.Message) error { handled.Add(1); return nil }
	a := start(t, ib, h, e.config(brokerURL))
	if err := a.Stop(testenv.Context(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	var msgs []sink.Message
	for range 5 {
		id := uuid.Must(uuid.NewV7()).String()
		msgs = append(msgs, sink.Message{ID: id, Destination: e.prefix + ".orders", Key: []byte("1"), Value: []byte(`{}`)})
	}
	consumertest.PublishAll(t, e.sink, msgs)
	start(t, ib, h, e.config(brokerURL))
	await.Eventually(t, 30*time.Second, func() error {
		if n := handled.Load(); n != 5 {
			return fmt.Errorf("%d of the 5 events published while the consumer was away handled", n)
		}
		return nil
	})
}

// TestReadsWhatTheSinkWrites publishes one event with mqttsink's envelope
// and one raw payload that is no envelope: the first arrives with every
// field, the second is dead-lettered as received.
func TestReadsWhatTheSinkWrites(t *testing.T) {
	e := newConformanceEnv(t)
	ib := pgstore.New(t).Inbox(t, "fields", nil)
	got := make(chan inbox.Message, 1)
	start(t, ib, func(_ context.Context, _ pgx.Tx, msg inbox.Message) error {
		got <- msg
		return nil
	}, e.config(brokerURL))
	id := uuid.Must(uuid.NewV7()).String()
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	consumertest.PublishAll(t, e.sink, []sink.Message{{ID: id, Destination: e.prefix + ".outbox.event.order", Key: []byte("42"),
		Value: []byte(`{"orderId":42}`), Headers: []sink.Header{{Key: "traceparent", Value: tp}}}})
	var msg inbox.Message
	select {
	case msg = <-got:
	case <-time.After(60 * time.Second):
		t.Fatal("no message within 60s")
	}
	for _, c := range []struct{ name, got, want string }{
		{"EventID", msg.EventID, id},
		{"AggregateID", msg.AggregateID, "42"},
		{"Destination", msg.Destination, e.prefix + ".outbox.event.order"},
		{"System", msg.System, "mqtt"},
		{"Payload", string(msg.Payload), `{"orderId":42}`},
		{"traceparent", msg.Headers["traceparent"], tp},
	} {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.name, c.got, c.want)
		}
	}

	// A raw payload, as another publisher (or mqttsink's RawPayload) sends.
	raw := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + brokerAddr).SetClientID(testenv.Name("raw")))
	if tok := raw.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("connect: %v; %s", tok.Error(), startHint)
	}
	defer disconnect(raw)
	if tok := raw.Publish(e.prefix+"/raw", 1, false, []byte("not an envelope")); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	await.Eventually(t, 30*time.Second, func() error {
		dls, err := ib.DeadLetters(context.Background(), 10)
		if err != nil {
			return err
		}
		if len(dls) != 1 {
			return fmt.Errorf("%d dead letters, want 1", len(dls))
		}
		if string(dls[0].Payload) != "not an envelope" || !strings.Contains(dls[0].Error, "no event id") {
			t.Fatalf("dead letter %+v: want the payload as received and a cause naming the missing event id", dls[0])
		}
		return nil
	})
}

// TestConfigErrors checks that New refuses bad configuration with an error
// naming the field, and that Start fails when the broker cannot be reached.
func TestConfigErrors(t *testing.T) {
	ib := pgstore.New(t).Inbox(t, "config", nil)
	h := func(context.Context, pgx.Tx, inbox.Message) error { return nil }
	for _, c := range []struct {
		cfg  *mqttconsumer.Config
		want string
	}{
		{nil, "URL, ClientID and Topics are required"},
		{&mqttconsumer.Config{ClientID: "c", Topics: []string{"t"}}, "Config.URL is empty"},
		{&mqttconsumer.Config{URL: "http://h:1", ClientID: "c", Topics: []string{"t"}}, `scheme "http"`},
		{&mqttconsumer.Config{URL: brokerURL, Topics: []string{"t"}}, "Config.ClientID is empty"},
		{&mqttconsumer.Config{URL: brokerURL, ClientID: "c"}, "no Config.Topics"},
		{&mqttconsumer.Config{URL: brokerURL, ClientID: "c", Topics: []string{""}}, "invalid topic filter"},
	} {
		if _, err := mqttconsumer.New(ib, h, c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) = %v, want an error containing %q", c.cfg, err, c.want)
		}
	}
	c, err := mqttconsumer.New(ib, h, &mqttconsumer.Config{URL: "mqtt://127.0.0.1:1", ClientID: "c", Topics: []string{"t"}, ConnectTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(testenv.Context(t, 10*time.Second)); err == nil || !strings.Contains(err.Error(), "connect to") {
		t.Errorf("Start with no broker = %v, want a connection error", err)
	}
	if err := c.Stop(context.Background()); err != nil {
		t.Errorf("Stop after a failed Start: %v", err)
	}
}
