// Package sinktest is a conformance suite for [sink.Sink] implementations.
//
// A sink's tests build a [Harness] that connects the suite to the real broker
// (or the in-process fake the sink's tests already use) and call [Run]:
//
//	func TestConformance(t *testing.T) {
//		sinktest.Run(t, sinktest.Harness{New: ..., Dest: ..., Read: ...})
//	}
//
// Every subtest gets its own *testing.T; the harness keys its per-test state
// (stream, topic, queue, prefix, fault proxy) on it, and [PerTest] helps with
// that. The suite calls New at most once per subtest, before Outage and
// TooLarge, and closes the sink itself (Close is idempotent, so the harness may
// close it again in a cleanup).
//
// The suite checks, against the broker:
//
//   - EmptyBatch: Publish of an empty or nil batch returns an empty slice.
//   - OneResultPerMessage: every Publish returns exactly len(msgs) results;
//     on a healthy broker all are nil and Read shows each message once.
//   - AcknowledgedIsDurable: every message Publish returned nil for (150
//     messages over three destinations, one batch) is held by the broker,
//     exactly once, at its destination, with its key, value and headers.
//   - IDHeader: the event id reaches the broker as Received.ID and as the
//     header "id" (exactly one value), whether or not Message.Headers already
//     had an "id" header.
//   - Dedupe (DedupeKey) or RepublishSameID: the same id published twice (in
//     two calls and twice in one batch) succeeds every time and leaves exactly
//     one copy (DedupeKey), or one or two copies (otherwise).
//   - HeadersKeyAndValue: header values arrive in order per name, including
//     repeated names and an empty value; the key arrives natively or in
//     KeyHeader; value bytes are exact, including nil, a large random value
//     and non-JSON bytes (unless the sink refuses those permanently, which is
//     logged).
//   - PerKeyOrder: 200 messages over 5 keys, sent as one batch of 100 and four
//     batches of 25, arrive with each key's messages in publish order.
//   - TooLargeIsPermanent (TooLarge): the oversized message fails with a
//     sink.IsPermanent error that is not sink.IsUnavailable, the messages
//     around it in the batch succeed and are held, it is not.
//   - CancelledContext: an already-cancelled ctx makes Publish return within
//     2s with an error wrapping context.Canceled, not permanent, for every
//     message; the sink works normally afterwards.
//   - DeadlineDuringPublish: with a deadline that ends while a large batch is
//     in flight, Publish returns within 5s, every nil result is held by the
//     broker, no error is permanent, and publishing the failed ones again
//     succeeds.
//   - Close: Close returns nil twice; Publish after Close returns an error,
//     not permanent, for every message, and nothing after Close is stored.
//   - Outage (Outage): while the broker is unreachable, Publish returns
//     within 15s (with a 60s ctx), no result is permanent, at least one is an
//     error (the suite publishes until one fails, for up to 10s, and once
//     more after that), and any nil result is really held; after restore,
//     publishing the same messages again succeeds (retried for up to 45s
//     while the client reconnects) and Read shows each exactly once
//     (DedupeKey) or at least once.
//
// After every subtest, once all its cleanups (the harness's too) have run,
// the suite checks that no goroutine started during the subtest is still
// running, giving them five seconds to end. Run must therefore not run in
// parallel with other tests of the package, and the harness must create
// shared, long-lived resources before calling Run rather than lazily.
package sinktest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/outboxkit/outbox/sink"
)

// Received is one message as the broker holds it.
type Received struct {
	// ID is the event id as the broker holds it: its de-duplication key or
	// message id where it has one, else the "id" header (or field).
	ID string
	// Destination is the real destination the message is held at.
	Destination string
	// Key is the native key; leave it nil when the broker has none (the key
	// is then checked in Headers[Harness.KeyHeader]).
	Key []byte
	// Value is the payload, byte for byte (nil or empty for no payload).
	Value []byte
	// Headers are all headers the broker holds, values in order per name.
	// Names are compared exactly: a harness for a case-insensitive transport
	// should lower-case them (the suite only uses lower-case names).
	Headers map[string][]string
}

