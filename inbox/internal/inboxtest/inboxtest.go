// Package inboxtest is the conformance suite every inbox driver passes: the
// same event twice, concurrently to two consumer instances, to two
// consumers, after a failed handler; stale versions; retention; invalid
// messages; dead letters. Each driver's tests call Run with an Env on a
// real database.
package inboxtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Env is one freshly migrated inbox table on a real database, with an
// effects table (key text) next to it for handlers to write.
type Env[TTx any] struct {
	// Driver is the driver under test, on a database with room for at
	// least three connections.
	Driver inbox.Driver[TTx]
	// Table is the migrated inbox table.
	Table outboxdriver.Table
	// Begin opens a transaction; Commit and Rollback end it.
	Begin    func(ctx context.Context) (TTx, error)
	Commit   func(ctx context.Context, tx TTx) error
	Rollback func(ctx context.Context, tx TTx) error
	// Effect inserts one effect row for key within tx.
	Effect func(ctx context.Context, tx TTx, key string) error
	// Effects counts the effect rows of key.
	Effects func(ctx context.Context, key string) (int, error)
	// Age moves the dedupe record of (consumer, eventID) d into the past.
	Age func(ctx context.Context, consumer, eventID string, d time.Duration) error
	// Records counts the dedupe records of consumer.
	Records func(ctx context.Context, consumer string) (int, error)
	// WaitBlocked returns once a transaction of this Env waits for a lock
	// another holds. Nil when the database cannot tell (the tests then
	// still run the transactions concurrently, without proof of overlap).
	WaitBlocked func(ctx context.Context) error
}

