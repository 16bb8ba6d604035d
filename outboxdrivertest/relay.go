package outboxdrivertest

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/route"
)

// destPrefix starts the destination of every message of the end-to-end
// cases: the router makes it destPrefix.<aggregatetype>.
const destPrefix = "drivertest"

// pipeline is a table relayed into a recorder of its own.
type pipeline struct {
	e   *env
	rec *recorder
	log *slog.Logger
}

func (e *env) pipeline() *pipeline {
	log := slog.New(slog.NewTextHandler(testWriter{e.t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return &pipeline{e: e, rec: newRecorder(), log: log}
}

// testWriter sends log lines to the test log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// running is a started relay with its own Source and sink.
type running struct {
	*relay.Relay
	t    testing.TB
	src  outboxdriver.Source
	snk  *recordingSink
	once sync.Once
}

// stop stops the relay (waiting up to 30s for its batch in flight), then
// closes its sink and Source, as a relay process does when it exits.
func (r *running) stop() {
	r.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := r.Stop(ctx); err != nil {
			r.t.Errorf("stop relay %s: %v", r.src.RelayName(), err)
		}
		r.snk.Close()
		if err := r.src.Close(); err != nil {
			r.t.Errorf("close source of relay %s: %v", r.src.RelayName(), err)
		}
	})
}

// start runs a relay named name over the table into the recorder, with
// short leases and small batches; it is stopped when the test ends.
func (p *pipeline) start(name string) *running {
	t := p.e.t
	t.Helper()
	src, err := p.e.s.h.Store.NewSource(p.e.table, &outboxdriver.SourceConfig{RelayName: name, Logger: p.log})
	if err != nil {
		t.Fatalf("%s: new source: %v", p.e.s.h.Name, err)
	}
	snk := p.rec.sink()
	router, err := route.New(&route.Config{Replacement: destPrefix + ".${routedByValue}"})
	if err != nil {
		src.Close()
		t.Fatalf("router: %v", err)
	}
	r, err := relay.New(src, snk, &relay.Config{
		BatchSize:    10,
		PollInterval: relayPoll,
		LeaseTTL:     1500 * time.Millisecond,
		RetryBase:    10 * time.Millisecond,
		RetryMax:     50 * time.Millisecond,
		Router:       router,
		Logger:       p.log,
	})
	if err != nil {
		src.Close()
		t.Fatalf("relay: %v", err)
	}
	run := &running{Relay: r, t: t, src: src, snk: snk}
	t.Cleanup(run.stop)
	if err := r.Start(context.Background()); err != nil {
		t.Fatalf("start relay: %v", err)
	}
	return run
}

// stopMidStream stops r once the sink has acknowledged at least n distinct
// events, while the writers are still at work, and logs how far delivery
// had come.
func (p *pipeline) stopMidStream(r *running, n int) {
	p.rec.waitDistinct(p.e.t, n, 60*time.Second)
	r.stop()
	msgs, distinct := p.rec.counts()
	p.e.t.Logf("relay %s stopped after the sink acknowledged %d messages (%d distinct events)", r.src.RelayName(), msgs, distinct)
}

// workload is what concurrent writers committed and rolled back.
type workload struct {
	mu        sync.Mutex
	committed map[string]body // by event id
	rolled    map[string]bool
	versions  map[string]int // events committed per aggregate
}

// writeConcurrently starts writers goroutines, each committing txs
// transactions of one or two events for three aggregates of its own (so
// each aggregate's insertion order is its commit order), rolling every
// fifth back. The returned func waits for them and returns what they did.
func (p *pipeline) writeConcurrently(writers, txs int) func() *workload {
	w := &workload{committed: map[string]body{}, rolled: map[string]bool{}, versions: map[string]int{}}
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() {
			next := map[string]int{}
			for k := range txs {
				agg := fmt.Sprintf("w%d-a%d", i, k%3)
				commit := k%5 != 4
				var events []outbox.Event
				for j := range 1 + k%2 {
					n := next[agg] + j
					if !commit {
						n = -1 - j // never published
					}
					events = append(events, ev(agg, n))
				}
				if err := p.e.s.h.Write(p.e.ctx, p.e.table, commit, events...); err != nil {
					p.e.t.Errorf("%s: writer %d, transaction %d (commit %v): %v", p.e.s.h.Name, i, k, commit, err)
					return
				}
				w.mu.Lock()
				for _, x := range events {
					var b body
					_ = json.Unmarshal(x.Payload, &b)
					if commit {
						w.committed[x.ID] = b
						w.versions[agg]++
					} else {
						w.rolled[x.ID] = true
					}
				}
				w.mu.Unlock()
				if commit {
					next[agg] += len(events)
				}
			}
		})
	}
	return func() *workload {
		wg.Wait()
		if p.e.t.Failed() {
			p.e.t.FailNow()
		}
		return w
	}
}