// Harness adapts one sink to the suite.
type Harness struct {
	// New returns a fresh sink publishing into an isolated namespace for this test (own stream/topic/queue/prefix); destinations passed to Dest are valid for it.
	New func(t *testing.T) sink.Sink
	// Dest maps a logical destination name ("orders", "payments") to a real one in the test's namespace.
	Dest func(t *testing.T, name string) string
	// Read returns everything the broker durably holds for the given destinations, waiting up to a few seconds until at least want messages are there; in per-destination publish order.
	//
	// Read must not fail the test when fewer than want messages arrive: it
	// returns what there is and the suite reports what is missing. Once want
	// are there it should still return every message held (so that
	// duplicates show). want may be 0.
	Read func(t *testing.T, dests []string, want int) []Received
	// DedupeKey reports whether the broker de-duplicates by message id (JetStream Nats-Msg-Id): then publishing the same id twice must leave one copy.
	DedupeKey bool
	// KeyHeader is the header that carries Message.Key when the broker has no native key ("" when Key is native, e.g. Kafka).
	KeyHeader string
	// TooLarge returns a message the broker refuses permanently, or nil if the sink has no such limit.
	//
	// The suite sets the message's ID, and its Destination to dest when it
	// is empty.
	TooLarge func(t *testing.T, dest string) *sink.Message
	// Outage, when set, makes the broker unreachable for this test's sink until the returned restore func is called (stop/start the real service or cut a fault proxy such as internal/faultproxy).
	//
	// The suite calls Outage after New and after one successful Publish,
	// and calls restore exactly once (also when the subtest fails).
	Outage func(t *testing.T) (restore func())
}

// Time limits the suite enforces.
const (
	// publishTimeout is the ctx deadline of an ordinary Publish.
	publishTimeout = 30 * time.Second
	// cancelledBound is how fast Publish must return on a cancelled ctx.
	cancelledBound = 2 * time.Second
	// deadlineBound is how long after its deadline Publish may return.
	deadlineBound = 5 * time.Second
	// outageCtx is the ctx deadline of a Publish during an outage, and
	// outageBound how fast it must return nonetheless.
	outageCtx   = 60 * time.Second
	outageBound = 15 * time.Second
	// noticeFor is how long the suite keeps publishing during an outage
	// until a Publish fails.
	noticeFor = 10 * time.Second
	// recoverFor is how long the suite keeps publishing after an outage
	// ends, while the client reconnects.
	recoverFor = 45 * time.Second
	// leakGrace is how long goroutines get to end after a subtest.
	leakGrace = 5 * time.Second
)

// Run runs the conformance suite as subtests.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil || h.Dest == nil || h.Read == nil {
		t.Fatal("sinktest: Harness.New, Harness.Dest and Harness.Read are required")
	}
	s := &suite{h: h, run: randHex()}
	tests := []struct {
		name string
		fn   func(*testing.T)
	}{
		{"EmptyBatch", s.emptyBatch},
		{"OneResultPerMessage", s.oneResultPerMessage},
		{"AcknowledgedIsDurable", s.acknowledgedIsDurable},
		{"IDHeader", s.idHeader},
		{"Dedupe", s.dedupe},
		{"HeadersKeyAndValue", s.headersKeyAndValue},
		{"PerKeyOrder", s.perKeyOrder},
		{"TooLargeIsPermanent", s.tooLarge},
		{"CancelledContext", s.cancelledContext},
		{"DeadlineDuringPublish", s.deadlineDuringPublish},
		{"Close", s.close},
		{"Outage", s.outage},
	}
	if !h.DedupeKey {
		tests[4].name = "RepublishSameID"
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			checkGoroutines(t)
			tc.fn(t)
		})
	}
}

// PerTest returns a function that gives each test its own value, for a
// harness's per-test state: init runs on a test's first call (register
// cleanups in it with t.Cleanup), later calls with the same t return the
// same value, and the value is forgotten when the test ends.
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