// Run runs the suite. setup returns a new Env for each subtest.
func Run[TTx any](t *testing.T, setup func(t *testing.T) Env[TTx]) {
	tests := []struct {
		name string
		fn   func(t *testing.T, e Env[TTx])
	}{
		{"SameEventTwice", sameEventTwice[TTx]},
		{"ConcurrentCopiesFirstCommits", func(t *testing.T, e Env[TTx]) { concurrentCopies(t, e, true) }},
		{"ConcurrentCopiesFirstRollsBack", func(t *testing.T, e Env[TTx]) { concurrentCopies(t, e, false) }},
		{"ConcurrentStress", concurrentStress[TTx]},
		{"TwoConsumers", twoConsumers[TTx]},
		{"HandlerErrorRollsBack", handlerError[TTx]},
		{"HandlerPanicRollsBack", handlerPanic[TTx]},
		{"HandleTxInCallersTransaction", handleTxCaller[TTx]},
		{"StaleVersionsFromHeader", staleHeader[TTx]},
		{"StaleVersionsFromPayload", staleField[TTx]},
		{"Retention", retention[TTx]},
		{"InvalidMessages", invalidMessages[TTx]},
		{"DeadLetters", deadLetters[TTx]},
		{"Metrics", metrics[TTx]},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, setup(t))
		})
	}
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newInbox[TTx any](t *testing.T, e Env[TTx], cfg inbox.Config) *inbox.Inbox[TTx] {
	t.Helper()
	cfg.Schema, cfg.Table = e.Table.Schema, e.Table.Name
	ib, err := inbox.New(e.Driver, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return ib
}

func newID() string { return uuid.Must(uuid.NewV7()).String() }

func msg(id string) inbox.Message {
	return inbox.Message{EventID: id, AggregateType: "order", AggregateID: "42", Type: "OrderPlaced", Payload: []byte(`{}`)}
}

// effect returns a handler that records one effect for key.
func effect[TTx any](e Env[TTx], key string) func(context.Context, TTx) error {
	return func(ctx context.Context, tx TTx) error { return e.Effect(ctx, tx, key) }
}

func wantEffects[TTx any](t *testing.T, e Env[TTx], key string, want int) {
	t.Helper()
	n, err := e.Effects(ctxFor(t), key)
	if err != nil {
		t.Fatal(err)
	}
	if n != want {
		t.Fatalf("effects of %s = %d, want %d", key, n, want)
	}
}

func sameEventTwice[TTx any](t *testing.T, e Env[TTx]) {
	ctx := ctxFor(t)
	ib := newInbox(t, e, inbox.Config{Consumer: "billing"})
	id := newID()
	r1, err := ib.Handle(ctx, msg(id), effect(e, id))
	if err != nil {
		t.Fatal(err)
	}
	if !r1.Applied() {
		t.Fatalf("first delivery: %+v, want applied", r1)
	}
	// The same event id in any spelling uuid.Parse accepts is the same event.
	for _, again := range []string{id, strings.ToUpper(id), "urn:uuid:" + id} {
		r2, err := ib.Handle(ctx, msg(again), effect(e, id))
		if err != nil {
			t.Fatal(err)
		}
		if !r2.Duplicate || r2.Applied() {
			t.Fatalf("redelivery as %q: %+v, want duplicate", again, r2)
		}
	}
	wantEffects(t, e, id, 1)
}

// concurrentCopies delivers one event to two consumer instances at once:
// A records it and holds its transaction open; B, on another connection,
// must wait, then see a duplicate (A commits) or apply it (A rolls back).
func concurrentCopies[TTx any](t *testing.T, e Env[TTx], commit bool) {
	ctx := ctxFor(t)
	a := newInbox(t, e, inbox.Config{Consumer: "billing"})
	b := newInbox(t, e, inbox.Config{Consumer: "billing"})
	id := newID()

	txA, err := e.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rA, err := a.HandleTx(ctx, txA, msg(id), effect(e, id))
	if err != nil || !rA.Applied() {
		t.Fatalf("instance A: %+v, %v; want applied", rA, err)
	}

	type result struct {
		r   inbox.Result
		err error
	}
	started := make(chan struct{})
	done := make(chan result, 1)
	go func() {
		close(started)
		r, err := b.Handle(ctx, msg(id), effect(e, id))
		done <- result{r, err}
	}()
	<-started
	if e.WaitBlocked != nil {
		if err := e.WaitBlocked(ctx); err != nil {
			t.Fatalf("instance B never waited for A's transaction: %v", err)
		}
	}
	select {
	case r := <-done:
		t.Fatalf("instance B finished (%+v, %v) while A's transaction was still open", r.r, r.err)
	default:
	}
	if commit {
		if err := e.Commit(ctx, txA); err != nil {
			t.Fatal(err)
		}
	} else if err := e.Rollback(ctx, txA); err != nil {
		t.Fatal(err)
	}
	var rB result
	select {
	case rB = <-done:
	case <-ctx.Done():
		t.Fatal("instance B did not finish after A's transaction ended")
	}
	if rB.err != nil {
		t.Fatalf("instance B: %v", rB.err)
	}
	if commit && !rB.r.Duplicate {
		t.Fatalf("instance B after A committed: %+v, want duplicate", rB.r)
	}
	if !commit && !rB.r.Applied() {
		t.Fatalf("instance B after A rolled back: %+v, want applied", rB.r)
	}
	wantEffects(t, e, id, 1)
}

// concurrentStress delivers every event to several instances at once.
func concurrentStress[TTx any](t *testing.T, e Env[TTx]) {
	ctx := ctxFor(t)
	const instances, events = 4, 15
	ids := make([]string, events)
	for i := range ids {
		ids[i] = newID()
	}
	var mu sync.Mutex
	applied := map[string]int{}
	var wg sync.WaitGroup
	errs := make(chan error, instances)
	gate := make(chan struct{})
	for range instances {
		ib := newInbox(t, e, inbox.Config{Consumer: "billing"})
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			for _, id := range ids {
				r, err := ib.Handle(ctx, msg(id), effect(e, id))
				if err != nil {
					errs <- err
					return
				}
				if r.Applied() {
					mu.Lock()
					applied[id]++
					mu.Unlock()
				}
			}
		}()
	}
	close(gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, id := range ids {
		if applied[id] != 1 {
			t.Errorf("event %s applied by %d instances, want 1", id, applied[id])
		}
		wantEffects(t, e, id, 1)
	}
}

func twoConsumers[TTx any](t *testing.T, e Env[TTx]) {
	ctx := ctxFor(t)
	billing := newInbox(t, e, inbox.Config{Consumer: "billing"})
	shipping := newInbox(t, e, inbox.Config{Consumer: "shipping"})
	id := newID()
	for round := range 2 {
		for _, c := range []struct {
			ib  *inbox.Inbox[TTx]
			key string
		}{{billing, "billing-" + id}, {shipping, "shipping-" + id}} {
			r, err := c.ib.Handle(ctx, msg(id), effect(e, c.key))
			if err != nil {
				t.Fatal(err)
			}
			if r.Applied() != (round == 0) {
				t.Fatalf("%s round %d: %+v", c.ib.Consumer(), round, r)
			}
		}
	}
	wantEffects(t, e, "billing-"+id, 1)
	wantEffects(t, e, "shipping-"+id, 1)
}

func handlerError[TTx any](t *testing.T, e Env[TTx]) {
	ctx := ctxFor(t)
	ib := newInbox(t, e, inbox.Config{Consumer: "billing"})
	id := newID()
	boom := errors.New("boom")
	_, err := ib.Handle(ctx, msg(id), func(ctx context.Context, tx TTx) error {
		if err := e.Effect(ctx, tx, id); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Handle = %v, want the handler's error", err)
	}
	wantEffects(t, e, id, 0)
	if n, err := e.Records(ctx, "billing"); err != nil || n != 0 {
		t.Fatalf("records after a failed handler = %d, %v; want 0", n, err)
	}
	r, err := ib.Handle(ctx, msg(id), effect(e, id))
	if err != nil || !r.Applied() {
		t.Fatalf("redelivery after a failed handler: %+v, %v; want applied", r, err)
	}
	r, err = ib.Handle(ctx, msg(id), effect(e, id))
	if err != nil || !r.Duplicate {
		t.Fatalf("third delivery: %+v, %v; want duplicate", r, err)
	}
	wantEffects(t, e, id, 1)
}

func handlerPanic[TTx any](t *testing.T, e Env[TTx]) {
	ctx := ctxFor(t)
	ib := newInbox(t, e, inbox.Config{Consumer: "billing"})
	id := newID()
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the handler's panic did not propagate")
			}
		}()
		_, _ = ib.Handle(ctx, msg(id), func(ctx context.Context, tx TTx) error {
			if err := e.Effect(ctx, tx, id); err != nil {
				return err
			}
			panic("handler bug")
		})
	}()
	wantEffects(t, e, id, 0)
	r, err := ib.Handle(ctx, msg(id), effect(e, id))
	if err != nil || !r.Applied() {
		t.Fatalf("redelivery after a panic: %+v, %v; want applied", r, err)
	}
	wantEffects(t, e, id, 1)
}

