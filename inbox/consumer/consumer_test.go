package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/inbox/inboxpgx"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/sink"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// delivery records how the Engine ended it.
type delivery struct {
	msg inbox.Message
	key string

	mu       sync.Mutex
	acks     int
	releases []time.Duration
	ended    chan struct{}
}

func newDelivery(key string) *delivery {
	return &delivery{msg: inbox.Message{EventID: uuid.NewString(), AggregateID: key, Payload: []byte(`{}`)}, key: key, ended: make(chan struct{})}
}

func (d *delivery) Message() inbox.Message     { return d.msg }
func (d *delivery) Key() string                { return d.key }
func (d *delivery) Attempts() int              { return 0 }
func (d *delivery) KeepAlive() error           { return nil }
func (d *delivery) Abandoned() <-chan struct{} { return nil }

func (d *delivery) Ack(context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.acks++
	close(d.ended)
	return nil
}

func (d *delivery) Release(delay time.Duration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.releases = append(d.releases, delay)
	close(d.ended) // a second end panics: exactly one Ack or Release
	return nil
}

func newInbox(t *testing.T) *inbox.Inbox[pgx.Tx] {
	t.Helper()
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	tbl.Name = "inbox"
	if _, err := inboxpgx.Migrate(testenv.Context(t, 30*time.Second), pool, tbl); err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(inboxpgx.New(pool), &inbox.Config{Consumer: "c", Schema: tbl.Schema, Table: tbl.Name})
	if err != nil {
		t.Fatal(err)
	}
	return ib
}

