package pubsubconsumer_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/inbox/consumertest"
	"github.com/outboxkit/outbox/inbox/internal/pgstore"
	"github.com/outboxkit/outbox/inbox/pubsubconsumer"
	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/pubsubsink"
)

// TestReadsWhatTheSinkWrites publishes one event with pubsubsink to a
// fixed topic (so the destination travels as an attribute), with a
// repeated header, and checks every field the handler receives.
func TestReadsWhatTheSinkWrites(t *testing.T) {
	e := newPubsubEnv(t, "all-events")
	s, err := pubsubsink.New(e.admin, project, &pubsubsink.Config{Topic: "all-events"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	id := uuid.Must(uuid.NewV7()).String()
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	consumertest.PublishAll(t, s, []sink.Message{{ID: id, Destination: "outbox.event.order", Key: []byte("42"),
		Value: []byte(`{"orderId":42}`), Headers: []sink.Header{{Key: "traceparent", Value: tp}, {Key: "tag", Value: "a"}, {Key: "tag", Value: "b"}}}})
	got := make(chan inbox.Message, 1)
	e.start(t, pgstore.New(t).Inbox(t, "fields", nil), func(_ context.Context, _ pgx.Tx, msg inbox.Message) error {
		got <- msg
		return nil
	}, consumer.Config{})
	var msg inbox.Message
	select {
	case msg = <-got:
	case <-time.After(60 * time.Second):
		t.Fatal("no message within 60s")
	}
	for _, c := range []struct{ name, got, want string }{
		{"EventID", msg.EventID, id},
		{"AggregateType", msg.AggregateType, "order"},
		{"AggregateID", msg.AggregateID, "42"},
		{"Destination", msg.Destination, "outbox.event.order"},
		{"System", msg.System, "gcp_pubsub"},
		{"Payload", string(msg.Payload), `{"orderId":42}`},
		{"traceparent", msg.Headers["traceparent"], tp},
		{"tag (repeated, the first)", msg.Headers["tag"], "a"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.name, c.got, c.want)
		}
	}
}

// TestConfigErrors checks that New refuses bad configuration and Start an
// absent subscription.
func TestConfigErrors(t *testing.T) {
	e := newPubsubEnv(t, "orders")
	ib := pgstore.New(t).Inbox(t, "config", nil)
	h := func(context.Context, pgx.Tx, inbox.Message) error { return nil }
	for _, c := range []struct {
		cfg  *pubsubconsumer.Config
		want string
	}{
		{nil, "Config.Subscription is empty"},
		{&pubsubconsumer.Config{Subscription: "projects/p/topics/t"}, "invalid Config.Subscription"},
		{&pubsubconsumer.Config{Subscription: "s", AckExtension: -time.Second}, "AckExtension"},
	} {
		if _, err := pubsubconsumer.New(e.admin, ib, h, c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) = %v, want an error containing %q", c.cfg, err, c.want)
		}
	}
	c, err := pubsubconsumer.New(e.admin, ib, h, &pubsubconsumer.Config{Subscription: "absent"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Start(ctx); err == nil || !strings.Contains(err.Error(), "absent") {
		t.Errorf("Start on an absent subscription = %v, want an error naming it", err)
	}
}
