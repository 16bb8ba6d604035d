// Package consumertest is a conformance suite for the inbox's broker
// adapters (natsconsumer, kafkaconsumer, amqpconsumer, ...), as sinktest is
// for sinks.
//
// An adapter's tests build a [Harness] that publishes through the
// project's own sink for that broker (so that what is published and what is
// consumed meet exactly as in production) and starts the adapter, and call
// [Run]:
//
//	func TestConformance(t *testing.T) {
//		consumertest.Run(t, consumertest.Harness[pgx.Tx]{Store: ..., Dest: ..., Publish: ..., Start: ..., Crash: ..., Pending: ...})
//	}
//
// Every subtest gets its own *testing.T, runs in parallel with the others
// and asks the harness for its own namespace (stream, topic, queue, key
// prefix) and its own inbox tables; [PerTest] helps key that state on t.
//
// The suite checks, against the real broker and the real database:
//
//   - EffectOnce: 30 events over 3 aggregates, each published twice, take
//     effect exactly once each and the second copies (unless the broker
//     dropped them, Harness.DedupeByID) are suppressed as duplicates; once
//     the adapter stopped, the broker holds nothing unacknowledged
//     (Harness.Pending is 0).
//   - PerAggregateOrder (Harness.Ordered): 4 aggregates of 25 events each,
//     published in batches, take effect in publish order per aggregate
//     with the default concurrency of 8 workers.
//   - CrashBetweenEffectAndAck: the adapter loses its broker connection
//     (Harness.Crash, as a killed process would) after the effect and the
//     inbox row committed and before the acknowledgement; a second adapter
//     receives the redelivery, the inbox suppresses it (a duplicate), the
//     effect happened once, and nothing stays unacknowledged.
//   - PoisonToDeadLetters: with MaxAttempts 3, a payload the handler
//     refuses as Permanent, an event id that is not a UUID and a handler
//     that always fails are recorded in the inbox's dead letters (the last
//     after exactly 3 attempts) and acknowledged, and the aggregate's next
//     event behind them takes effect.
//   - GracefulStop: Stop waits for the handler in hand, which then commits
//     and is acknowledged (a second adapter sees no duplicate of it); the
//     events behind it are handed back and taken by the second adapter,
//     each once.
//
// The handler the suite uses records one effect per event through
// Store.Effect; a payload that is not a JSON object is a Permanent error.
package consumertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/sink"
)

// Effect is one effect the suite's handler committed.
type Effect struct {
	EventID     string // lower-case UUID
	AggregateID string
}

// Store is the database side of the suite: an inbox on fresh tables and an
// effects table next to it.
type Store[TTx any] struct {
	// Inbox returns an inbox named consumer on this test's migrated tables,
	// observed by m.
	Inbox func(t *testing.T, consumer string, m inbox.Metrics) *inbox.Inbox[TTx]
	// Effect records one effect inside the inbox's transaction tx.
	Effect func(ctx context.Context, tx TTx, consumer string, e Effect) error
	// Effects returns the committed effects of consumer in commit order.
	Effects func(t *testing.T, consumer string) []Effect
}

// Adapter is a started consumer adapter.
type Adapter interface {
	// Stop stops it gracefully (see consumer.Engine.Stop). It must return
	// (an error is fine) after Harness.Crash cut the adapter off.
	Stop(ctx context.Context) error
}

