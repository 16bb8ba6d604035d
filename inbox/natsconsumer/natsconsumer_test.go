package natsconsumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/inbox/natsconsumer"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
)

func newID() string { return uuid.Must(uuid.NewV7()).String() }

func fast() *natsconsumer.Config {
	return &natsconsumer.Config{Config: consumer.Config{RetryBase: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond}}
}

// TestSameEventTwice delivers one event, then the same event again: one
// effect, and the second delivery is a duplicate that is acknowledged.
func TestSameEventTwice(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	cons := f.durable(t, "billing", 0)
	var m counts
	start(t, cons, f.inbox(t, "billing", &m), handler(f.tbl.Schema, "billing"), fast())
	id := newID()
	f.publish(t, "order", id, "42", []byte(`{"order":42}`), true)
	await.Eventually(t, 30*time.Second, func() error {
		if n := m.get(inbox.Processed); n != 1 {
			return fmt.Errorf("processed %d", n)
		}
		return nil
	})
	f.publish(t, "order", strings.ToUpper(id), "42", []byte(`{"order":42}`), false)
	await.Eventually(t, 30*time.Second, func() error {
		if n := m.get(inbox.Duplicate); n != 1 {
			return fmt.Errorf("duplicates %d", n)
		}
		return nil
	})
	await.Eventually(t, 30*time.Second, drained(t, cons))
	if got := f.effects(t, "billing"); len(got) != 1 || got[id] != 1 {
		t.Fatalf("effects = %v, want one for %s", got, id)
	}
}

// TestCopiesToTwoInstances delivers every event twice to two instances of
// one consumer sharing a durable: each event takes effect exactly once, and
// both instances did work.
func TestCopiesToTwoInstances(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	cons := f.durable(t, "billing", 0)
	var a, b counts
	cfg := fast()
	cfg.Buffer = 5
	start(t, cons, f.inbox(t, "billing", &a), handler(f.tbl.Schema, "billing"), cfg)
	start(t, cons, f.inbox(t, "billing", &b), handler(f.tbl.Schema, "billing"), cfg)
	const n = 150
	ids := make([]string, n)
	for i := range ids {
		ids[i] = newID()
		f.publish(t, "order", ids[i], fmt.Sprint("agg-", i%7), []byte(`{}`), true)
		f.publish(t, "order", ids[i], fmt.Sprint("agg-", i%7), []byte(`{}`), false)
	}
	await.Eventually(t, 60*time.Second, func() error {
		if done := a.get(inbox.Processed) + a.get(inbox.Duplicate) + b.get(inbox.Processed) + b.get(inbox.Duplicate); done < 2*n {
			return fmt.Errorf("%d of %d copies handled", done, 2*n)
		}
		return nil
	})
	await.Eventually(t, 30*time.Second, drained(t, cons))
	got := f.effects(t, "billing")
	for _, id := range ids {
		if got[id] != 1 {
			t.Fatalf("event %s took effect %d times, want 1", id, got[id])
		}
	}
	if len(got) != n {
		t.Fatalf("%d events took effect, want %d", len(got), n)
	}
	if p := a.get(inbox.Processed) + b.get(inbox.Processed); p != n {
		t.Fatalf("processed %d, want %d", p, n)
	}
	if a.get(inbox.Processed)+a.get(inbox.Duplicate) == 0 || b.get(inbox.Processed)+b.get(inbox.Duplicate) == 0 {
		t.Fatalf("one instance did all the work: a %d+%d, b %d+%d", a.get(inbox.Processed), a.get(inbox.Duplicate),
			b.get(inbox.Processed), b.get(inbox.Duplicate))
	}
	t.Logf("instance a: %d processed, %d duplicates; b: %d processed, %d duplicates",
		a.get(inbox.Processed), a.get(inbox.Duplicate), b.get(inbox.Processed), b.get(inbox.Duplicate))
}

