package relayd_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/relayd"
	"github.com/outboxkit/outbox/route"
	"github.com/outboxkit/outbox/sink"
)

// Open, Start, a write, Stop: the event reaches the broker at the fixed
// destination, and Stop leaves no goroutine and no connection behind (it
// closes the source, the sink and the pool that Open opened).
func TestOpenRelaysAndStopClosesWhatItOpened(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	drv := outboxpgx.New(pool)
	ob, err := outbox.New(drv, &outbox.Config{Schema: tb.Schema, Table: tb.Name})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Migrate(ctx, nil); err != nil {
		t.Fatal(err)
	}
	_, js := testenv.JetStream(t)
	st, prefix := testenv.Stream(t, js)
	router, err := route.New(&route.Config{Destination: prefix + ".all"})
	if err != nil {
		t.Fatal(err)
	}
	opts := &relayd.Options{
		Schema: tb.Schema, Table: tb.Name,
		Relay: relay.Config{Router: router, PollInterval: 50 * time.Millisecond, LeaseTTL: time.Second},
	}
	before := goroutinesOnly()
	rl, err := relayd.Open(ctx, testenv.DatabaseURL(), natsSink(t, ctx, testenv.NATSURL(), prefix), opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := rl.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ob.Write(ctx, outbox.Event{AggregateType: "order", AggregateID: "1", Type: "Placed", Payload: []byte(`{"n": 1}`)},
		outbox.Event{AggregateType: "customer", AggregateID: "2", Type: "Joined"}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitStreamMsgs(t, st, 2, 30*time.Second)
	for _, m := range testenv.StreamMessages(t, st) {
		if m.Subject != prefix+".all" {
			t.Fatalf("message on %s, want the fixed destination %s.all", m.Subject, prefix)
		}
	}
	if err := rl.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rl.Stop(ctx); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if err := goleak.Find(before...); err != nil {
		t.Fatalf("Stop left goroutines behind: %v", err)
	}
}

// goroutinesOnly lists the goroutines running now as ones goleak ignores,
// so that only those the relay starts are checked.
func goroutinesOnly() []goleak.Option {
	return []goleak.Option{goleak.IgnoreCurrent()}
}

// Open refuses a table that `outbox migrate` never created, and closes
// the pool it opened and the sink it was given.
func TestOpenFailsFastOnATableNotMigrated(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	before := goroutinesOnly()
	snk := newTrackedSink()
	_, err := relayd.Open(ctx, testenv.DatabaseURL(), snk, &relayd.Options{Schema: tb.Schema, Table: tb.Name})
	if !errors.Is(err, relayd.ErrNotMigrated) {
		t.Fatalf("Open on a table not migrated: %v, want ErrNotMigrated", err)
	}
	if !snk.closed.Load() {
		t.Fatal("a failed Open left the sink it was given open")
	}
	if err := goleak.Find(before...); err != nil {
		t.Fatalf("a failed Open left goroutines behind: %v", err)
	}
}

// Bad input gets a clear error and opens nothing: a hostile table name, an
// unknown database scheme, no sink, the relay's own configuration. (An
// unknown sink scheme is sinkurl's.)
func TestOpenRefusesBadInput(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	if _, err := outboxpgx.New(pool).Migrate(ctx, tb, nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, db string
		sink     bool
		opts     *relayd.Options
		want     string
	}{
		{"hostile table", testenv.DatabaseURL(), true, &relayd.Options{Table: `x"; DROP TABLE y; --`}, "not a valid identifier"},
		{"unknown database", "oracle://x", true, nil, `unknown scheme "oracle"`},
		{"no sink", testenv.DatabaseURL(), false, &relayd.Options{Schema: tb.Schema, Table: tb.Name}, "relayd: Open: nil sink"},
		{"lanes", testenv.DatabaseURL(), true, &relayd.Options{Relay: relay.Config{Lanes: 65}}, "relay: Config.Lanes 65: use 1 to 64"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := goroutinesOnly()
			var snk sink.Sink
			var tracked *trackedSink
			if c.sink {
				tracked = newTrackedSink()
				snk = tracked
			}
			_, err := relayd.Open(ctx, c.db, snk, c.opts)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Open: %v, want an error saying %q", err, c.want)
			}
			if tracked != nil && !tracked.closed.Load() {
				t.Fatal("a failed Open left the sink it was given open")
			}
			if err := goleak.Find(before...); err != nil {
				t.Fatalf("a failed Open left goroutines behind: %v", err)
			}
		})
	}
}

// Stop without Start closes what Open opened.
func TestStopWithoutStart(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	if _, err := outboxpgx.New(pool).Migrate(ctx, tb, nil); err != nil {
		t.Fatal(err)
	}
	before := goroutinesOnly()
	rl, err := relayd.Open(ctx, testenv.DatabaseURL(), newTrackedSink(), &relayd.Options{Schema: tb.Schema, Table: tb.Name, Retention: outboxdriver.RetentionKeep})
	if err != nil {
		t.Fatal(err)
	}
	if err := rl.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rl.Start(ctx); err == nil {
		t.Fatal("Start after Stop succeeded")
	}
	if err := goleak.Find(before...); err != nil {
		t.Fatalf("Stop left goroutines behind: %v", err)
	}
}
