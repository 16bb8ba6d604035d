package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/relay"
)

// written is one event the pause test wrote, and when its commit began.
type written struct {
	typ, agg string
	n        int
	at       time.Time
}

// pauseWriter writes one event to each of two aggregates of "order" and
// of "invoice" every 20ms until stopped, recording when each commit began.
type pauseWriter struct {
	mu     sync.Mutex
	events []written
	stop   chan struct{}
	done   chan struct{}
}

func (e *env) startPauseWriter(t *testing.T) *pauseWriter {
	w := &pauseWriter{stop: make(chan struct{}), done: make(chan struct{})}
	aggs := [][2]string{{"order", "o1"}, {"order", "o2"}, {"invoice", "i1"}, {"invoice", "i2"}}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		ctx := context.Background()
		for n := 0; ; n++ {
			var evs []outbox.Event
			for _, a := range aggs {
				b, _ := json.Marshal(payload{a[0] + "/" + a[1], n})
				evs = append(evs, outbox.Event{AggregateType: a[0], AggregateID: a[1], Type: "Changed", Payload: b})
			}
			tx, err := e.pool.Begin(ctx)
			if err == nil {
				err = e.ob.WriteTx(ctx, tx, evs...)
			}
			at := time.Now()
			if err == nil {
				err = tx.Commit(ctx)
			}
			if err != nil {
				if tx != nil {
					tx.Rollback(ctx)
				}
				t.Errorf("write: %v", err)
				return
			}
			w.mu.Lock()
			for _, a := range aggs {
				w.events = append(w.events, written{a[0], a[0] + "/" + a[1], n, at})
			}
			w.mu.Unlock()
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(w.halt)
	return w
}

func (w *pauseWriter) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

func (w *pauseWriter) snapshot() []written {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]written(nil), w.events...)
}

// A pause stops the claims of its scope within one poll interval while
// the other scopes flow; paused events spend no attempt and are not
// dead-lettered; resume delivers every event, each aggregate in order.
func TestPauseStopsScopeResumeDeliversAll(t *testing.T) {
	testenv.ForSources(t, testPauseStopsScopeResumeDeliversAll)
}

func testPauseStopsScopeResumeDeliversAll(t *testing.T, source string) {
	const poll = 200 * time.Millisecond
	for _, tc := range []struct {
		name   string
		scope  func(prefix string) outboxdriver.PauseScope
		paused func(typ string) bool
	}{
		{"aggregatetype", func(string) outboxdriver.PauseScope {
			return outboxdriver.PauseScope{Kind: outboxdriver.PauseAggregateType, Value: "order"}
		}, func(typ string) bool { return typ == "order" }},
		{"destination", func(prefix string) outboxdriver.PauseScope {
			return outboxdriver.PauseScope{Kind: outboxdriver.PauseDestination, Value: prefix + ".order"}
		}, func(typ string) bool { return typ == "order" }},
		{"all", func(string) outboxdriver.PauseScope {
			return outboxdriver.PauseScope{Kind: outboxdriver.PauseAll}
		}, func(string) bool { return true }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnvFor(t, source)
			// Small batches and two lanes: a paused backlog must not fill
			// the claims of the scope that flows.
			e.start(t, nil, relay.Config{PollInterval: poll, BatchSize: 8, Lanes: 2})
			drv := outboxpgx.New(e.pool)
			w := e.startPauseWriter(t)
			testenv.WaitStreamMsgs(t, e.stream, 20, 10*time.Second)

			by := outboxdriver.Acting{Name: "test", Role: "operator", Reason: "receiver maintenance"}
			scope := tc.scope(e.prefix)
			if ok, err := drv.SetPause(context.Background(), e.table, scope, by); err != nil || !ok {
				t.Fatalf("pause: %v, %v", ok, err)
			}
			pausedAt := time.Now()
			cutoff := pausedAt.Add(poll) // events committed after it must wait

			// Watch the stream for five poll intervals past the cutoff, and
			// for the other scope to deliver events written after it.
			deadline := cutoff.Add(5 * poll)
			var msgs []payload
			var read uint64 // stream sequence read up to
			for {
				info, err := e.stream.Info(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				for ; read < info.State.LastSeq; read++ {
					m, err := e.stream.GetMsg(context.Background(), read+1)
					if err != nil {
						t.Fatal(err)
					}
					var p payload
					if err := json.Unmarshal(m.Data, &p); err != nil {
						t.Fatal(err)
					}
					msgs = append(msgs, p)
				}
				written := map[string]time.Time{}
				for _, ev := range w.snapshot() {
					written[fmt.Sprint(ev.agg, ev.n)] = ev.at
				}
				flowedAfter := false
				for _, m := range msgs {
					at := written[fmt.Sprint(m.Agg, m.N)]
					typ := m.Agg[:len(m.Agg)-3]
					if tc.paused(typ) && at.After(cutoff) {
						t.Fatalf("%s published %s #%d, committed %s after the pause: more than one poll interval", scope, m.Agg, m.N, at.Sub(pausedAt))
					}
					if !tc.paused(typ) && at.After(cutoff) {
						flowedAfter = true
					}
				}
				if time.Now().After(deadline) && (flowedAfter || tc.name == "all") {
					break
				}
				if time.Now().After(deadline.Add(10 * time.Second)) {
					t.Fatalf("the scope that is not paused delivered nothing written after the pause")
				}
				time.Sleep(poll / 4)
			}

			// The paused events wait untouched: no attempt, no dead letter.
			var waiting, tried int64
			if err := e.pool.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE attempts > 0 OR last_error IS NOT NULL) FROM `+
				e.table.Qualified("")+` WHERE published_at IS NULL`).Scan(&waiting, &tried); err != nil {
				t.Fatal(err)
			}
			if waiting == 0 || tried != 0 {
				t.Fatalf("while paused: %d events waiting (want some), %d of them with attempts (want 0)", waiting, tried)
			}
			if st := e.status(t); st.DeadLetters != 0 || len(st.Pauses) != 1 || st.Pauses[0].PauseScope != scope || st.Pauses[0].Reason != by.Reason {
				t.Fatalf("status while paused: %d dead letters, pauses %+v", st.DeadLetters, st.Pauses)
			}

			w.halt()
			if ok, err := drv.LiftPause(context.Background(), e.table, scope, by); err != nil || !ok {
				t.Fatalf("resume: %v, %v", ok, err)
			}
			all := w.snapshot()
			testenv.WaitStreamMsgs(t, e.stream, uint64(len(all)), 30*time.Second)
			e.waitBacklog(t, 0, 10*time.Second)
			msgs = decode(t, testenv.StreamMessages(t, e.stream))
			if len(msgs) != len(all) {
				t.Fatalf("%d messages for %d events", len(msgs), len(all))
			}
			next := map[string]int{}
			for _, m := range msgs {
				if m.N != next[m.Agg] {
					t.Fatalf("%s: got #%d, want #%d: order broken or an event lost", m.Agg, m.N, next[m.Agg])
				}
				next[m.Agg]++
			}
		})
	}
}