// TestTwoConsumerNames: two consumers, each with its own durable, each
// apply every event once.
func TestTwoConsumerNames(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, name := range []string{"billing", "shipping"} {
		start(t, f.durable(t, name, 0), f.inbox(t, name, nil), handler(f.tbl.Schema, name), fast())
	}
	ids := []string{newID(), newID(), newID()}
	for _, id := range ids {
		f.publish(t, "order", id, "7", []byte(`{}`), true)
		f.publish(t, "order", id, "7", []byte(`{}`), false)
	}
	for _, name := range []string{"billing", "shipping"} {
		await.Eventually(t, 30*time.Second, func() error {
			if got := f.effects(t, name); len(got) != len(ids) {
				return fmt.Errorf("%s: effects %v", name, got)
			}
			return nil
		})
	}
	for _, name := range []string{"billing", "shipping"} {
		for id, n := range f.effects(t, name) {
			if n != 1 {
				t.Fatalf("%s applied %s %d times", name, id, n)
			}
		}
	}
}

// TestInvalidMessagesAreDeadLettered: a message without an id, one whose id
// is not a UUID and one whose payload does not decode go to the consumer's
// dead letter with their cause, are acknowledged, and the loop goes on.
func TestInvalidMessagesAreDeadLettered(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	cons := f.durable(t, "billing", 0)
	ib := f.inbox(t, "billing", nil)
	start(t, cons, ib, handler(f.tbl.Schema, "billing"), fast())
	undecodable := newID()
	f.publish(t, "order", "", "1", []byte(`{}`), false)
	f.publish(t, "order", "not-a-uuid", "2", []byte(`{}`), false)
	f.publish(t, "order", undecodable, "3", []byte(`{"half`), true)
	good := newID()
	f.publish(t, "order", good, "4", []byte(`{}`), true)
	await.Eventually(t, 30*time.Second, func() error {
		if got := f.effects(t, "billing"); got[good] != 1 {
			return fmt.Errorf("effects %v", got)
		}
		return nil
	})
	await.Eventually(t, 30*time.Second, drained(t, cons))
	dls, err := ib.DeadLetters(testenv.Context(t, 10*time.Second), 10)
	if err != nil {
		t.Fatal(err)
	}
	// Different keys run in parallel: match the dead letters by event id.
	want := map[string]string{"": "no event id", "not-a-uuid": "not a UUID", undecodable: "payload does not decode"}
	if len(dls) != len(want) {
		t.Fatalf("%d dead letters, want %d: %+v", len(dls), len(want), dls)
	}
	for _, dl := range dls {
		cause, ok := want[dl.EventID]
		if !ok || !strings.Contains(dl.Error, cause) || dl.Destination != f.stream+".order" {
			t.Errorf("dead letter id %q error %q destination %q; want one of %v with its cause", dl.EventID, dl.Error, dl.Destination, want)
		}
		delete(want, dl.EventID)
		if dl.EventID == undecodable && (string(dl.Payload) != `{"half` || dl.Headers[inbox.HeaderKey] != "3") {
			t.Errorf("dead letter kept payload %q headers %v", dl.Payload, dl.Headers)
		}
	}
}

// TestRetriesKeepOrderThenDeadLetter: a handler failing twice is retried
// with backoff while the aggregate's next event waits behind it; a handler
// that always fails is dead-lettered after MaxAttempts, and then
// acknowledged.
func TestRetriesKeepOrderThenDeadLetter(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	cons := f.durable(t, "billing", 0)
	ib := f.inbox(t, "billing", nil)
	first, second, poison := newID(), newID(), newID()
	var mu sync.Mutex
	tries := map[string]int{}
	var order []string
	base := handler(f.tbl.Schema, "billing")
	h := func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		mu.Lock()
		tries[msg.EventID]++
		n := tries[msg.EventID]
		mu.Unlock()
		switch {
		case msg.EventID == poison:
			return errors.New("downstream refuses")
		case msg.EventID == first && n <= 2:
			return fmt.Errorf("transient failure %d", n)
		}
		if err := base(ctx, tx, msg); err != nil {
			return err
		}
		mu.Lock()
		order = append(order, msg.EventID)
		mu.Unlock()
		return nil
	}
	cfg := fast()
	cfg.MaxAttempts = 3
	start(t, cons, ib, h, cfg)
	f.publish(t, "order", first, "A", []byte(`{}`), true)
	f.publish(t, "order", second, "A", []byte(`{}`), true)
	f.publish(t, "order", poison, "B", []byte(`{}`), true)
	await.Eventually(t, 30*time.Second, drained(t, cons))
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(order, []string{first, second}) {
		t.Fatalf("applied %v, want [%s %s]: the aggregate's second event overtook the retried first", order, first, second)
	}
	if tries[first] != 3 || tries[poison] != 3 {
		t.Fatalf("attempts: first %d (want 3), poison %d (want MaxAttempts 3)", tries[first], tries[poison])
	}
	dls, err := ib.DeadLetters(testenv.Context(t, 10*time.Second), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 || dls[0].EventID != poison || !strings.Contains(dls[0].Error, "gave up after 3 attempts: downstream refuses") {
		t.Fatalf("dead letters = %+v, want the poison event with its cause", dls)
	}
}