// Harness adapts one consumer adapter and its broker to the suite.
type Harness[TTx any] struct {
	// Store returns the inbox tables of this test.
	Store func(t *testing.T) Store[TTx]
	// Dest maps a logical destination ("orders") to a real one in this
	// test's namespace, for Publish and Start.
	Dest func(t *testing.T, name string) string
	// Publish publishes msgs through the project's sink for the broker and
	// returns once the broker holds them all (failing the test otherwise).
	Publish func(t *testing.T, msgs []sink.Message)
	// Start builds the adapter on this test's namespace (every destination
	// Dest returned), with cfg as its engine settings, handling with h
	// through ib, starts it and returns it. The suite stops it.
	Start func(t *testing.T, ib *inbox.Inbox[TTx], h consumer.Handler[TTx], cfg consumer.Config) Adapter
	// Crash cuts the adapter a off its broker as a killed process would:
	// nothing a sends afterwards (an acknowledgement) reaches the broker,
	// which redelivers what a held to the next adapter Start returns.
	Crash func(t *testing.T, a Adapter)
	// Pending returns how many messages of this test's namespace the broker
	// holds unacknowledged (not delivered yet, delivered and not
	// acknowledged, or handed back). The suite calls it after stopping
	// every adapter.
	Pending func(t *testing.T) (int, error)
	// DedupeByID reports whether the broker keeps one copy of messages
	// published with the same event id (JetStream's Nats-Msg-Id): then the
	// adapter sees each event of EffectOnce once, otherwise twice.
	DedupeByID bool
	// Ordered reports whether the broker keeps the order of one
	// aggregate's messages to one consumer (a Kafka partition, a JetStream
	// consumer, a RabbitMQ queue, a Redis stream).
	Ordered bool
	// Settle is how long the suite waits for a redelivery of an
	// unacknowledged message (the broker's ack timeout or session timeout,
	// plus the adapter's start). Default 60s.
	Settle time.Duration
}

// PerTest returns a function that gives each test its own value, for a
// harness's per-test state: see sinktest.PerTest.
func PerTest[T any](init func(t *testing.T) T) func(t *testing.T) T {
	var (
		mu sync.Mutex
		m  = map[*testing.T]T{}
	)
	return func(t *testing.T) T {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		if v, ok := m[t]; ok {
			return v
		}
		v := init(t)
		m[t] = v
		t.Cleanup(func() {
			mu.Lock()
			delete(m, t)
			mu.Unlock()
		})
		return v
	}
}

// Run runs the suite as parallel subtests.
func Run[TTx any](t *testing.T, h Harness[TTx]) {
	t.Helper()
	if h.Store == nil || h.Dest == nil || h.Publish == nil || h.Start == nil || h.Crash == nil || h.Pending == nil {
		t.Fatal("consumertest: Harness.Store, Dest, Publish, Start, Crash and Pending are required")
	}
	if h.Settle <= 0 {
		h.Settle = 60 * time.Second
	}
	s := &suite[TTx]{h: h}
	tests := []struct {
		name string
		fn   func(*testing.T)
	}{
		{"EffectOnce", s.effectOnce},
		{"PerAggregateOrder", s.perAggregateOrder},
		{"CrashBetweenEffectAndAck", s.crash},
		{"PoisonToDeadLetters", s.poison},
		{"GracefulStop", s.gracefulStop},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t)
		})
	}
}

type suite[TTx any] struct{ h Harness[TTx] }

// counts counts the inbox's outcomes.
type counts struct{ n [5]atomic.Int64 }

// Handled implements inbox.Metrics.
func (c *counts) Handled(_ string, o inbox.Outcome, _ time.Duration) {
	if int(o) >= 0 && int(o) < len(c.n) {
		c.n[o].Add(1)
	}
}

func (c *counts) get(o inbox.Outcome) int64 { return c.n[o].Load() }

// run is one test's consumer: its store, inbox, metrics and handler hooks.
type run[TTx any] struct {
	s    *suite[TTx]
	t    *testing.T
	st   Store[TTx]
	name string
	m    counts
	ib   *inbox.Inbox[TTx]
	dest string

	// before, when set, runs at the start of every handler call.
	before func(ctx context.Context, msg inbox.Message) error
	calls  sync.Map // event id -> *atomic.Int64
}

func (s *suite[TTx]) newRun(t *testing.T) *run[TTx] {
	t.Helper()
	r := &run[TTx]{s: s, t: t, st: s.h.Store(t), name: "conformance"}
	r.ib = r.st.Inbox(t, r.name, &r.m)
	r.dest = s.h.Dest(t, "orders")
	return r
}

// body is the JSON payload of the suite's events.
type body struct {
	N    int  `json:"n"`
	Fail bool `json:"fail,omitempty"`
}

