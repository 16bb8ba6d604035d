package relay_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/internal/workload"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxmysql"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxpgx/cdc"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/route"
	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/natssink"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// pgxpool's background health check and nats.go's connection
		// goroutines end when their owners are closed in t.Cleanup, which
		// goleak may observe a moment early.
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
	)
}

// env is one test's outbox table, stream and relay.
type env struct {
	pool   *pgxpool.Pool
	table  outboxdriver.Table
	ob     *outbox.Outbox[pgx.Tx]
	stream jetstream.Stream
	prefix string
	js     jetstream.JetStream
	source string // "poll", "cdc" or "binlog" (testenv.EverySource)
	url    string // of the table's database
	// Source "binlog": the table is on MySQL/MariaDB (binlog_test.go),
	// not in pool's database.
	my   *sql.DB
	myOb *outbox.Outbox[*sql.Tx]
	dsn  string // the replication connection's
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvFor(t, "poll")
}

// newEnvFor is a table whose relays read it with source: for log tailing
// it is in testenv.CDCDatabase, with its publication and slot made (as
// `outbox migrate --cdc` does) and dropped when the test ends.
func newEnvFor(t *testing.T, source string) *env {
	t.Helper()
	if source == "binlog" {
		return newBinlogEnv(t)
	}
	pool, url := testenv.Pool(t), testenv.DatabaseURL()
	if source == "cdc" {
		pool, url = testenv.CDCPool(t), testenv.CDCDatabaseURL(t)
	}
	tb := testenv.Table(t, pool)
	drv := outboxpgx.New(pool)
	migrate := func() {
		if _, err := drv.Migrate(context.Background(), tb, nil); err != nil {
			t.Fatal(err)
		}
	}
	if source == "cdc" {
		testenv.CDCTurn(t, pool, func() {
			migrate()
			src, err := cdc.NewSource(pool, tb, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			if err := src.Setup(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
		// Right after the slot is made, and before the relays, so that it
		// runs after they stopped (cleanups run last-in first-out).
		testenv.DropSlotAtEnd(t, pool, func(ctx context.Context) error {
			_, err := drv.MigrateDown(ctx, tb, 0)
			return err
		})
		// A new slot's first stream relays the rows in the table first; the
		// table is empty, so there is nothing to relay: the slot starts
		// drained, as after a first relay's run.
		if _, err := pool.Exec(context.Background(), `UPDATE `+tb.Qualified("_cdc")+` SET drained = true`); err != nil {
			t.Fatal(err)
		}
	} else {
		migrate()
	}
	ob, err := outbox.New(outboxpgx.New(pool), &outbox.Config{Schema: tb.Schema, Table: tb.Name})
	if err != nil {
		t.Fatal(err)
	}
	_, js := testenv.JetStream(t)
	st, prefix := testenv.Stream(t, js)
	return &env{pool: pool, table: tb, ob: ob, stream: st, prefix: prefix, js: js, source: source, url: url}
}

// start runs a relay over e's table into e's stream, wrapping the real
// sink with wrap when given; it is stopped when the test ends.
func (e *env) start(t *testing.T, wrap func(sink.Sink) sink.Sink, cfg relay.Config) *relay.Relay {
	t.Helper()
	if e.source == "binlog" {
		return e.startSource(t, e.binlogSource(t, e.my, e.dsn), wrap, cfg)
	}
	return e.startOn(t, e.pool, wrap, cfg)
}

// startOn is start with the relay's own pool.
func (e *env) startOn(t *testing.T, pool *pgxpool.Pool, wrap func(sink.Sink) sink.Sink, cfg relay.Config) *relay.Relay {
	t.Helper()
	var src outboxdriver.Source
	var err error
	if e.source == "cdc" {
		src, err = cdc.NewSource(pool, e.table, nil)
	} else {
		src, err = outboxpgx.New(pool).NewSource(e.table, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	return e.startSource(t, src, wrap, cfg)
}

// startSource is start with the relay's own source, closed when the test
// ends.
func (e *env) startSource(t *testing.T, src outboxdriver.Source, wrap func(sink.Sink) sink.Sink, cfg relay.Config) *relay.Relay {
	t.Helper()
	var snk sink.Sink
	snk, err := natssink.New(e.js, &natssink.Config{Stream: e.prefix, Subjects: []string{e.prefix + ".>"}})
	if err != nil {
		t.Fatal(err)
	}
	if wrap != nil {
		snk = wrap(snk)
	}
	router, err := route.New(&route.Config{Replacement: e.prefix + ".${routedByValue}"})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Router = router
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 200 * time.Millisecond
	}
	if cfg.RetryBase == 0 {
		cfg.RetryBase, cfg.RetryMax = 10*time.Millisecond, 50*time.Millisecond
	}
	r, err := relay.New(src, snk, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r.Stop(ctx)
		src.Close()
		snk.Close()
	})
	return r
}

type payload struct {
	Agg string `json:"agg"`
	N   int    `json:"n"`
}

func event(agg string, n int) outbox.Event {
	b, _ := json.Marshal(payload{agg, n})
	return outbox.Event{AggregateType: "order", AggregateID: agg, Type: "Placed", Payload: b, Headers: map[string]string{"tenant": "acme"}}
}

func (e *env) write(t *testing.T, commit bool, events ...outbox.Event) {
	t.Helper()
	ctx := context.Background()
	if e.my != nil {
		if err := testenv.WriteSQL(ctx, e.my, outboxmysql.New(e.my), e.table, commit, events...); err != nil {
			t.Fatal(err)
		}
		return
	}
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := e.ob.WriteTx(ctx, tx, events...); err != nil {
		t.Fatal(err)
	}
	if commit {
		err = tx.Commit(ctx)
	} else {
		err = tx.Rollback(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func (e *env) status(t *testing.T) outboxdriver.Status {
	t.Helper()
	var st outboxdriver.Status
	var err error
	if e.my != nil {
		st, err = outboxmysql.New(e.my).Status(context.Background(), e.table)
	} else {
		st, err = outboxpgx.New(e.pool).Status(context.Background(), e.table)
	}
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// waitBacklog polls until the table's backlog is n.
func (e *env) waitBacklog(t *testing.T, n int64, timeout time.Duration) {
	t.Helper()
	await.Eventually(t, timeout, func() error {
		if st := e.status(t); st.Backlog != n {
			return fmt.Errorf("backlog %d, want %d", st.Backlog, n)
		}
		return nil
	})
}

// waitRegistered polls until a relay is registered in the table's
// wake-up registry, for at most 10 s.
func (e *env) waitRegistered(t *testing.T, when string) {
	t.Helper()
	await.Eventually(t, 10*time.Second, func() error {
		var n int
		if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+e.table.Qualified("_wakeup")).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return fmt.Errorf("%s: the relay is not registered for wake-ups", when)
		}
		return nil
	})
}

func decode(t *testing.T, msgs []*jetstream.RawStreamMsg) []payload {
	t.Helper()
	out := make([]payload, len(msgs))
	for i, m := range msgs {
		if err := json.Unmarshal(m.Data, &out[i]); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	return out
}

func TestCommittedEventsArriveRolledBackNever(t *testing.T) {
	t.Parallel()
	testenv.ForEverySource(t, testCommittedEventsArriveRolledBackNever)
}

func testCommittedEventsArriveRolledBackNever(t *testing.T, source string) {
	e := newEnvFor(t, source)
	e.start(t, nil, relay.Config{BatchSize: 7})
	const aggs, per = 10, 20
	for n := range per {
		for a := range aggs {
			agg := fmt.Sprint("agg-", a)
			e.write(t, true, event(agg, n))
			e.write(t, false, event(agg, -1)) // rolled back: must never appear
		}
	}
	testenv.WaitStreamMsgs(t, e.stream, aggs*per, 30*time.Second)
	e.waitBacklog(t, 0, 10*time.Second)
	msgs := testenv.StreamMessages(t, e.stream)
	if len(msgs) != aggs*per {
		t.Fatalf("stream holds %d messages, want %d", len(msgs), aggs*per)
	}
	next := map[string]int{}
	for i, p := range decode(t, msgs) {
		if p.N < 0 {
			t.Fatalf("an event of a rolled-back transaction was published: %+v", p)
		}
		if p.N != next[p.Agg] {
			t.Fatalf("%s: got event %d, want %d (commit order)", p.Agg, p.N, next[p.Agg])
		}
		next[p.Agg]++
		m := msgs[i]
		if m.Subject != e.prefix+".order" {
			t.Fatalf("subject %q", m.Subject)
		}
		id := m.Header.Get("id")
		if id == "" || m.Header.Get(jetstream.MsgIDHeader) != id || m.Header.Get("tenant") != "acme" || m.Header.Get(natssink.KeyHeader) != p.Agg {
			t.Fatalf("headers %v", m.Header)
		}
	}
}

// TestLateCommitIsPublished is the high-water-mark bug: a transaction that
// inserted early and commits after later transactions were relayed must
// still be published.
func TestLateCommitIsPublished(t *testing.T) {
	t.Parallel()
	testenv.ForEverySource(t, testLateCommitIsPublished)
}

func testLateCommitIsPublished(t *testing.T, source string) {
	e := newEnvFor(t, source)
	commitLate := e.begin(t, event("late", 0)) // held across waits: rolled back even when the test fails
	e.start(t, nil, relay.Config{})
	for n := range 50 {
		e.write(t, true, event("early", n))
	}
	testenv.WaitStreamMsgs(t, e.stream, 50, 30*time.Second)
	commitLate()
	testenv.WaitStreamMsgs(t, e.stream, 51, 30*time.Second)
	got := decode(t, testenv.StreamMessages(t, e.stream))
	if last := got[len(got)-1]; last.Agg != "late" {
		t.Fatalf("last message %+v, want the late commit", last)
	}
}

func TestPlainSQLInsertIsRelayed(t *testing.T) {
	t.Parallel()
	testenv.ForEverySource(t, testPlainSQLInsertIsRelayed)
}

func testPlainSQLInsertIsRelayed(t *testing.T, source string) {
	e := newEnvFor(t, source)
	e.start(t, nil, relay.Config{})
	e.exec(t, `INSERT INTO `+e.qualified("")+` (id, aggregatetype, aggregateid, type, payload)
		VALUES ('0b0d8a5e-8a5b-4c3e-9c1d-2f3e4a5b6c7d', 'order', '42', 'OrderPlaced', '{"orderId": 42}')`)
	testenv.WaitStreamMsgs(t, e.stream, 1, 30*time.Second)
	m := testenv.StreamMessages(t, e.stream)[0]
	if m.Subject != e.prefix+".order" || string(m.Data) != `{"orderId": 42}` || m.Header.Get("id") != "0b0d8a5e-8a5b-4c3e-9c1d-2f3e4a5b6c7d" || m.Header.Get(natssink.KeyHeader) != "42" {
		t.Fatalf("got %s %s %v", m.Subject, m.Data, m.Header)
	}
}

func TestOversizedEventIsDeadLetteredOthersFlow(t *testing.T) {
	t.Parallel()
	testenv.ForEverySource(t, testOversizedEventIsDeadLetteredOthersFlow)
}

func testOversizedEventIsDeadLetteredOthersFlow(t *testing.T, source string) {
	e := newEnvFor(t, source)
	e.start(t, nil, relay.Config{})
	big := outbox.Event{AggregateType: "order", AggregateID: "big", Type: "Huge", RawPayload: make([]byte, 2<<20)}
	e.write(t, true, event("a", 0), big, event("b", 0))
	testenv.WaitStreamMsgs(t, e.stream, 2, 30*time.Second)
	e.waitBacklog(t, 0, 10*time.Second)
	st := e.status(t)
	if st.DeadLetters != 1 {
		t.Fatalf("dead letters = %d, want 1", st.DeadLetters)
	}
	var lastErr string
	var attempts int
	e.queryRow(t, `SELECT last_error, attempts FROM `+e.qualified("_dead_letter"), &lastErr, &attempts)
	if !strings.Contains(lastErr, "payload") || attempts != 1 {
		t.Fatalf("dead letter last_error=%q attempts=%d", lastErr, attempts)
	}
}

// flaky fails every publish while down is set.
type flaky struct {
	sink.Sink
	down  atomic.Bool
	calls atomic.Int64
}

func (f *flaky) Publish(ctx context.Context, msgs []sink.Message) []error {
	f.calls.Add(1)
	if f.down.Load() {
		return sink.Results(len(msgs), errors.New("broker unreachable"))
	}
	return f.Sink.Publish(ctx, msgs)
}

func TestBrokerDownBurnsNoAttempts(t *testing.T) {
	t.Parallel()
	testenv.ForEverySource(t, testBrokerDownBurnsNoAttempts)
}

func testBrokerDownBurnsNoAttempts(t *testing.T, source string) {
	e := newEnvFor(t, source)
	f := &flaky{}
	f.down.Store(true)
	var cfg relay.Config
	if source != "poll" {
		// Log tailing keeps attempts in memory (the table's column stays
		// 0): with one attempt allowed, a spent one is a dead letter.
		cfg.MaxAttempts = 1
	}
	e.start(t, func(s sink.Sink) sink.Sink { f.Sink = s; return f }, cfg)
	for n := range 20 {
		e.write(t, true, event("x", n))
	}
	await.Eventually(t, 10*time.Second, func() error {
		if n := f.calls.Load(); n < 5 {
			return fmt.Errorf("relay did not retry while the broker was down: %d publishes, want 5", n)
		}
		return nil
	})
	var maxAttempts int
	e.queryRow(t, `SELECT coalesce(max(attempts), 0) FROM `+e.qualified(""), &maxAttempts)
	if maxAttempts != 0 {
		t.Fatalf("an outage spent attempts: max attempts = %d", maxAttempts)
	}
	f.down.Store(false)
	testenv.WaitStreamMsgs(t, e.stream, 20, 30*time.Second)
	e.waitBacklog(t, 0, 10*time.Second)
	if st := e.status(t); st.DeadLetters != 0 {
		t.Fatalf("an outage dead-lettered %d events", st.DeadLetters)
	}
	for i, p := range decode(t, testenv.StreamMessages(t, e.stream)) {
		if p.N != i {
			t.Fatalf("message %d is event %d: order lost across the outage", i, p.N)
		}
	}
}

// gate blocks Publish until released, to stop the relay mid-publish.
type gate struct {
	sink.Sink
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (g *gate) Publish(ctx context.Context, msgs []sink.Message) []error {
	g.once.Do(func() { close(g.entered) })
	<-g.release
	return g.Sink.Publish(ctx, msgs)
}

func TestStopFinishesInFlightBatch(t *testing.T) {
	t.Parallel()
	testenv.ForEverySource(t, testStopFinishesInFlightBatch)
}

func testStopFinishesInFlightBatch(t *testing.T, source string) {
	e := newEnvFor(t, source)
	for n := range 30 {
		e.write(t, true, event("s", n))
	}
	g := &gate{entered: make(chan struct{}), release: make(chan struct{})}
	var claimed atomic.Int64 // the first batch's size
	onStage := func(st relay.Stage, n int) {
		if st == relay.StageClaimed {
			claimed.CompareAndSwap(0, int64(n))
		}
	}
	r := e.start(t, func(s sink.Sink) sink.Sink { g.Sink = s; return g }, relay.Config{BatchSize: 10, OnStage: onStage})
	<-g.entered
	// Polling claims 10 of the 30 at once; log tailing (WAL or binary
	// log) what the stream had decoded by then (1 to 10).
	inFlight := int(claimed.Load())
	if inFlight < 1 || inFlight > 10 || (source == "poll" && inFlight != 10) {
		t.Fatalf("the first batch holds %d events", inFlight)
	}
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		stopped <- r.Stop(ctx)
	}()
	select {
	case <-stopped:
		t.Fatal("Stop returned while a publish was in flight")
	case <-time.After(100 * time.Millisecond):
	}
	close(g.release)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	// Exactly the in-flight batch was published and recorded; nothing more
	// was claimed after Stop.
	if got := len(testenv.StreamMessages(t, e.stream)); got != inFlight {
		t.Fatalf("%d messages published, want the %d of the in-flight batch", got, inFlight)
	}
	if st := e.status(t); st.Backlog != int64(30-inFlight) {
		t.Fatalf("backlog %d after stop, want %d", st.Backlog, 30-inFlight)
	}
	if err := r.Stop(context.Background()); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

func TestLifecycle(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	src, err := outboxpgx.New(e.pool).NewSource(e.table, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	snk, _ := natssink.New(e.js, nil)
	if _, err := relay.New(nil, snk, nil); err == nil {
		t.Fatal("nil source accepted")
	}
	for _, c := range []relay.Config{{BatchSize: -1}, {PollInterval: time.Microsecond}, {RetryBase: time.Second, RetryMax: time.Millisecond}, {Linger: -time.Millisecond}, {Lanes: -1}, {Lanes: 65}} {
		if _, err := relay.New(src, snk, &c); err == nil {
			t.Fatalf("config %+v accepted", c)
		}
	}
	r, err := relay.New(src, snk, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Stop(context.Background()); err != nil {
		t.Fatalf("Stop before Start: %v", err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err == nil {
		t.Fatal("second Start accepted")
	}
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestDatabaseConnectionsKilled terminates every connection of the relay
// (pg_terminate_backend) while it works; it reconnects and loses nothing.
func TestDatabaseConnectionsKilled(t *testing.T) {
	t.Parallel()
	testenv.ForEverySource(t, testDatabaseConnectionsKilled)
}

func testDatabaseConnectionsKilled(t *testing.T, source string) {
	e := newEnvFor(t, source)
	var kill func() int
	if source == "binlog" {
		// The relay connects as an account of its own, its replication
		// connection too: KILL CONNECTION ends them all.
		user, db, dsn := e.binlogRelayAccount(t)
		e.startSource(t, e.binlogSource(t, db, dsn), nil, relay.Config{BatchSize: 10})
		kill = func() int { return e.killConnections(t, user) }
	} else {
		app := testenv.Name("relay")
		cfg, err := pgxpool.ParseConfig(e.url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.RuntimeParams["application_name"] = app
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		e.startOn(t, pool, nil, relay.Config{BatchSize: 10})
		kill = func() int {
			var n int
			err := e.pool.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	killed := 0
	for round := range 5 {
		for n := range 40 {
			e.write(t, true, event(fmt.Sprint("k", n%4), round*40+n))
		}
		killed += kill()
	}
	if killed == 0 {
		t.Fatal("no relay connection was terminated; the test proves nothing")
	}
	testenv.WaitStreamMsgs(t, e.stream, 200, 60*time.Second)
	e.waitBacklog(t, 0, 30*time.Second)
	seen := map[int]bool{}
	for _, p := range decode(t, testenv.StreamMessages(t, e.stream)) {
		seen[p.N] = true
	}
	if len(seen) != 200 {
		t.Fatalf("%d distinct events delivered, want 200", len(seen))
	}
	// After the last kill the relay is woken again by NOTIFY (its listener
	// reconnected), or by its stream, not only by polling: a new event
	// arrives promptly.
	e.write(t, true, event("after", 1000))
	testenv.WaitStreamMsgs(t, e.stream, 201, 30*time.Second)
}

// TestTwoRelaysLoseNothing runs two relays on one table while writers
// commit: every committed event is delivered, none twice into the stream.
func TestTwoRelaysLoseNothing(t *testing.T) {
	t.Parallel()
	testenv.ForEverySource(t, testTwoRelaysLoseNothing)
}

func testTwoRelaysLoseNothing(t *testing.T, source string) {
	e := newEnvFor(t, source)
	e.start(t, nil, relay.Config{BatchSize: 20})
	e.start(t, nil, relay.Config{BatchSize: 20})
	res := e.workload(t, workload.Config{Aggregates: 30, Transactions: 600, Writers: 6, RollbackPct: 10})
	testenv.WaitStreamMsgs(t, e.stream, uint64(res.Committed()), 60*time.Second)
	e.waitBacklog(t, 0, 30*time.Second)
	seen := map[string]int{}
	for _, m := range testenv.StreamMessages(t, e.stream) {
		seen[m.Header.Get("id")]++
	}
	for id := range res.IDs {
		if seen[id] != 1 {
			t.Fatalf("event %s delivered %d times, want once", id, seen[id])
		}
	}
	if len(seen) != res.Committed() {
		t.Fatalf("%d distinct ids in the stream, %d committed", len(seen), res.Committed())
	}
}

// While events come faster than single claims can take them one by one,
// the relay claims back to back and leaves the wake-up registry, so that
// the writers' commits send no NOTIFY (each would wait for every
// notifying commit before it); once the flow stops it registers again,
// and a lone commit wakes it at once (the poll interval here is far
// longer than the wait allowed for it).
func TestSteadyFlowSparesTheWritersTheNotify(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	// The notify trigger's commits count here: the relay's registrations
	// alone decide them, not a writer's view of them.
	if _, err := outboxpgx.New(e.pool).Migrate(ctx, e.table, &outboxdriver.MigrateOptions{Wakeups: outboxdriver.WakeupsTrigger}); err != nil {
		t.Fatal(err)
	}
	e.start(t, nil, relay.Config{PollInterval: 30 * time.Second})
	e.waitRegistered(t, "at start")

	lis, err := e.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Release()
	if _, err := lis.Exec(ctx, `LISTEN `+outboxdriver.QuoteIdent(e.table.Channel())); err != nil {
		t.Fatal(err)
	}
	defer lis.Exec(context.Background(), `UNLISTEN *`)

	// One writer commits five events a transaction, back to back.
	const commits, perCommit = 400, 5
	for c := range commits {
		evs := make([]outbox.Event, perCommit)
		for i := range evs {
			evs[i] = event(fmt.Sprint("a", (c*perCommit+i)%50), c*perCommit+i)
		}
		e.write(t, true, evs...)
	}
	testenv.WaitStreamMsgs(t, e.stream, commits*perCommit, 60*time.Second)
	notified := 0
	for {
		wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, err := lis.Conn().WaitForNotification(wctx)
		cancel()
		if err != nil {
			break
		}
		notified++
	}
	if notified > commits/4 {
		t.Fatalf("%d of %d commits sent a NOTIFY during a steady flow, want at most a quarter", notified, commits)
	}
	e.waitRegistered(t, "after the flow")
	e.write(t, true, event("lone", 0))
	testenv.WaitStreamMsgs(t, e.stream, commits*perCommit+1, 5*time.Second)
	t.Logf("%d of %d commits notified", notified, commits)
}

// On a table without the notify trigger (--wakeups writers), the
// library's writers wake an idle relay themselves: with a poll interval of
// 30 s, events written one at a time with WriteTx (a few milliseconds
// apart, so that the writer's view of the registry is fresh and shows the
// relay waiting; or, after a pause, too old to rule it out) arrive within
// seconds.
func TestWritersWakeTheRelayWithoutTheTrigger(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	if _, err := outboxpgx.New(e.pool).Migrate(ctx, e.table, &outboxdriver.MigrateOptions{Wakeups: outboxdriver.WakeupsWriters}); err != nil {
		t.Fatal(err)
	}
	// The writer's first write starts its first read of the view.
	e.write(t, true, event("first", 0))
	e.start(t, nil, relay.Config{PollInterval: 30 * time.Second})
	testenv.WaitStreamMsgs(t, e.stream, 1, 10*time.Second)
	e.waitRegistered(t, "after the first event")
	const n = 20
	for i := range n {
		e.write(t, true, event(fmt.Sprint("a", i), i))
		time.Sleep(5 * time.Millisecond)
	}
	testenv.WaitStreamMsgs(t, e.stream, 1+n, 10*time.Second)
	time.Sleep(2 * driverkit.WakeViewMaxAge)
	e.write(t, true, event("after-a-pause", 0))
	testenv.WaitStreamMsgs(t, e.stream, 2+n, 10*time.Second)
}
