package relayd_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxpgx/cdc"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/relayd"
	"github.com/outboxkit/outbox/route"
)

// A log-tailing relay rides out an immediate restart of PostgreSQL (as
// after a crash: no shutdown checkpoint, every connection cut, crash
// recovery) while writers commit with WriteTx, as rows and as logical
// decoding messages: every committed event reaches JetStream, none of a
// transaction whose commit failed unless it did commit, and each
// aggregate's events come first in commit order. The server is a private
// cluster: the shared one is not restarted.
func TestLogTailingSurvivesAnImmediateRestart(t *testing.T) {
	pg := testenv.StartPrivatePostgres(t)
	ctx := testenv.Context(t, 4*time.Minute)
	pool, err := pgxpool.New(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	tb := outboxdriver.Table{Schema: "public", Name: "outbox"}
	drv := outboxpgx.New(pool)
	if _, err := drv.Migrate(ctx, tb, nil); err != nil {
		t.Fatal(err)
	}
	setup, err := cdc.NewSource(pool, tb, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := setup.Setup(ctx); err != nil { // the slot, before writers write messages
		t.Fatal(err)
	}
	setup.Close()

	_, js := testenv.JetStream(t)
	st, prefix := testenv.Stream(t, js)
	router, err := route.New(&route.Config{Destination: prefix + ".all"})
	if err != nil {
		t.Fatal(err)
	}
	rl, err := relayd.Open(ctx, pg.URL(), natsSink(t, ctx, testenv.NATSURL(), prefix), &relayd.Options{
		Source: relayd.SourceCDC,
		Relay:  relay.Config{Router: router, LeaseTTL: time.Second, RetryBase: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := rl.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rl.Stop(context.Background()) })

	// Writers: each owns its aggregates and writes their versions 1, 2, 3...
	// one event per transaction; odd writers as logical decoding messages.
	type payload struct {
		Agg string `json:"agg"`
		V   int    `json:"v"`
	}
	var (
		mu        sync.Mutex
		committed = map[string]payload{} // the commit succeeded
		unknown   = map[string]payload{} // the commit failed: it may have happened
		failures  atomic.Int64
		stop      atomic.Bool
		wg        sync.WaitGroup
	)
	const writers, aggsPerWriter = 4, 5
	for w := range writers {
		var opts []outboxpgx.Option
		if w%2 == 1 {
			opts = append(opts, outboxpgx.WithMessages())
		}
		ob, err := outbox.New(outboxpgx.New(nil, opts...), &outbox.Config{})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			versions := make([]int, aggsPerWriter)
			for i := 0; !stop.Load(); i++ {
				a := i % aggsPerWriter
				versions[a]++
				p := payload{Agg: fmt.Sprintf("w%d-a%d", w, a), V: versions[a]}
				body, _ := json.Marshal(p)
				ev := outbox.Event{ID: uuid.Must(uuid.NewV7()).String(), AggregateType: "order", AggregateID: p.Agg, Type: "Bumped", Payload: body}
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return ob.WriteTx(ctx, tx, ev) })
				mu.Lock()
				if err == nil {
					committed[ev.ID] = p
				} else {
					unknown[ev.ID] = p
				}
				mu.Unlock()
				if err != nil {
					failures.Add(1)
					time.Sleep(20 * time.Millisecond) // the server is restarting
				}
			}
		}()
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(committed)
	}
	testenv.WaitStreamMsgs(t, st, 300, time.Minute) // streaming under load
	pg.Restart(true)
	restarted := count()
	if err := await.Poll(90*time.Second, func() error {
		if n := count() - restarted; n < 300 {
			return fmt.Errorf("writers committed %d events after the restart, want 300", n)
		}
		return nil
	}); err != nil {
		stop.Store(true)
		t.Fatal(err)
	}
	stop.Store(true)
	wg.Wait()
	if failures.Load() == 0 {
		t.Fatal("no write failed: the restart did not happen under load")
	}

	// Every committed event arrives; then the stream is checked.
	n := count()
	testenv.WaitStreamMsgs(t, st, uint64(n), 90*time.Second)
	seen := map[string]bool{}
	last := map[string]int{}
	for _, m := range testenv.StreamMessages(t, st) {
		id := m.Header.Get("id")
		p, ok := committed[id]
		if !ok {
			if p, ok = unknown[id]; !ok {
				t.Fatalf("event %s was never written", id)
			}
		}
		if seen[id] {
			continue // a duplicate (same id): allowed after a fault
		}
		seen[id] = true
		var got payload
		if err := json.Unmarshal(m.Data, &got); err != nil || got != p {
			t.Fatalf("event %s: payload %s, want %+v", id, m.Data, p)
		}
		if p.V <= last[p.Agg] {
			t.Fatalf("aggregate %s: version %d published after %d", p.Agg, p.V, last[p.Agg])
		}
		last[p.Agg] = p.V
	}
	lost := 0
	for id := range committed {
		if !seen[id] {
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d committed events never reached the broker", lost, n)
	}
	t.Logf("%d committed events (and %d whose commit failed during the restart) checked after an immediate restart", n, len(unknown))
}