// handleTxCaller: the caller owns the transaction; a handler error makes it
// roll back, and nothing is recorded.
func handleTxCaller[TTx any](t *testing.T, e Env[TTx]) {
	ctx := ctxFor(t)
	ib := newInbox(t, e, inbox.Config{Consumer: "billing"})
	id := newID()
	boom := errors.New("boom")

	tx, err := e.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ib.HandleTx(ctx, tx, msg(id), func(ctx context.Context, tx TTx) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("HandleTx = %v, want the handler's error", err)
	}
	if err := e.Rollback(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if n, err := e.Records(ctx, "billing"); err != nil || n != 0 {
		t.Fatalf("records after rollback = %d, %v; want 0", n, err)
	}

	tx, err = e.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Two events in one transaction, the second a copy of the first.
	r1, err1 := ib.HandleTx(ctx, tx, msg(id), effect(e, id))
	r2, err2 := ib.HandleTx(ctx, tx, msg(id), effect(e, id))
	if err1 != nil || err2 != nil || !r1.Applied() || !r2.Duplicate {
		t.Fatalf("in one transaction: %+v %v, %+v %v; want applied then duplicate", r1, err1, r2, err2)
	}
	if err := e.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	wantEffects(t, e, id, 1)
}

func versioned(id, aggregate string, v int64) inbox.Message {
	m := msg(id)
	m.AggregateID = aggregate
	m.Headers = map[string]string{"version": fmt.Sprint(v)}
	return m
}

func staleHeader[TTx any](t *testing.T, e Env[TTx]) {
	ctx := ctxFor(t)
	ib := newInbox(t, e, inbox.Config{Consumer: "projection", VersionHeader: "version"})
	handle := func(m inbox.Message) inbox.Result {
		t.Helper()
		r, err := ib.Handle(ctx, m, effect(e, m.AggregateID+"-"+m.Headers["version"]))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	v2, v1, v2b, v3 := newID(), newID(), newID(), newID()
	if r := handle(versioned(v2, "7", 2)); !r.Applied() || r.Version != 2 {
		t.Fatalf("v2 first: %+v, want applied at version 2", r)
	}
	if r := handle(versioned(v1, "7", 1)); !r.Stale || r.Duplicate {
		t.Fatalf("v1 after v2: %+v, want stale", r)
	}
	if r := handle(versioned(v2b, "7", 2)); !r.Stale {
		t.Fatalf("another event with version 2: %+v, want stale", r)
	}
	// A stale event is recorded: its redelivery is a duplicate.
	if r := handle(versioned(v1, "7", 1)); !r.Duplicate {
		t.Fatalf("v1 redelivered: %+v, want duplicate", r)
	}
	if r := handle(versioned(v3, "7", 3)); !r.Applied() {
		t.Fatalf("v3: %+v, want applied", r)
	}
	// Another aggregate (and the same id under another type) has its own version.
	if r := handle(versioned(newID(), "8", 1)); !r.Applied() {
		t.Fatalf("aggregate 8 v1: %+v, want applied", r)
	}
	other := versioned(newID(), "7", 1)
	other.AggregateType = "customer"
	if r := handle(other); !r.Applied() {
		t.Fatalf("customer 7 v1: %+v, want applied", r)
	}
	wantEffects(t, e, "7-1", 1) // only customer 7's
	wantEffects(t, e, "7-2", 1)
	wantEffects(t, e, "7-3", 1)
	wantEffects(t, e, "8-1", 1)

	// Message.Version overrides the header; a failed handler leaves the
	// version where it was.
	m := versioned(newID(), "7", 100)
	m.Version, m.HasVersion = 4, true
	if _, err := ib.Handle(ctx, m, func(context.Context, TTx) error { return errors.New("boom") }); err == nil {
		t.Fatal("a failing handler returned no error")
	}
	r, err := ib.Handle(ctx, m, effect(e, "7-4"))
	if err != nil || !r.Applied() || r.Version != 4 {
		t.Fatalf("version 4 after a failed attempt: %+v, %v; want applied at 4", r, err)
	}
}

func staleField[TTx any](t *testing.T, e Env[TTx]) {
	ctx := ctxFor(t)
	ib := newInbox(t, e, inbox.Config{Consumer: "projection", VersionField: "meta.version"})
	for i, c := range []struct {
		payload string
		applied bool
	}{
		{`{"meta": {"version": 5}}`, true},
		{`{"meta": {"version": "4"}}`, false},
		{`{"meta": {"version": 5}}`, false},
		{`{"meta": {"version": 6}, "total": 1}`, true},
	} {
		m := msg(newID())
		m.Payload = []byte(c.payload)
		r, err := ib.Handle(ctx, m, effect(e, m.EventID))
		if err != nil {
			t.Fatalf("payload %d: %v", i, err)
		}
		if r.Applied() != c.applied || r.Stale == c.applied {
			t.Fatalf("payload %d %s: %+v, want applied=%v", i, c.payload, r, c.applied)
		}
	}
}

func retention[TTx any](t *testing.T, e Env[TTx]) {
	ctx := ctxFor(t)
	ib := newInbox(t, e, inbox.Config{Consumer: "billing"})
	other := newInbox(t, e, inbox.Config{Consumer: "shipping"})
	if ib.Retention() != inbox.DefaultRetention {
		t.Fatalf("default retention %v, want %v", ib.Retention(), inbox.DefaultRetention)
	}
	old1, old2, inside, fresh, othersOld := newID(), newID(), newID(), newID(), newID()
	for _, id := range []string{old1, old2, inside, fresh} {
		if _, err := ib.Handle(ctx, msg(id), effect(e, id)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := other.Handle(ctx, msg(othersOld), effect(e, othersOld)); err != nil {
		t.Fatal(err)
	}
	for id, age := range map[string]time.Duration{
		old1: 8 * 24 * time.Hour, old2: 30 * 24 * time.Hour, inside: 6 * 24 * time.Hour,
	} {
		if err := e.Age(ctx, "billing", id, age); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Age(ctx, "shipping", othersOld, 30*24*time.Hour); err != nil {
		t.Fatal(err)
	}
	// Batches of one: two old records, then nothing.
	for i, want := range []int{1, 1, 0} {
		n, err := ib.Cleanup(ctx, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Fatalf("cleanup batch %d deleted %d, want %d", i, n, want)
		}
	}
	if n, err := e.Records(ctx, "billing"); err != nil || n != 2 {
		t.Fatalf("billing records after cleanup = %d, %v; want 2 (inside the window)", n, err)
	}
	if n, err := e.Records(ctx, "shipping"); err != nil || n != 1 {
		t.Fatalf("shipping records after billing's cleanup = %d, %v; want 1", n, err)
	}
	// Inside the window a redelivery is still a duplicate; outside it, the
	// record is gone and the event would apply again (why the window must
	// outlast every redelivery).
	if r, err := ib.Handle(ctx, msg(inside), effect(e, inside)); err != nil || !r.Duplicate {
		t.Fatalf("redelivery inside the window: %+v, %v; want duplicate", r, err)
	}
	if r, err := ib.Handle(ctx, msg(old1), effect(e, old1)); err != nil || !r.Applied() {
		t.Fatalf("redelivery after cleanup: %+v, %v; want applied", r, err)
	}
	// A shorter window given to Cleanup.
	if err := e.Age(ctx, "billing", inside, 6*24*time.Hour); err != nil {
		t.Fatal(err)
	}
	if n, err := ib.Cleanup(ctx, 24*time.Hour, 100); err != nil || n != 1 {
		t.Fatalf("cleanup older than 1 day deleted %d, %v; want 1", n, err)
	}
}

func invalidMessages[TTx any](t *testing.T, e Env[TTx]) {
	ctx := ctxFor(t)
	plain := newInbox(t, e, inbox.Config{Consumer: "billing"})
	byHeader := newInbox(t, e, inbox.Config{Consumer: "billing", VersionHeader: "version"})
	byField := newInbox(t, e, inbox.Config{Consumer: "billing", VersionField: "version"})
	withHeaders := func(h map[string]string) inbox.Message { m := msg(newID()); m.Headers = h; return m }
	withPayload := func(p string) inbox.Message { m := msg(newID()); m.Payload = []byte(p); return m }
	noAggregate := withHeaders(map[string]string{"version": "1"})
	noAggregate.AggregateID = ""
	nul := msg(newID())
	nul.AggregateID = "4\x002"
	cases := []struct {
		name string
		ib   *inbox.Inbox[TTx]
		m    inbox.Message
		want string
	}{
		{"no event id", plain, msg(""), "no event id"},
		{"blank event id", plain, msg("  "), "no event id"},
		{"not a UUID", plain, msg("order-42"), "not a UUID"},
		{"NUL in aggregate id", plain, nul, "NUL"},
		{"no version header", byHeader, msg(newID()), `no version header "version"`},
		{"version not an integer", byHeader, withHeaders(map[string]string{"version": "v2"}), "not an integer"},
		{"version overflows", byHeader, withHeaders(map[string]string{"version": "99999999999999999999"}), "not an integer"},
		{"version without aggregate", byHeader, noAggregate, "no aggregate id"},
		{"payload not JSON", byField, withPayload(`not json`), "not JSON"},
		{"no version field", byField, withPayload(`{"v": 1}`), `no version field "version"`},
		{"version field a float", byField, withPayload(`{"version": 1.5}`), "not an integer"},
		{"version field an object", byField, withPayload(`{"version": {}}`), "not an integer"},
	}
	for _, c := range cases {
		ran := false
		fn := func(context.Context, TTx) error { ran = true; return nil }
		_, err := c.ib.Handle(ctx, c.m, fn)
		if !errors.Is(err, inbox.ErrInvalidMessage) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Handle = %v, want ErrInvalidMessage mentioning %q", c.name, err, c.want)
		}
		if ran {
			t.Errorf("%s: the handler ran", c.name)
		}
		// HandleTx refuses before any SQL: the caller's transaction stays usable.
		tx, err := e.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.ib.HandleTx(ctx, tx, c.m, fn); !errors.Is(err, inbox.ErrInvalidMessage) {
			t.Errorf("%s: HandleTx = %v, want ErrInvalidMessage", c.name, err)
		}
		if err := e.Effect(ctx, tx, "after-invalid"); err != nil {
			t.Errorf("%s: the transaction is unusable after a refused message: %v", c.name, err)
		}
		if err := e.Rollback(ctx, tx); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := e.Records(ctx, "billing"); err != nil || n != 0 {
		t.Fatalf("records after invalid messages = %d, %v; want 0", n, err)
	}
}

func deadLetters[TTx any](t *testing.T, e Env[TTx]) {
	ctx := ctxFor(t)
	ib := newInbox(t, e, inbox.Config{Consumer: "billing"})
	other := newInbox(t, e, inbox.Config{Consumer: "shipping"})

	bad := inbox.NewMessage("outbox.event.order", []byte("42"), map[string]string{"id": "not-a-uuid", "x": "a\x00b"}, []byte{0xff, 0x00, 'x'})
	_, herr := ib.Handle(ctx, bad, func(context.Context, TTx) error { return nil })
	if !errors.Is(herr, inbox.ErrInvalidMessage) {
		t.Fatalf("Handle = %v, want ErrInvalidMessage", herr)
	}
	if err := ib.DeadLetter(ctx, bad, herr); err != nil {
		t.Fatal(err)
	}
	poison := msg(newID())
	poison.Type = "Bad\xffType"
	if err := ib.DeadLetter(ctx, poison, errors.New("cannot decode: unexpected field")); err != nil {
		t.Fatal(err)
	}
	if err := other.DeadLetter(ctx, msg(newID()), errors.New("not billing's")); err != nil {
		t.Fatal(err)
	}
	if err := ib.DeadLetter(ctx, msg(newID()), nil); err == nil {
		t.Fatal("a dead letter without a cause was accepted")
	}

	dls, err := ib.DeadLetters(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 2 {
		t.Fatalf("billing has %d dead letters, want 2: %+v", len(dls), dls)
	}
	d0, d1 := dls[0], dls[1]
	if d0.Consumer != "billing" || d0.EventID != "not-a-uuid" || d0.AggregateType != "order" || d0.AggregateID != "42" ||
		d0.Destination != "outbox.event.order" || string(d0.Payload) != "\xff\x00x" || d0.Headers["x"] != "a\uFFFDb" ||
		!strings.Contains(d0.Error, "not a UUID") {
		t.Fatalf("first dead letter = %+v", d0)
	}
	if d0.DeadLetteredAt.IsZero() || time.Since(d0.DeadLetteredAt) > time.Hour || time.Since(d0.DeadLetteredAt) < -time.Hour {
		t.Fatalf("dead-lettered at %v, want about now", d0.DeadLetteredAt)
	}
	if d1.EventID != poison.EventID || d1.Type != "Bad\uFFFDType" || d1.Error != "cannot decode: unexpected field" || d1.ID <= d0.ID {
		t.Fatalf("second dead letter = %+v", d1)
	}
	if dls, err := ib.DeadLetters(ctx, 1); err != nil || len(dls) != 1 || dls[0].ID != d0.ID {
		t.Fatalf("DeadLetters(1) = %+v, %v; want the oldest", dls, err)
	}
}

// recorder counts Metrics observations.
type recorder struct {
	mu  sync.Mutex
	got map[inbox.Outcome]int
}

func (r *recorder) Handled(consumer string, o inbox.Outcome, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if consumer == "billing" && d >= 0 {
		r.got[o]++
	}
}

func metrics[TTx any](t *testing.T, e Env[TTx]) {
	ctx := ctxFor(t)
	rec := &recorder{got: map[inbox.Outcome]int{}}
	ib := newInbox(t, e, inbox.Config{Consumer: "billing", VersionHeader: "version", Metrics: rec})
	a, b := newID(), newID()
	steps := []struct {
		m  inbox.Message
		fn func(context.Context, TTx) error
	}{
		{versioned(a, "1", 2), effect(e, a)},                                                      // processed
		{versioned(a, "1", 2), effect(e, a)},                                                      // duplicate
		{versioned(b, "1", 1), effect(e, b)},                                                      // stale
		{versioned(newID(), "1", 3), func(context.Context, TTx) error { return errors.New("x") }}, // failed
		{msg("nope"), effect(e, "nope")},                                                          // invalid
	}
	for _, s := range steps {
		_, _ = ib.Handle(ctx, s.m, s.fn)
	}
	want := map[inbox.Outcome]int{inbox.Processed: 1, inbox.Duplicate: 1, inbox.Stale: 1, inbox.Failed: 1, inbox.Invalid: 1}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, o := range inbox.Outcomes() {
		if rec.got[o] != want[o] {
			t.Errorf("%s observed %d times, want %d (all: %v)", o, rec.got[o], want[o], rec.got)
		}
	}
}