// TestStopFinishesInFlightAndHandsBackTheRest stops a consumer while a
// handler runs: the handler finishes and its message is acknowledged; the
// messages it had not started go back to the stream, and a new instance
// handles them, each once.
func TestStopFinishesInFlightAndHandsBackTheRest(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	cons := f.durable(t, "billing", time.Minute)
	entered := make(chan struct{}, 100)
	proceed := make(chan struct{})
	base := handler(f.tbl.Schema, "billing")
	slow := func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		entered <- struct{}{}
		<-proceed
		return base(ctx, tx, msg)
	}
	c, err := natsconsumer.New(cons, f.inbox(t, "billing", nil), slow, &natsconsumer.Config{Config: consumer.Config{Concurrency: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(testenv.Context(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	const n = 30
	for i := range n {
		f.publish(t, "order", newID(), fmt.Sprint(i), []byte(`{}`), true)
	}
	<-entered // one handler is in flight
	stopped := make(chan error, 1)
	go func() { stopped <- c.Stop(testenv.Context(t, 60*time.Second)) }()
	close(proceed)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	handled := len(f.effects(t, "billing"))
	if handled == 0 || handled == n {
		t.Fatalf("%d of %d handled by the stopped instance; want the one in flight and not all", handled, n)
	}
	// The durable's AckWait is a minute: the messages not started must come
	// back because Stop handed them back (Nak), not because they timed out.
	var m counts
	start(t, cons, f.inbox(t, "billing", &m), base, fast())
	await.Eventually(t, 20*time.Second, drained(t, cons))
	if m.get(inbox.Duplicate) != 0 || m.get(inbox.Processed) != int64(n-handled) {
		t.Fatalf("second instance: %d processed, %d duplicates; want %d and 0 (the stopped instance acknowledged what it handled)",
			m.get(inbox.Processed), m.get(inbox.Duplicate), n-handled)
	}
	got := f.effects(t, "billing")
	if len(got) != n {
		t.Fatalf("%d events took effect, want %d", len(got), n)
	}
	for id, k := range got {
		if k != 1 {
			t.Fatalf("event %s took effect %d times", id, k)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ib := f.inbox(t, "billing", nil)
	h := handler(f.tbl.Schema, "billing")
	cons := f.durable(t, "ok", 0)
	for _, tc := range []struct {
		cfg  *natsconsumer.Config
		want string
	}{
		{&natsconsumer.Config{Buffer: -1}, "Config.Buffer -1"},
		{&natsconsumer.Config{Config: consumer.Config{MaxAttempts: -2}}, "Config.MaxAttempts -2"},
		{&natsconsumer.Config{Config: consumer.Config{RetryBase: time.Minute, RetryMax: time.Second}}, "RetryMax"},
	} {
		if _, err := natsconsumer.New(cons, ib, h, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}
	if _, err := natsconsumer.New(nil, ib, h, nil); err == nil {
		t.Error("New without a consumer succeeded")
	}
	ctx := testenv.Context(t, 10*time.Second)
	for _, tc := range []struct {
		mutate func(cc *jetstream.ConsumerConfig)
		want   string
	}{
		{func(cc *jetstream.ConsumerConfig) { cc.AckPolicy = jetstream.AckNonePolicy }, "explicit acknowledgements"},
		{func(cc *jetstream.ConsumerConfig) { cc.MaxDeliver = 5 }, "MaxDeliver 5"},
	} {
		cc := natsconsumer.ConsumerConfig(testenv.Name("bad"), f.stream+".>")
		tc.mutate(&cc)
		bad, err := f.js.CreateOrUpdateConsumer(ctx, f.stream, cc)
		if err != nil {
			t.Fatal(err)
		}
		c, err := natsconsumer.New(bad, ib, h, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Start = %v, want %q", err, tc.want)
		}
		if err := c.Stop(ctx); err != nil {
			t.Errorf("Stop after a failed Start: %v", err)
		}
	}
}