// TestStopReleasesWithTheRestOfTheDelay: at stop, a message waiting for its
// retry is handed back with what is left of its delay, a message queued
// behind it (same key) is handed back at once, and a message handled
// before is acknowledged; each exactly once.
func TestStopReleasesWithTheRestOfTheDelay(t *testing.T) {
	t.Parallel()
	ib := newInbox(t)
	failed := make(chan struct{}, 1)
	var failing sync.Map
	h := func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		if _, ok := failing.Load(msg.EventID); ok {
			select {
			case failed <- struct{}{}:
			default:
			}
			return errors.New("not yet")
		}
		return nil
	}
	e, err := consumer.New(ib, h, &consumer.Config{Concurrency: 2, RetryBase: time.Hour, RetryMax: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testenv.Context(t, 60*time.Second)
	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	ok, bad, behind := newDelivery("a"), newDelivery("b"), newDelivery("b")
	failing.Store(bad.msg.EventID, true)
	for _, d := range []*delivery{ok, bad, behind} {
		if err := e.Submit(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	<-ok.ended
	<-failed // bad now waits about an hour for its retry
	if err := e.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if ok.acks != 1 || len(ok.releases) != 0 {
		t.Errorf("handled message: %d acks, releases %v; want one ack", ok.acks, ok.releases)
	}
	if bad.acks != 0 || len(bad.releases) != 1 || bad.releases[0] < 10*time.Minute {
		t.Errorf("retrying message: %d acks, releases %v; want one release with the rest of its delay (about 30 to 60 minutes)", bad.acks, bad.releases)
	}
	if behind.acks != 0 || len(behind.releases) != 1 || behind.releases[0] != 0 {
		t.Errorf("message behind it: %d acks, releases %v; want one release at once", behind.acks, behind.releases)
	}
	if err := e.Submit(ctx, newDelivery("c")); !errors.Is(err, consumer.ErrStopped) {
		t.Errorf("Submit after Stop = %v, want ErrStopped", err)
	}
	if err := e.Stop(ctx); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

// TestStopDeadlineCancelsHandlers: when Stop's context ends first, the
// handler in flight is cancelled and its message released, not
// acknowledged.
func TestStopDeadlineCancelsHandlers(t *testing.T) {
	t.Parallel()
	ib := newInbox(t)
	entered := make(chan struct{})
	h := func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		close(entered)
		<-ctx.Done()
		return ctx.Err()
	}
	e, err := consumer.New(ib, h, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	d := newDelivery("a")
	if err := e.Submit(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	<-entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := e.Stop(ctx); err == nil || !strings.Contains(err.Error(), "cancelled") {
		t.Fatalf("Stop = %v, want the handlers cancelled", err)
	}
	if d.acks != 0 || len(d.releases) != 1 {
		t.Fatalf("%d acks, releases %v; want one release", d.acks, d.releases)
	}
}

func TestPermanent(t *testing.T) {
	if consumer.Permanent(nil) != nil {
		t.Error("Permanent(nil) != nil")
	}
	base := errors.New("bad payload")
	err := fmt.Errorf("handle: %w", consumer.Permanent(base))
	if !consumer.IsPermanent(err) || !errors.Is(err, base) || err.Error() != "handle: bad payload" {
		t.Errorf("wrapped Permanent: IsPermanent %v, Is %v, text %q", consumer.IsPermanent(err), errors.Is(err, base), err)
	}
	if !consumer.IsPermanent(fmt.Errorf("x: %w", inbox.ErrInvalidMessage)) {
		t.Error("ErrInvalidMessage is not permanent")
	}
	if consumer.IsPermanent(base) {
		t.Error("a plain error is permanent")
	}
}

// The consumer's mark and the sink's are one: a handler may return either.
func TestPermanentIsTheSinkMark(t *testing.T) {
	base := errors.New("bad payload")
	if !consumer.IsPermanent(sink.Permanent(base)) {
		t.Error("sink.Permanent is not permanent to the consumer")
	}
	if !sink.IsPermanent(consumer.Permanent(base)) {
		t.Error("consumer.Permanent is not permanent to the sink package")
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	ib := newInbox(t)
	h := func(context.Context, pgx.Tx, inbox.Message) error { return nil }
	for _, tc := range []struct {
		cfg  consumer.Config
		want string
	}{
		{consumer.Config{Concurrency: -1}, "Config.Concurrency -1"},
		{consumer.Config{MaxAttempts: -1}, "Config.MaxAttempts -1"},
		{consumer.Config{MaxPending: -1}, "Config.MaxPending -1"},
		{consumer.Config{RetryBase: -time.Second}, "Config.RetryBase -1s"},
		{consumer.Config{RetryBase: time.Minute, RetryMax: time.Second}, "shorter than Config.RetryBase"},
		{consumer.Config{KeepAlive: -time.Second}, "Config.KeepAlive"},
	} {
		if _, err := consumer.New(ib, h, &tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}
	if _, err := consumer.New[pgx.Tx](nil, h, nil); err == nil {
		t.Error("New without an inbox succeeded")
	}
	if _, err := consumer.New(ib, nil, nil); err == nil {
		t.Error("New without a handler succeeded")
	}
	e, err := consumer.New(ib, h, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Stop(context.Background()); err != nil {
		t.Errorf("Stop before Start: %v", err)
	}
	if err := e.Submit(context.Background(), newDelivery("a")); err == nil {
		t.Error("Submit before Start succeeded")
	}
}

// TestHandlerPanicIsRetried: a handler that panics fails its attempt (the
// transaction rolls back) instead of the process; the retry succeeds and
// the message is acknowledged.
func TestHandlerPanicIsRetried(t *testing.T) {
	t.Parallel()
	ib := newInbox(t)
	var calls sync.Map
	h := func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		if _, again := calls.LoadOrStore(msg.EventID, true); !again {
			panic("boom")
		}
		return nil
	}
	e, err := consumer.New(ib, h, &consumer.Config{RetryBase: time.Millisecond, RetryMax: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testenv.Context(t, 60*time.Second)
	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	d := newDelivery("a")
	if err := e.Submit(ctx, d); err != nil {
		t.Fatal(err)
	}
	<-d.ended
	if err := e.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if d.acks != 1 {
		t.Fatalf("%d acks, releases %v; want the retry acknowledged", d.acks, d.releases)
	}
}
