package redisconsumer_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/inbox/consumertest"
	"github.com/outboxkit/outbox/inbox/internal/pgstore"
	"github.com/outboxkit/outbox/inbox/redisconsumer"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/redissink"
)

// start starts a consumer of stream that the test stops when it ends.
func start(t *testing.T, rdb *redis.Client, ib *inbox.Inbox[pgx.Tx], h consumer.Handler[pgx.Tx], cfg redisconsumer.Config) *redisconsumer.Consumer[pgx.Tx] {
	t.Helper()
	c, err := redisconsumer.New(rdb, ib, h, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(testenv.Context(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	return c
}

func event(dest string) sink.Message {
	id := uuid.Must(uuid.NewV7()).String()
	return sink.Message{ID: id, Destination: dest, Key: []byte("42"), Type: "OrderPlaced", Value: []byte(`{"orderId":42}`)}
}

// TestReadsWhatTheSinkWrites publishes one event with redissink (with a
// stream prefix, as the relay may) and checks every field the handler
// receives.
func TestReadsWhatTheSinkWrites(t *testing.T) {
	rdb := connect(t, "")
	prefix := testenv.Name("p") + ":"
	stream := prefix + "outbox.event.order"
	t.Cleanup(func() { rdb.Del(context.Background(), stream) })
	s, err := redissink.New(rdb, &redissink.Config{StreamPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	m := event("outbox.event.order")
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	m.Headers = []sink.Header{{Key: "traceparent", Value: tp}}
	consumertest.PublishAll(t, s, []sink.Message{m})
	got := make(chan inbox.Message, 1)
	start(t, rdb, pgstore.New(t).Inbox(t, "fields", nil), func(_ context.Context, _ pgx.Tx, msg inbox.Message) error {
		got <- msg
		return nil
	}, redisconsumer.Config{Streams: []string{stream}, StreamPrefix: prefix, Group: "fields"})
	var msg inbox.Message
	select {
	case msg = <-got:
	case <-time.After(60 * time.Second):
		t.Fatal("no message within 60s")
	}
	for _, c := range []struct{ name, got, want string }{
		{"EventID", msg.EventID, m.ID},
		{"AggregateType", msg.AggregateType, "order"},
		{"AggregateID", msg.AggregateID, "42"},
		{"Type", msg.Type, "OrderPlaced"},
		{"Destination", msg.Destination, "outbox.event.order"},
		{"System", msg.System, "redis"},
		{"Payload", string(msg.Payload), `{"orderId":42}`},
		{"traceparent", msg.Headers["traceparent"], tp},
	} {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.name, c.got, c.want)
		}
	}
}

// TestRestartUnderTheSameNameResumesAtOnce stops a consumer whose handler
// is cancelled (the entry stays pending for its name) and starts another
// of the same name with a ClaimIdle of an hour: it takes the entry at its
// start, without waiting for a claim.
func TestRestartUnderTheSameNameResumesAtOnce(t *testing.T) {
	rdb := connect(t, "")
	stream := testenv.Name("r")
	t.Cleanup(func() { rdb.Del(context.Background(), stream) })
	s, _ := redissink.New(rdb, nil)
	st := pgstore.New(t)
	ib := st.Inbox(t, "resume", nil)
	cfg := redisconsumer.Config{Streams: []string{stream}, Group: "resume", Consumer: "stable", ClaimIdle: time.Hour, Block: 200 * time.Millisecond}
	entered := make(chan struct{}, 1)
	a := start(t, rdb, ib, func(ctx context.Context, _ pgx.Tx, _ inbox.Message) error {
		entered <- struct{}{}
		<-ctx.Done() // until Stop's deadline cancels it
		return ctx.Err()
	}, cfg)
	m := event(stream)
	consumertest.PublishAll(t, s, []sink.Message{m})
	select {
	case <-entered:
	case <-time.After(60 * time.Second):
		t.Fatal("not handled within 60s")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := a.Stop(ctx); err == nil {
		t.Fatal("Stop returned nil with a handler cancelled by its deadline")
	}
	var handled atomic.Int64
	start(t, rdb, ib, func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		handled.Add(1)
		return nil
	}, cfg)
	await.Eventually(t, 30*time.Second, func() error {
		if handled.Load() == 0 {
			return fmt.Errorf("the pending entry was not taken back by the consumer of the same name")
		}
		return nil
	})
}

// TestSlowHandlerKeepsItsEntry holds an entry in its handler for three
// times ClaimIdle while a second consumer of the group claims every
// ClaimIdle/2: the entry's idle time is reset (KeepAlive), so the second
// never takes it, and the handler runs once.
func TestSlowHandlerKeepsItsEntry(t *testing.T) {
	rdb := connect(t, "")
	stream := testenv.Name("k")
	t.Cleanup(func() { rdb.Del(context.Background(), stream) })
	s, _ := redissink.New(rdb, nil)
	ib := pgstore.New(t).Inbox(t, "keep", nil)
	const idle = 2 * time.Second
	var calls atomic.Int64
	release := make(chan struct{})
	slow := func(ctx context.Context, _ pgx.Tx, _ inbox.Message) error {
		if calls.Add(1) == 1 {
			<-release
		}
		return nil
	}
	cfg := func(name string) redisconsumer.Config {
		return redisconsumer.Config{Streams: []string{stream}, Group: "keep", Consumer: name, ClaimIdle: idle, Block: 100 * time.Millisecond}
	}
	start(t, rdb, ib, slow, cfg("first"))
	consumertest.PublishAll(t, s, []sink.Message{event(stream)})
	await.Eventually(t, 30*time.Second, func() error {
		if calls.Load() == 0 {
			return fmt.Errorf("not handled yet")
		}
		return nil
	})
	start(t, rdb, ib, slow, cfg("second"))
	// A wait the test is about: three ClaimIdle periods with a
	// claimer running.
	time.Sleep(3 * idle)
	close(release)
	await.Eventually(t, 30*time.Second, func() error {
		p, err := rdb.XPending(context.Background(), stream, "keep").Result()
		if err != nil {
			return err
		}
		if p.Count != 0 {
			return fmt.Errorf("%d entries pending", p.Count)
		}
		return nil
	})
	if n := calls.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want once: the second consumer claimed an entry the first was working on", n)
	}
}

// TestConfigErrors checks that New refuses bad configuration with an error
// naming the field.
func TestConfigErrors(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	ib := pgstore.New(t).Inbox(t, "config", nil)
	h := func(context.Context, pgx.Tx, inbox.Message) error { return nil }
	for _, c := range []struct {
		cfg  *redisconsumer.Config
		want string
	}{
		{nil, "Streams and Group are required"},
		{&redisconsumer.Config{Group: "g"}, "no Config.Streams"},
		{&redisconsumer.Config{Streams: []string{""}, Group: "g"}, "empty stream name"},
		{&redisconsumer.Config{Streams: []string{"s"}}, "Config.Group is empty"},
		{&redisconsumer.Config{Streams: []string{"s"}, Group: "g", Count: 1000}, "Count 1000"},
		{&redisconsumer.Config{Streams: []string{"s"}, Group: "g", ClaimIdle: -time.Second}, "ClaimIdle"},
	} {
		if _, err := redisconsumer.New(rdb, ib, h, c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) = %v, want an error containing %q", c.cfg, err, c.want)
		}
	}
}