func (r *run[TTx]) handler() consumer.Handler[TTx] {
	return func(ctx context.Context, tx TTx, msg inbox.Message) error {
		id := strings.ToLower(msg.EventID)
		n, _ := r.calls.LoadOrStore(id, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		if r.before != nil {
			if err := r.before(ctx, msg); err != nil {
				return err
			}
		}
		var b body
		if err := json.Unmarshal(msg.Payload, &b); err != nil {
			return consumer.Permanent(fmt.Errorf("payload does not decode: %w", err))
		}
		if b.Fail {
			return errors.New("the handler always fails for this event")
		}
		return r.st.Effect(ctx, tx, r.name, Effect{EventID: id, AggregateID: msg.AggregateID})
	}
}

func (r *run[TTx]) callsOf(id string) int64 {
	if n, ok := r.calls.Load(strings.ToLower(id)); ok {
		return n.(*atomic.Int64).Load()
	}
	return 0
}

// start starts an adapter that the test stops at its end.
func (r *run[TTx]) start(cfg consumer.Config) Adapter {
	r.t.Helper()
	a := r.s.h.Start(r.t, r.ib, r.handler(), cfg)
	if a == nil {
		r.t.Fatal("Harness.Start returned nil")
	}
	r.t.Cleanup(func() { stop(r.t, a, false) })
	return a
}

// stop stops a within 60s; an error fails the test when strict.
func stop(t *testing.T, a Adapter, strict bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := a.Stop(ctx); err != nil && strict {
		t.Errorf("stop: %v", err)
	}
}

// event returns an event of aggregate agg with payload n.
func (r *run[TTx]) event(agg string, b body) sink.Message {
	id := uuid.Must(uuid.NewV7()).String()
	v, _ := json.Marshal(b)
	return sink.Message{ID: id, Destination: r.dest, Key: []byte(agg), Type: "OrderPlaced", Value: v,
		Headers: []sink.Header{{Key: inbox.HeaderID, Value: id}}}
}

// effects returns the committed effects per event id.
func (r *run[TTx]) effects() map[string]int {
	out := map[string]int{}
	for _, e := range r.st.Effects(r.t, r.name) {
		out[e.EventID]++
	}
	return out
}

// waitEffects waits until every event of want took effect.
func (r *run[TTx]) waitEffects(want []sink.Message, timeout time.Duration) {
	r.t.Helper()
	await.Eventually(r.t, timeout, func() error {
		got := r.effects()
		missing := 0
		for _, m := range want {
			if got[strings.ToLower(m.ID)] == 0 {
				missing++
			}
		}
		if missing > 0 {
			return fmt.Errorf("%d of %d events have not taken effect (processed %d, duplicates %d, failed %d)",
				missing, len(want), r.m.get(inbox.Processed), r.m.get(inbox.Duplicate), r.m.get(inbox.Failed))
		}
		return nil
	})
}

// once checks that every event of want took effect exactly once and that
// nothing else did.
func (r *run[TTx]) once(want []sink.Message) {
	r.t.Helper()
	got := r.effects()
	ids := map[string]bool{}
	for _, m := range want {
		id := strings.ToLower(m.ID)
		ids[id] = true
		if got[id] != 1 {
			r.t.Errorf("event %s took effect %d times, want once", id, got[id])
		}
	}
	for id, n := range got {
		if !ids[id] {
			r.t.Errorf("event %s took effect %d times, want never", id, n)
		}
	}
}

// settled waits until the broker holds nothing unacknowledged.
func (r *run[TTx]) settled() {
	r.t.Helper()
	await.Eventually(r.t, 30*time.Second, func() error {
		n, err := r.s.h.Pending(r.t)
		if err != nil {
			return err
		}
		if n != 0 {
			return fmt.Errorf("the broker holds %d messages unacknowledged after the adapter stopped, want 0", n)
		}
		return nil
	})
}

func fast() consumer.Config {
	return consumer.Config{RetryBase: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond}
}

func (s *suite[TTx]) effectOnce(t *testing.T) {
	r := s.newRun(t)
	var msgs []sink.Message
	for i := range 30 {
		msgs = append(msgs, r.event(fmt.Sprintf("agg-%d", i%3), body{N: i}))
	}
	s.h.Publish(t, msgs)
	s.h.Publish(t, msgs) // the relay's retry of a batch it did not see confirmed
	a := r.start(fast())
	r.waitEffects(msgs, 60*time.Second)
	// The second copies arrive behind the first ones of their aggregate:
	// wait until each was seen.
	copies := int64(2 * len(msgs))
	if s.h.DedupeByID {
		copies = int64(len(msgs))
	}
	await.Eventually(t, 60*time.Second, func() error {
		if seen := r.m.get(inbox.Processed) + r.m.get(inbox.Duplicate); seen < copies {
			return fmt.Errorf("inbox saw %d messages, want %d", seen, copies)
		}
		return nil
	})
	stop(t, a, true)
	r.settled()
	r.once(msgs)
	if p := r.m.get(inbox.Processed); p != int64(len(msgs)) {
		t.Errorf("inbox processed %d events, want %d", p, len(msgs))
	}
	if d := r.m.get(inbox.Duplicate); d != copies-int64(len(msgs)) {
		t.Errorf("inbox suppressed %d duplicates, want %d", d, copies-int64(len(msgs)))
	}
	t.Logf("%d events published twice: processed %d, duplicates suppressed %d", len(msgs), r.m.get(inbox.Processed), r.m.get(inbox.Duplicate))
}

func (s *suite[TTx]) perAggregateOrder(t *testing.T) {
	if !s.h.Ordered {
		t.Skip("the harness says the broker does not keep per-aggregate order (Harness.Ordered false)")
	}
	r := s.newRun(t)
	const aggs, per = 4, 25
	var msgs []sink.Message
	for i := range aggs * per {
		msgs = append(msgs, r.event(fmt.Sprintf("agg-%d", i%aggs), body{N: i}))
	}
	a := r.start(fast())
	for i := 0; i < len(msgs); i += 20 {
		s.h.Publish(t, msgs[i:i+20])
	}
	r.waitEffects(msgs, 60*time.Second)
	stop(t, a, true)
	r.settled()
	r.once(msgs)
	pos := map[string]int{}
	for i, m := range msgs {
		pos[strings.ToLower(m.ID)] = i
	}
	last := map[string]int{}
	for _, e := range r.st.Effects(t, r.name) {
		p, ok := pos[e.EventID]
		if !ok {
			continue
		}
		if prev, seen := last[e.AggregateID]; seen && p < prev {
			t.Errorf("aggregate %q: event #%d took effect after event #%d, want publish order", e.AggregateID, p, prev)
		}
		last[e.AggregateID] = p
	}
}

func (s *suite[TTx]) crash(t *testing.T) {
	r := s.newRun(t)
	target := r.event("agg-crash", body{N: 1})
	after := r.event("agg-other", body{N: 2})
	committed := make(chan struct{})
	resume := make(chan struct{})
	var once sync.Once
	cfg := fast()
	cfg.OnStage = func(st consumer.Stage, msg inbox.Message) {
		if st == consumer.StageHandled && strings.EqualFold(msg.EventID, target.ID) {
			once.Do(func() {
				close(committed)
				<-resume // the acknowledgement waits for the crash
			})
		}
	}
	a := r.start(cfg)
	s.h.Publish(t, []sink.Message{target})
	select {
	case <-committed:
	case <-time.After(60 * time.Second):
		close(resume)
		t.Fatal("the event was not handled within 60s")
	}
	s.h.Crash(t, a)
	close(resume) // the acknowledgement now goes nowhere
	began := time.Now()
	stop(t, a, false)
	t.Logf("the crashed adapter stopped in %v", time.Since(began).Round(time.Millisecond))
	began = time.Now()
	if got := r.effects()[strings.ToLower(target.ID)]; got != 1 {
		t.Fatalf("after the commit the event took effect %d times, want once", got)
	}

	b := r.start(fast())
	s.h.Publish(t, []sink.Message{after})
	r.waitEffects([]sink.Message{after}, s.h.Settle)
	await.Eventually(t, s.h.Settle, func() error {
		if d := r.m.get(inbox.Duplicate); d < 1 {
			return fmt.Errorf("the unacknowledged event was not redelivered to the second adapter (duplicates suppressed %d, handler calls %d)",
				d, r.callsOf(target.ID))
		}
		return nil
	})
	t.Logf("the redelivery was suppressed %v after the second adapter started", time.Since(began).Round(time.Millisecond))
	stop(t, b, true)
	r.settled()
	r.once([]sink.Message{target, after})
	if n := r.callsOf(target.ID); n != 1 {
		t.Errorf("the handler ran %d times for the event, want once (the redelivery is suppressed before it)", n)
	}
}

func (s *suite[TTx]) poison(t *testing.T) {
	r := s.newRun(t)
	bad := r.event("agg-p", body{})
	bad.Value = []byte("not json")
	failing := r.event("agg-p", body{N: 2, Fail: true})
	invalid := r.event("agg-p", body{N: 3})
	invalid.ID = "not-a-uuid"
	invalid.Headers = []sink.Header{{Key: inbox.HeaderID, Value: invalid.ID}}
	good := r.event("agg-p", body{N: 4})
	cfg := fast()
	cfg.MaxAttempts = 3
	a := r.start(cfg)
	s.h.Publish(t, []sink.Message{bad, failing, invalid, good})
	r.waitEffects([]sink.Message{good}, 60*time.Second)
	var dls []inbox.DeadLetter
	await.Eventually(t, 30*time.Second, func() error {
		var err error
		if dls, err = r.ib.DeadLetters(context.Background(), 100); err != nil {
			return err
		}
		if len(dls) < 3 {
			return fmt.Errorf("%d dead letters, want 3", len(dls))
		}
		return nil
	})
	stop(t, a, true)
	r.settled()
	r.once([]sink.Message{good})
	byID := map[string]inbox.DeadLetter{}
	for _, d := range dls {
		byID[strings.ToLower(d.EventID)] = d
	}
	if len(dls) != 3 {
		t.Errorf("%d dead letters, want 3: %+v", len(dls), dls)
	}
	for _, c := range []struct {
		m     sink.Message
		cause string
	}{{bad, "payload does not decode"}, {failing, "gave up after 3 attempts"}, {invalid, "not a UUID"}} {
		d, ok := byID[strings.ToLower(c.m.ID)]
		if !ok {
			t.Errorf("event %s is not in the dead letters", c.m.ID)
			continue
		}
		if !strings.Contains(d.Error, c.cause) {
			t.Errorf("dead letter %s: cause %q, want it to mention %q", c.m.ID, d.Error, c.cause)
		}
		if string(d.Payload) != string(c.m.Value) {
			t.Errorf("dead letter %s: payload %q, want %q as published", c.m.ID, d.Payload, c.m.Value)
		}
	}
	if n := r.callsOf(failing.ID); n != 3 {
		t.Errorf("the failing handler ran %d times, want 3 (MaxAttempts)", n)
	}
	if n := r.callsOf(bad.ID); n != 1 {
		t.Errorf("the handler ran %d times for the permanent failure, want once", n)
	}
}

func (s *suite[TTx]) gracefulStop(t *testing.T) {
	r := s.newRun(t)
	first := r.event("agg-s", body{N: 0})
	var rest []sink.Message
	for i := range 4 {
		rest = append(rest, r.event("agg-s", body{N: i + 1}))
	}
	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	r.before = func(ctx context.Context, msg inbox.Message) error {
		if strings.EqualFold(msg.EventID, first.ID) {
			once.Do(func() {
				close(entered)
				<-release
			})
		}
		return nil
	}
	a := r.start(fast())
	s.h.Publish(t, append([]sink.Message{first}, rest...))
	select {
	case <-entered:
	case <-time.After(60 * time.Second):
		close(release)
		t.Fatal("the first event was not handled within 60s")
	}
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		stopped <- a.Stop(ctx)
	}()
	select {
	case err := <-stopped:
		close(release)
		t.Fatalf("Stop returned (%v) while a handler was still in hand", err)
	default:
	}
	close(release)
	if err := <-stopped; err != nil {
		t.Fatalf("stop: %v", err)
	}
	if got := r.effects()[strings.ToLower(first.ID)]; got != 1 {
		t.Fatalf("the message in hand at stop took effect %d times, want once", got)
	}
	r.before = nil
	b := r.start(fast())
	r.waitEffects(rest, s.h.Settle)
	stop(t, b, true)
	r.settled()
	r.once(append([]sink.Message{first}, rest...))
	if d := r.m.get(inbox.Duplicate); d != 0 {
		t.Errorf("%d duplicates suppressed, want 0: the message in hand at stop was not acknowledged", d)
	}
}

// PublishAll publishes msgs through s and fails the test unless the broker
// acknowledged every one: the usual Harness.Publish, with the project's
// sink for the broker.
func PublishAll(t *testing.T, s sink.Sink, msgs []sink.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, err := range s.Publish(ctx, msgs) {
		if err != nil {
			t.Fatalf("publish %s: %v", msgs[i].ID, err)
		}
	}
}