// checkGoroutines registers, as the test's first cleanup (so it runs last,
// after the harness's), a check that every goroutine started during the test
// has ended.
func checkGoroutines(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		deadline := time.Now().Add(leakGrace)
		for {
			err := goleak.Find(before)
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("goroutines started during the test still run %v after the sink was closed and the test cleaned up (a sink must stop everything it started on Close): %v", leakGrace, err)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

type suite struct {
	h   Harness
	run string // random, so ids never repeat across runs
}

func randHex() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// id returns an event id unique to this run and test.
func (s *suite) id(t *testing.T, n any) string {
	name := t.Name()
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	return fmt.Sprintf("%s-%s-%v", strings.ToLower(name), s.run, n)
}

// newSink returns the harness's sink, closed when the test ends.
func (s *suite) newSink(t *testing.T) sink.Sink {
	t.Helper()
	snk := s.h.New(t)
	if snk == nil {
		t.Fatal("Harness.New returned nil")
	}
	t.Cleanup(func() { _ = snk.Close() })
	return snk
}

func (s *suite) dests(t *testing.T, names ...string) []string {
	t.Helper()
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = s.h.Dest(t, n)
	}
	return out
}

func h(k, v string) sink.Header { return sink.Header{Key: k, Value: v} }

// publish calls Publish with ctx and checks the number of results.
func publish(t *testing.T, snk sink.Sink, ctx context.Context, msgs []sink.Message) []error {
	t.Helper()
	errs := snk.Publish(ctx, msgs)
	if len(errs) != len(msgs) {
		t.Fatalf("Publish returned %d results for %d messages; want exactly one per message", len(errs), len(msgs))
	}
	return errs
}

// publishOK publishes msgs on a healthy broker and fails the test unless
// every result is nil.
func publishOK(t *testing.T, snk sink.Sink, msgs []sink.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	errs := publish(t, snk, ctx, msgs)
	bad := 0
	for i, err := range errs {
		if err != nil {
			if bad++; bad <= 10 {
				t.Errorf("message %d (id %q, destination %q): %v; want nil on a healthy broker", i, msgs[i].ID, msgs[i].Destination, err)
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d messages failed", bad, len(msgs))
	}
}

// read calls Harness.Read for the destinations of msgs.
func (s *suite) read(t *testing.T, dests []string, want int) []Received {
	t.Helper()
	return s.h.Read(t, dests, want)
}

// byID counts received messages per id.
func byID(got []Received) map[string][]Received {
	m := map[string][]Received{}
	for _, r := range got {
		m[r.ID] = append(m[r.ID], r)
	}
	return m
}

// copies says how many copies of a message the broker may hold.
type copies int

const (
	exactlyOnce copies = iota // one copy
	atLeastOnce               // one or more copies
	atMostTwice               // one or two copies
)

// checkHeld checks that got holds every message of want in the given number
// of copies, each matching its message, and nothing with another id unless
// unexpectedOK. It stops the test if it finds a problem.
func (s *suite) checkHeld(t *testing.T, got []Received, want []sink.Message, c copies, unexpectedOK bool) {
	t.Helper()
	ids := byID(got)
	problems := 0
	report := func(format string, args ...any) {
		t.Helper()
		if problems++; problems <= 20 {
			t.Errorf(format, args...)
		}
	}
	seen := map[string]bool{}
	for i := range want {
		m := &want[i]
		if seen[m.ID] {
			continue
		}
		seen[m.ID] = true
		rs := ids[m.ID]
		switch {
		case len(rs) == 0:
			report("message %q (destination %q) was acknowledged but the broker does not hold it (read %d messages)", m.ID, m.Destination, len(got))
			continue
		case c == exactlyOnce && len(rs) != 1:
			report("message %q: the broker holds %d copies, want exactly 1", m.ID, len(rs))
		case c == atMostTwice && len(rs) > 2:
			report("message %q: the broker holds %d copies after two publishes, want 1 or 2", m.ID, len(rs))
		}
		for _, r := range rs {
			for _, p := range s.diff(r, m) {
				report("message %q: %s", m.ID, p)
			}
		}
	}
	if !unexpectedOK {
		for id, rs := range ids {
			if !seen[id] {
				report("the broker holds %d message(s) with id %q at %q that were never acknowledged (an empty id means Read found no id)", len(rs), id, rs[0].Destination)
			}
		}
	}
	if problems > 20 {
		t.Errorf("... and %d more problems", problems-20)
	}
	if problems > 0 {
		t.FailNow()
	}
}

// diff lists how r differs from the message m it was published as.
func (s *suite) diff(r Received, m *sink.Message) []string {
	var out []string
	if r.Destination != m.Destination {
		out = append(out, fmt.Sprintf("held at destination %q, published to %q", r.Destination, m.Destination))
	}
	if !bytes.Equal(r.Value, m.Value) {
		out = append(out, fmt.Sprintf("value %s, want %s", show(r.Value), show(m.Value)))
	}
	want := map[string][]string{}
	for _, hd := range m.Headers {
		want[hd.Key] = append(want[hd.Key], hd.Value)
	}
	if _, ok := want["id"]; !ok {
		want["id"] = []string{m.ID}
	}
	if s.h.KeyHeader == "" {
		if !bytes.Equal(r.Key, m.Key) {
			out = append(out, fmt.Sprintf("key %s, want %s", show(r.Key), show(m.Key)))
		}
	} else if _, ok := want[s.h.KeyHeader]; !ok {
		if len(m.Key) > 0 {
			want[s.h.KeyHeader] = []string{string(m.Key)}
		} else if v, ok := r.Headers[s.h.KeyHeader]; ok && !slices.Equal(v, []string{""}) {
			out = append(out, fmt.Sprintf("message without key has key header %q = %q", s.h.KeyHeader, v))
		}
	}
	names := make([]string, 0, len(want))
	for k := range want {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		if got := r.Headers[k]; !slices.Equal(got, want[k]) {
			what := "header"
			if k == s.h.KeyHeader && len(m.Key) > 0 {
				what = "key header"
			}
			out = append(out, fmt.Sprintf("%s %q = %q, want %q (all headers held: %q)", what, k, got, want[k], r.Headers))
		}
	}
	return out
}

// show formats bytes for an error message, shortened.
func show(b []byte) string {
	if b == nil {
		return "nil"
	}
	if len(b) > 64 {
		return fmt.Sprintf("%q... (%d bytes)", b[:64], len(b))
	}
	return fmt.Sprintf("%q", b)
}

func (s *suite) emptyBatch(t *testing.T) {
	snk := s.newSink(t)
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	for _, batch := range [][]sink.Message{nil, {}} {
		if errs := snk.Publish(ctx, batch); len(errs) != 0 {
			t.Errorf("Publish(%#v) returned %d results %v, want none", batch, len(errs), errs)
		}
	}
}

func (s *suite) oneResultPerMessage(t *testing.T) {
	snk := s.newSink(t)
	d := s.dests(t, "orders", "payments")
	var all []sink.Message
	n := 0
	for _, size := range []int{1, 2, 7, 64} {
		batch := make([]sink.Message, size)
		for i := range batch {
			batch[i] = sink.Message{
				ID:          s.id(t, n),
				Destination: d[n%2],
				Key:         fmt.Appendf(nil, "agg-%d", n%3),
				Value:       fmt.Appendf(nil, `{"n":%d}`, n),
			}
			n++
		}
		publishOK(t, snk, batch)
		all = append(all, batch...)
	}
	s.checkHeld(t, s.read(t, d, len(all)), all, exactlyOnce, false)
}

func (s *suite) acknowledgedIsDurable(t *testing.T) {
	snk := s.newSink(t)
	d := s.dests(t, "orders", "payments", "audit")
	msgs := make([]sink.Message, 150)
	for i := range msgs {
		m := sink.Message{
			ID:          s.id(t, i),
			Destination: d[i%3],
			Key:         fmt.Appendf(nil, "agg-%d", i%7),
			Value:       fmt.Appendf(nil, `{"seq":%d,"note":"durable"}`, i),
		}
		if i%2 == 0 {
			m.Headers = []sink.Header{h("id", m.ID), h("type", "order.created")}
		}
		msgs[i] = m
	}
	publishOK(t, snk, msgs)
	s.checkHeld(t, s.read(t, d, len(msgs)), msgs, exactlyOnce, false)
}

func (s *suite) idHeader(t *testing.T) {
	snk := s.newSink(t)
	d := s.h.Dest(t, "orders")
	msgs := []sink.Message{
		{ID: s.id(t, "no-headers"), Destination: d, Key: []byte("k"), Value: []byte(`{}`)},
		{ID: s.id(t, "other-headers"), Destination: d, Key: []byte("k"), Value: []byte(`{}`),
			Headers: []sink.Header{h("type", "order.created")}},
		{ID: s.id(t, "id-first"), Destination: d, Key: []byte("k"), Value: []byte(`{}`),
			Headers: []sink.Header{h("id", s.id(t, "id-first")), h("type", "order.created")}},
		{ID: s.id(t, "id-later"), Destination: d, Key: []byte("k"), Value: []byte(`{}`),
			Headers: []sink.Header{h("type", "order.created"), h("id", s.id(t, "id-later"))}},
	}
	publishOK(t, snk, msgs)
	got := s.read(t, []string{d}, len(msgs))
	for _, r := range got {
		if v := r.Headers["id"]; len(v) != 1 || v[0] != r.ID {
			t.Errorf("message %q: header \"id\" = %q, want exactly [%q]", r.ID, v, r.ID)
		}
	}
	s.checkHeld(t, got, msgs, exactlyOnce, false)
}

func (s *suite) dedupe(t *testing.T) {
	snk := s.newSink(t)
	d := s.h.Dest(t, "orders")
	m := sink.Message{ID: s.id(t, "dup"), Destination: d, Key: []byte("k"), Value: []byte(`{"v":1}`)}
	last := sink.Message{ID: s.id(t, "last"), Destination: d, Key: []byte("k"), Value: []byte(`{"v":2}`)}
	publishOK(t, snk, []sink.Message{m})
	publishOK(t, snk, []sink.Message{m})
	if !s.h.DedupeKey {
		publishOK(t, snk, []sink.Message{last})
		s.checkHeld(t, s.read(t, []string{d}, 3), []sink.Message{m, last}, atMostTwice, false)
		return
	}
	publishOK(t, snk, []sink.Message{m, m})
	publishOK(t, snk, []sink.Message{last})
	// Read waits for two messages; a copy of m would make three.
	s.checkHeld(t, s.read(t, []string{d}, 2), []sink.Message{m, last}, exactlyOnce, false)
}

func (s *suite) headersKeyAndValue(t *testing.T) {
	snk := s.newSink(t)
	d := s.h.Dest(t, "orders")
	msgs := []sink.Message{
		{
			ID: s.id(t, "headers"), Destination: d, Key: []byte("agg-1"), Value: []byte(`{"n":1,"s":"x y"}`),
			Headers: []sink.Header{
				h("type", "order.created"), h("trace", "t-1"), h("type", "order.again"),
				h("x-empty", ""), h("type", "third with spaces"),
			},
		},
		{ID: s.id(t, "nil-value"), Destination: d, Key: []byte("agg-2")},
		{ID: s.id(t, "nil-key"), Destination: d, Value: []byte(`[1,2,3]`)},
		{ID: s.id(t, "string-json"), Destination: d, Key: []byte("agg:3/x.y"), Value: []byte(`"a string"`),
			Headers: []sink.Header{h("id", s.id(t, "string-json")), h("content-type", "application/json")}},
	}
	publishOK(t, snk, msgs)

	// Non-JSON bytes separately: a sink may refuse them, permanently.
	random := make([]byte, 32<<10)
	_, _ = rand.Read(random)
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	binary := []sink.Message{
		{ID: s.id(t, "all-bytes"), Destination: d, Key: []byte("agg-4"), Value: all},
		{ID: s.id(t, "random-32k"), Destination: d, Key: []byte("agg-4"), Value: random},
		{ID: s.id(t, "not-json"), Destination: d, Key: []byte("agg-4"), Value: []byte("not json \x00\xff\r\n")},
	}
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	errs := publish(t, snk, ctx, binary)
	for i, err := range errs {
		switch {
		case err == nil:
			msgs = append(msgs, binary[i])
		case sink.IsPermanent(err):
			t.Logf("the sink refuses non-JSON value %s permanently: %v", binary[i].ID, err)
		default:
			t.Errorf("message %q with a non-JSON value: transient error %v; want nil, or a permanent error if the sink refuses such values", binary[i].ID, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	s.checkHeld(t, s.read(t, []string{d}, len(msgs)), msgs, exactlyOnce, false)
}

func (s *suite) perKeyOrder(t *testing.T) {
	snk := s.newSink(t)
	d := s.h.Dest(t, "orders")
	const n, keys = 200, 5
	msgs := make([]sink.Message, n)
	seq := map[string]int{} // id -> position among its key's messages
	next := map[string]int{}
	for i := range msgs {
		key := fmt.Sprintf("agg-%d", (i*7+i/13)%keys) // keys interleave irregularly
		msgs[i] = sink.Message{
			ID: s.id(t, i), Destination: d, Key: []byte(key),
			Value: fmt.Appendf(nil, `{"key":%q,"seq":%d}`, key, next[key]),
		}
		seq[msgs[i].ID] = next[key]
		next[key]++
	}
	publishOK(t, snk, msgs[:100]) // within one batch
	for i := 100; i < n; i += 25 {
		publishOK(t, snk, msgs[i:i+25]) // and across batches
	}
	got := s.read(t, []string{d}, n)
	s.checkHeld(t, got, msgs, exactlyOnce, false)
	keyOf := map[string]string{}
	for _, m := range msgs {
		keyOf[m.ID] = string(m.Key)
	}
	last := map[string]int{}
	for _, r := range got {
		k := keyOf[r.ID]
		want := last[k]
		if seq[r.ID] != want {
			t.Fatalf("key %q: message %q (number %d of the key) is held after number %d; want each key's messages in publish order", k, r.ID, seq[r.ID], want-1)
		}
		last[k] = want + 1
	}
	for k, c := range next {
		if last[k] != c {
			t.Errorf("key %q: read %d messages, want %d", k, last[k], c)
		}
	}
}

func (s *suite) tooLarge(t *testing.T) {
	if s.h.TooLarge == nil {
		t.Skip("Harness.TooLarge is nil: the sink has no size limit")
	}
	snk := s.newSink(t)
	d := s.h.Dest(t, "orders")
	big := s.h.TooLarge(t, d)
	if big == nil {
		t.Skip("Harness.TooLarge returned nil: the sink has no size limit")
	}
	m := *big
	m.ID = s.id(t, "too-large")
	if m.Destination == "" {
		m.Destination = d
	}
	before := sink.Message{ID: s.id(t, "before"), Destination: d, Key: []byte("k1"), Value: []byte(`{"small":1}`)}
	after := sink.Message{ID: s.id(t, "after"), Destination: d, Key: []byte("k2"), Value: []byte(`{"small":2}`)}
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	errs := publish(t, snk, ctx, []sink.Message{before, m, after})
	if !sink.IsPermanent(errs[1]) || sink.IsUnavailable(errs[1]) {
		t.Errorf("oversized message: got %v (permanent %v, unavailable %v), want a permanent error", errs[1], sink.IsPermanent(errs[1]), sink.IsUnavailable(errs[1]))
	}
	if errs[0] != nil || errs[2] != nil {
		t.Errorf("the small messages around the oversized one: got %v and %v, want nil", errs[0], errs[2])
	}
	if t.Failed() {
		t.FailNow()
	}
	got := s.read(t, []string{d}, 2)
	if n := len(byID(got)[m.ID]); n > 0 {
		t.Errorf("the broker holds %d copies of the oversized message, which failed permanently", n)
	}
	s.checkHeld(t, got, []sink.Message{before, after}, exactlyOnce, false)
}

func (s *suite) cancelledContext(t *testing.T) {
	snk := s.newSink(t)
	d := s.h.Dest(t, "orders")
	msgs := make([]sink.Message, 10)
	for i := range msgs {
		msgs[i] = sink.Message{ID: s.id(t, i), Destination: d, Key: []byte("k"), Value: []byte(`{}`)}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	errs := publish(t, snk, ctx, msgs)
	if el := time.Since(start); el > cancelledBound {
		t.Errorf("Publish with a cancelled context took %v, want under %v", el, cancelledBound)
	}
	for i, err := range errs {
		if !errors.Is(err, context.Canceled) || sink.IsPermanent(err) {
			t.Errorf("message %d: got %v, want a transient error wrapping context.Canceled", i, err)
		}
	}
	// The sink still works.
	ok := sink.Message{ID: s.id(t, "after"), Destination: d, Key: []byte("k"), Value: []byte(`{"after":true}`)}
	publishOK(t, snk, []sink.Message{ok})
	s.checkHeld(t, s.read(t, []string{d}, 1), []sink.Message{ok}, exactlyOnce, true)
}

func (s *suite) deadlineDuringPublish(t *testing.T) {
	snk := s.newSink(t)
	d := s.dests(t, "orders", "payments")
	// Warm up, so that the deadline does not end during connection set-up.
	warm := sink.Message{ID: s.id(t, "warm-up"), Destination: d[0], Key: []byte("k"), Value: []byte(`{}`)}
	publishOK(t, snk, []sink.Message{warm})

	msgs := make([]sink.Message, 2000)
	for i := range msgs {
		msgs[i] = sink.Message{
			ID: s.id(t, i), Destination: d[i%2], Key: fmt.Appendf(nil, "agg-%d", i%10),
			Value: fmt.Appendf(nil, `{"seq":%d,"pad":%q}`, i, strings.Repeat("x", 200)),
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	start := time.Now()
	errs := publish(t, snk, ctx, msgs)
	if el := time.Since(start); el > 5*time.Millisecond+deadlineBound {
		t.Errorf("Publish returned %v after a 5ms deadline, want within %v of it", el, deadlineBound)
	}
	var acked, failed []sink.Message
	for i, err := range errs {
		if err == nil {
			acked = append(acked, msgs[i])
			continue
		}
		if sink.IsPermanent(err) {
			t.Errorf("message %d: a deadline made it fail permanently: %v", i, err)
		}
		failed = append(failed, msgs[i])
	}
	t.Logf("%d acknowledged before the deadline, %d failed", len(acked), len(failed))
	if t.Failed() {
		t.FailNow()
	}
	if len(failed) > 0 {
		publishOK(t, snk, failed) // the relay publishes them again
	}
	c := exactlyOnce
	if !s.h.DedupeKey {
		c = atLeastOnce // failed ones may have been written before the deadline
	}
	s.checkHeld(t, s.read(t, d, len(msgs)+1), append([]sink.Message{warm}, msgs...), c, false)
}

func (s *suite) close(t *testing.T) {
	snk := s.newSink(t)
	d := s.h.Dest(t, "orders")
	first := sink.Message{ID: s.id(t, "before-close"), Destination: d, Key: []byte("k"), Value: []byte(`{}`)}
	publishOK(t, snk, []sink.Message{first})
	if err := snk.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := snk.Close(); err != nil {
		t.Errorf("second Close: %v, want nil (Close is idempotent)", err)
	}
	late := []sink.Message{
		{ID: s.id(t, "after-close-1"), Destination: d, Key: []byte("k"), Value: []byte(`{}`)},
		{ID: s.id(t, "after-close-2"), Destination: d, Key: []byte("k"), Value: []byte(`{}`)},
	}
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	start := time.Now()
	errs := publish(t, snk, ctx, late)
	if el := time.Since(start); el > cancelledBound {
		t.Errorf("Publish after Close took %v, want under %v", el, cancelledBound)
	}
	for i, err := range errs {
		if err == nil || sink.IsPermanent(err) {
			t.Errorf("Publish after Close, message %d: got %v, want a transient error", i, err)
		}
	}
	if errs := snk.Publish(ctx, nil); len(errs) != 0 {
		t.Errorf("Publish(nil) after Close returned %d results", len(errs))
	}
	if t.Failed() {
		t.FailNow()
	}
	s.checkHeld(t, s.read(t, []string{d}, 1), []sink.Message{first}, exactlyOnce, false)
}

func (s *suite) outage(t *testing.T) {
	if s.h.Outage == nil {
		t.Skip("Harness.Outage is nil")
	}
	snk := s.newSink(t)
	d := s.dests(t, "orders", "payments")
	warm := sink.Message{ID: s.id(t, "warm-up"), Destination: d[0], Key: []byte("k"), Value: []byte(`{}`)}
	publishOK(t, snk, []sink.Message{warm})

	restore := s.h.Outage(t)
	var once sync.Once
	restoreOnce := func() { once.Do(restore) }
	t.Cleanup(restoreOnce)

	msgs := make([]sink.Message, 20)
	for i := range msgs {
		msgs[i] = sink.Message{ID: s.id(t, i), Destination: d[i%2], Key: fmt.Appendf(nil, "agg-%d", i%4),
			Value: fmt.Appendf(nil, `{"seq":%d}`, i)}
	}
	var ackedInOutage []sink.Message
	ackedIDs := map[string]bool{}
	errorsSeen := 0
	// publishInOutage publishes batch as the round'th Publish during the
	// outage, checks its results and returns how many are errors.
	publishInOutage := func(round int, batch []sink.Message) (failed int) {
		ctx, cancel := context.WithTimeout(context.Background(), outageCtx)
		start := time.Now()
		errs := publish(t, snk, ctx, batch)
		el := time.Since(start)
		cancel()
		if el > outageBound {
			t.Errorf("round %d: Publish during an outage took %v, want under %v even with a %v context", round, el, outageBound, outageCtx)
		}
		unavailable, acked := 0, 0
		for i, err := range errs {
			switch {
			case err == nil:
				acked++
				if !ackedIDs[batch[i].ID] {
					ackedIDs[batch[i].ID] = true
					ackedInOutage = append(ackedInOutage, batch[i])
				}
			case sink.IsPermanent(err):
				t.Errorf("round %d, message %d: a broker outage made it fail permanently: %v", round, i, err)
			default:
				errorsSeen++
				if sink.IsUnavailable(err) {
					unavailable++
				}
			}
		}
		t.Logf("round %d: Publish during the outage returned after %v: %d errors (%d marked sink.Unavailable), %d nil; first result: %v",
			round, el.Round(time.Millisecond), len(errs)-acked, unavailable, acked, errs[0])
		return len(errs) - acked
	}
	// Publish right after the cut, and again once the sink has noticed the
	// connection is gone: it shows by an error, in the first round or in
	// one of the rounds that follow until then.
	noticed := publishInOutage(0, msgs[:10]) > 0
	noticeBy := time.Now().Add(noticeFor)
	for round := 1; ; round++ {
		after := noticed
		if publishInOutage(round, msgs[10:]) > 0 {
			noticed = true
		}
		if after || time.Now().After(noticeBy) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if errorsSeen == 0 {
		t.Errorf("every Publish succeeded during the outage: Harness.Outage did not make the broker unreachable")
	}
	restoreOnce()
	if t.Failed() {
		t.FailNow()
	}
	if len(ackedInOutage) > 0 {
		// Before anything is published again: what was acknowledged
		// during the outage must be held.
		s.checkHeld(t, s.read(t, d, len(ackedInOutage)+1), ackedInOutage, atLeastOnce, true)
	}

	// Publish the same messages again until the client has reconnected.
	deadline := time.Now().Add(recoverFor)
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
		errs := publish(t, snk, ctx, msgs)
		cancel()
		var firstErr error
		for i, err := range errs {
			if err != nil {
				if sink.IsPermanent(err) {
					t.Fatalf("after the outage, message %d failed permanently: %v", i, err)
				}
				if firstErr == nil {
					firstErr = err
				}
			}
		}
		if firstErr == nil {
			t.Logf("after the outage, the messages were published again on attempt %d", attempt)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("publishing again still fails %v after the outage ended: %v", recoverFor, firstErr)
		}
		time.Sleep(250 * time.Millisecond)
	}
	c := exactlyOnce
	if !s.h.DedupeKey {
		c = atLeastOnce
	}
	s.checkHeld(t, s.read(t, d, len(msgs)+1), append([]sink.Message{warm}, msgs...), c, false)
}
