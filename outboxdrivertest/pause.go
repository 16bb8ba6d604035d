package outboxdrivertest

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
)

// relayPoll is the poll interval of the relays pipeline.start runs.
const relayPoll = 50 * time.Millisecond

// pauseWriter commits one event to each of two aggregates of "order" and
// of "invoice" every 20ms until stopped, noting when each write began.
type pauseWriter struct {
	mu      sync.Mutex
	written map[string]time.Time // event id -> when its write began
	bodies  map[string]body
	stop    chan struct{}
	done    chan struct{}
}

func (e *env) startPauseWriter() *pauseWriter {
	w := &pauseWriter{written: map[string]time.Time{}, bodies: map[string]body{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for n := 0; ; n++ {
			var evs []outbox.Event
			for _, a := range [][2]string{{"order", "o1"}, {"order", "o2"}, {"invoice", "i1"}, {"invoice", "i2"}} {
				p, _ := json.Marshal(body{Agg: a[0] + "/" + a[1], N: n})
				evs = append(evs, outbox.Event{ID: newID(), AggregateType: a[0], AggregateID: a[1], Type: "Changed", Payload: p})
			}
			at := time.Now()
			if err := e.s.h.Write(e.ctx, e.table, true, evs...); err != nil {
				e.t.Errorf("%s: write: %v", e.s.h.Name, err)
				return
			}
			w.mu.Lock()
			for _, ev := range evs {
				var b body
				_ = json.Unmarshal(ev.Payload, &b)
				w.written[ev.ID], w.bodies[ev.ID] = at, b
			}
			w.mu.Unlock()
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
		}
	}()
	e.t.Cleanup(w.halt)
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

func (w *pauseWriter) event(id string) (time.Time, body, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	at, ok := w.written[id]
	return at, w.bodies[id], ok
}

func (w *pauseWriter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.written)
}

// testPauseResume pauses one scope (an aggregate type, then a
// destination) under a running relay while writers commit: nothing of
// the scope committed more than one poll interval after the pause is
// published, the other aggregate type flows meanwhile, the status shows
// the pause; after resume every event arrives, each aggregate in order.
func (s *suite) testPauseResume(t *testing.T) {
	ctl := s.h.Store
	for _, scope := range []outboxdriver.PauseScope{
		{Kind: outboxdriver.PauseAggregateType, Value: "order"},
		{Kind: outboxdriver.PauseDestination, Value: destPrefix + ".order"},
	} {
		t.Run(string(scope.Kind), func(t *testing.T) {
			e := s.newEnv(t, partitions)
			p := e.pipeline()
			p.start("relay-1")
			w := e.startPauseWriter()
			p.rec.waitDistinct(t, 16, 30*time.Second)

			by := outboxdriver.Acting{Name: "drivertest", Role: "operator", Reason: "receiver maintenance"}
			if changed, err := ctl.SetPause(e.ctx, e.table, scope, by); err != nil || !changed {
				t.Fatalf("%s: pause %s: %v, %v", s.h.Name, scope, changed, err)
			}
			cutoff := time.Now().Add(relayPoll) // events written after it must wait
			deadline := cutoff.Add(10 * relayPoll)
			for {
				flowed := false
				for _, d := range p.rec.deliveries() {
					at, b, ok := w.event(d.ID)
					if !ok || !at.After(cutoff) {
						continue
					}
					if d.Destination == destPrefix+".order" {
						t.Fatalf("%s: %s published %s #%d, written %s after the pause took effect", s.h.Name, scope, b.Agg, b.N, at.Sub(cutoff))
					}
					flowed = true
				}
				if time.Now().After(deadline) && flowed {
					break
				}
				if time.Now().After(deadline.Add(20 * time.Second)) {
					t.Fatalf("%s: the invoices, not paused, delivered nothing written after the pause", s.h.Name)
				}
				time.Sleep(relayPoll / 4)
			}
			if st := e.status(); len(st.Pauses) != 1 || st.Pauses[0].PauseScope != scope || st.Pauses[0].Reason != by.Reason || st.DeadLetters != 0 || st.Backlog == 0 {
				t.Fatalf("%s: status while paused: pauses %+v, %d dead letters, backlog %d", s.h.Name, st.Pauses, st.DeadLetters, st.Backlog)
			}

			w.halt()
			if changed, err := ctl.LiftPause(e.ctx, e.table, scope, by); err != nil || !changed {
				t.Fatalf("%s: resume %s: %v, %v", s.h.Name, scope, changed, err)
			}
			p.rec.waitDistinct(t, w.count(), 60*time.Second)
			var st outboxdriver.Status
			await.Eventually(t, 30*time.Second, func() error {
				if st = e.status(); st.Backlog != 0 {
					return fmt.Errorf("backlog %d", st.Backlog)
				}
				return nil
			})
			next := map[string]int{}
			seen := map[string]bool{}
			for _, d := range p.rec.deliveries() {
				_, b, ok := w.event(d.ID)
				if !ok {
					t.Fatalf("%s: delivered %s, which nobody wrote", s.h.Name, d.ID)
				}
				if seen[d.ID] {
					continue
				}
				seen[d.ID] = true
				if b.N != next[b.Agg] {
					t.Fatalf("%s: %s: #%d arrived first after #%d; want commit order", s.h.Name, b.Agg, b.N, next[b.Agg]-1)
				}
				next[b.Agg]++
			}
			if len(seen) != w.count() {
				t.Fatalf("%s: %d of %d events arrived", s.h.Name, len(seen), w.count())
			}
		})
	}
}
