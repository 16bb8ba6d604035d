package amqpconsumer_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/amqpconsumer"
	"github.com/outboxkit/outbox/inbox/consumertest"
	"github.com/outboxkit/outbox/inbox/internal/pgstore"
	"github.com/outboxkit/outbox/internal/faultproxy"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/amqpsink"
)

// TestReadsWhatTheSinkWrites publishes one event with amqpsink as the relay
// does (routing key outbox.event.<type>, key, type, a traceparent header)
// and checks every field of the message the handler receives.
func TestReadsWhatTheSinkWrites(t *testing.T) {
	dial(t)
	exchange := testenv.Name("x")
	queue := exchange + ".q"
	ctx := testenv.Context(t, 60*time.Second)
	s, err := amqpsink.Dial(ctx, brokerURL(), &amqpsink.Config{Exchange: exchange, Declare: true,
		Queues: []amqpsink.Queue{{Name: queue, BindingKeys: []string{"outbox.event.order"}}}})
	if err != nil {
		t.Fatalf("%v; %s", err, startHint)
	}
	defer s.Close()
	if err := s.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		admin := dial(t)
		if ch, err := admin.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
			_ = ch.ExchangeDelete(exchange, false, false)
		}
	})
	id := uuid.Must(uuid.NewV7()).String()
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	consumertest.PublishAll(t, s, []sink.Message{{ID: id, Destination: "outbox.event.order", Key: []byte("42"), Type: "OrderPlaced",
		Value: []byte(`{"orderId":42}`), Headers: []sink.Header{{Key: "id", Value: id}, {Key: "traceparent", Value: tp}}}})

	st := pgstore.New(t)
	ib := st.Inbox(t, "fields", nil)
	got := make(chan inbox.Message, 1)
	c, err := amqpconsumer.New(ib, func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		got <- msg
		return nil
	}, &amqpconsumer.Config{URL: brokerURL(), Queue: queue})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Stop(context.Background())
	var msg inbox.Message
	select {
	case msg = <-got:
	case <-ctx.Done():
		t.Fatal("no message within 60s")
	}
	for _, c := range []struct{ name, got, want string }{
		{"EventID", msg.EventID, id},
		{"AggregateType", msg.AggregateType, "order"},
		{"AggregateID", msg.AggregateID, "42"},
		{"Type", msg.Type, "OrderPlaced"},
		{"Destination", msg.Destination, "outbox.event.order"},
		{"System", msg.System, "rabbitmq"},
		{"Payload", string(msg.Payload), `{"orderId":42}`},
		{"traceparent", msg.Headers["traceparent"], tp},
	} {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.name, c.got, c.want)
		}
	}
}

// TestConfigErrors checks that bad configuration is refused by New, with
// an error naming the field, and that an absent queue is refused by Start.
func TestConfigErrors(t *testing.T) {
	ib := pgstore.New(t).Inbox(t, "config", nil)
	h := func(context.Context, pgx.Tx, inbox.Message) error { return nil }
	for _, c := range []struct {
		cfg  *amqpconsumer.Config
		want string
	}{
		{nil, "URL and Queue are required"},
		{&amqpconsumer.Config{Queue: "q"}, "Config.URL is empty"},
		{&amqpconsumer.Config{URL: "http://x:1/", Queue: "q"}, `scheme "http"`},
		{&amqpconsumer.Config{URL: "amqp://guest:secret@h:5672/"}, "Config.Queue is empty"},
		{&amqpconsumer.Config{URL: "amqp://h:5672/", Queue: "q", Prefetch: 1000}, "Prefetch 1000"},
		{&amqpconsumer.Config{URL: "amqp://h:5672/", Queue: "q", ReconnectMin: time.Minute, ReconnectMax: time.Second}, "ReconnectMax"},
	} {
		_, err := amqpconsumer.New(ib, h, c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) = %v, want an error containing %q", c.cfg, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("the error shows the password: %v", err)
		}
	}
	c, err := amqpconsumer.New(ib, h, &amqpconsumer.Config{URL: brokerURL(), Queue: testenv.Name("absent")})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Start(testenv.Context(t, 30*time.Second))
	if err == nil || !strings.Contains(err.Error(), "declare the queue") {
		t.Errorf("Start on an absent queue = %v, want an error saying to declare it", err)
	}
	if err := c.Stop(context.Background()); err != nil {
		t.Errorf("Stop after a failed Start: %v", err)
	}
}

// TestReconnectsAfterConnectionLoss cuts the consumer's connection (a fault
// proxy drops it and refuses new ones for a while), lets it through again,
// and checks that the same Consumer dials again and takes the next events.
func TestReconnectsAfterConnectionLoss(t *testing.T) {
	e := newConformanceEnv(nil)(t)
	u, err := url.Parse(brokerURL())
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	u.Host = proxy.Addr()
	var handled atomic.Int64
	c, err := amqpconsumer.New(pgstore.New(t).Inbox(t, "reconnect", nil), func(context.Context, pgx.Tx, inbox.Message) error {
		handled.Add(1)
		return nil
	}, &amqpconsumer.Config{URL: u.String(), Queue: e.queue, ReconnectMax: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(testenv.Context(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	defer c.Stop(context.Background())
	event := func() sink.Message {
		id := uuid.Must(uuid.NewV7()).String()
		return sink.Message{ID: id, Destination: e.prefix + ".orders", Key: []byte("1"), Value: []byte(`{}`)}
	}
	wait := func(n int64) {
		await.Eventually(t, 60*time.Second, func() error {
			if h := handled.Load(); h < n {
				return fmt.Errorf("%d events handled, want %d", h, n)
			}
			return nil
		})
	}
	consumertest.PublishAll(t, e.sink, []sink.Message{event()})
	wait(1)
	proxy.Cut()
	consumertest.PublishAll(t, e.sink, []sink.Message{event()}) // while the consumer is cut off
	proxy.Restore()
	consumertest.PublishAll(t, e.sink, []sink.Message{event()})
	wait(3)
}