// verify waits until the sink has acknowledged as many distinct events as
// were committed and the backlog has drained, then checks what the sink
// acknowledged, in order: every committed event (duplicates allowed, by
// id) with its destination, key and payload, none of a rolled-back
// transaction, and each aggregate's events first in commit order.
func (p *pipeline) verify(w *workload) {
	t, e := p.e.t, p.e
	t.Helper()
	p.rec.waitDistinct(t, len(w.committed), 60*time.Second)
	var st outboxdriver.Status
	await.Eventually(t, 60*time.Second, func() error {
		if st = e.status(); st.Backlog != 0 {
			return fmt.Errorf("backlog %d of %d committed events", st.Backlog, len(w.committed))
		}
		return nil
	})
	if st.DeadLetters != 0 {
		t.Fatalf("%d dead letters; the sink acknowledged every event", st.DeadLetters)
	}
	msgs := p.rec.deliveries()
	seen := map[string]bool{}
	next := map[string]int{}
	for i, m := range msgs {
		id := m.ID
		if m.HeaderID != id {
			t.Fatalf("message %d has id %q and header id %q; want the same", i, id, m.HeaderID)
		}
		if w.rolled[id] {
			t.Fatalf("message %d is event %s of a rolled-back transaction", i, id)
		}
		b, ok := w.committed[id]
		if !ok {
			t.Fatalf("message %d has id %q, which nobody committed", i, id)
		}
		if m.Destination != destPrefix+".order" || m.Key != b.Agg {
			t.Fatalf("message %d: destination %q key %q; want %q and %q", i, m.Destination, m.Key, destPrefix+".order", b.Agg)
		}
		var got body
		if err := json.Unmarshal(m.Value, &got); err != nil || got != b {
			t.Fatalf("message %d (event %s) carries payload %q; want %s/%d", i, id, m.Value, b.Agg, b.N)
		}
		if seen[id] {
			continue // a duplicate, same id: allowed (at least once)
		}
		seen[id] = true
		if b.N != next[b.Agg] {
			t.Fatalf("%s: event %d arrived first after event %d; want commit order", b.Agg, b.N, next[b.Agg]-1)
		}
		next[b.Agg]++
	}
	if len(seen) != len(w.committed) {
		t.Fatalf("%d distinct committed events arrived, %d committed", len(seen), len(w.committed))
	}
	for agg, n := range w.versions {
		if next[agg] != n {
			t.Fatalf("%s: %d events arrived, %d committed", agg, next[agg], n)
		}
	}
	t.Logf("all %d committed events arrived in order (%d messages, %d events rolled back)", len(w.committed), len(msgs), len(w.rolled))
}

// testRelayEndToEnd runs the real relay engine over the driver's Source
// into a recording sink while writers commit and roll back concurrently; the
// relay is stopped mid-stream and another takes over. Every committed event
// arrives, none rolled back, in commit order per aggregate.
func (s *suite) testRelayEndToEnd(t *testing.T) {
	e := s.newEnv(t, partitions)
	p := e.pipeline()
	first := p.start("relay-1")
	wait := p.writeConcurrently(4, 40)
	p.stopMidStream(first, 20)
	p.start("relay-2")
	w := wait()
	p.verify(w)
}

// testTwoRelaysEndToEnd runs two relays at once on one table while writers
// commit and roll back concurrently, and stops one of them mid-stream.
func (s *suite) testTwoRelaysEndToEnd(t *testing.T) {
	e := s.newEnv(t, partitions)
	p := e.pipeline()
	first, second := p.start("relay-1"), p.start("relay-2")
	await.Eventually(t, 30*time.Second, func() error {
		if a, b := len(first.Partitions()), len(second.Partitions()); a == 0 || b == 0 {
			return fmt.Errorf("the relays own %d and %d partitions; want both to share them", a, b)
		}
		return nil
	})
	wait := p.writeConcurrently(4, 40)
	p.stopMidStream(first, 20)
	w := wait()
	p.verify(w)
	await.Eventually(t, 30*time.Second, func() error {
		if n := len(second.Partitions()); n != partitions {
			return fmt.Errorf("the remaining relay owns %d partitions, want all %d", n, partitions)
		}
		return nil
	})
}
