// Package outboxdrivertest is the conformance suite every outbox driver
// passes: the PostgreSQL drivers (pgx, database/sql, log tailing),
// MySQL/MariaDB and SQLite run the same tests against their real
// database. A driver's test calls Run with a Harness. It is experimental,
// as the seam it checks (package outboxdriver) is; it stands beside the
// seam as a package of its own so that a driver written outside this
// module can run the same suite.
//
// The suite works only through outboxdriver.Store, Source and Batch, the
// harness's Write and ExecInsert, and the relay engine, so what it checks
// is what the relay and the command line rely on, whatever the database.
// It needs nothing but that database: in the end-to-end cases the relays
// publish to an in-memory sink that records every message it
// acknowledges, and the suite checks what it recorded (no loss, no event
// of a rolled-back transaction, each aggregate in commit order,
// duplicates only by id).
package outboxdrivertest

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Harness adapts one driver and its database to the suite.
type Harness struct {
	// Name names the driver in failures ("pgx", "mysql", ...).
	Name string
	// Store is the driver's Store on the database under test.
	Store outboxdriver.Store
	// NewTable returns a table name no other test uses. The suite
	// migrates it and reverts it (MigrateDown to 0) at the test's end; the
	// harness drops whatever else it created for it (a schema) itself.
	NewTable func(t testing.TB) outboxdriver.Table
	// Write inserts events into t through the driver's Writer inside one
	// transaction of the driver's own kind, then commits it, or rolls it
	// back when commit is false. ctx must reach the Writer (WriteTx): it
	// carries the trace context the suite expects to find in the records.
	Write func(ctx context.Context, t outboxdriver.Table, commit bool, events ...outbox.Event) error
	// ExecInsert inserts one event into t with plain SQL in its own
	// transaction, as a program that does not use this module would:
	// only the columns of the table contract (id, aggregatetype,
	// aggregateid, type, payload), so the database fills in the rest.
	ExecInsert func(ctx context.Context, t outboxdriver.Table, id, aggregateType, aggregateID, typ, payloadJSON string) error
	// ExecDelay sets column (next_attempt_at or deliver_at) of the row of
	// event id in t to the database's clock plus d, with plain SQL in its
	// own transaction, as a hand-made repair or a plain-SQL writer would.
	ExecDelay func(ctx context.Context, t outboxdriver.Table, id, column string, d time.Duration) error
	// DeliverAtVersion is the schema version that added the deliver_at
	// column: the suite checks that a Source claims a table migrated only
	// to the version before it, and honours the column once it is added.
	DeliverAtVersion int
	// SingleRelay is set by a driver that serves one relay process per
	// table at a time (SQLite): the suite then leaves out the cases with
	// several relays competing for partitions, and says so in the log.
	SingleRelay bool
	// NormalizesJSON is set for a database whose JSON column re-encodes
	// the payload (MySQL 8's binary JSON): the suite then compares JSON
	// payloads as JSON, not byte for byte.
	NormalizesJSON bool
	// Parallel runs the suite's cases in parallel with each other (each on
	// its own table). Leave it unset for a database that serialises
	// writers (SQLite); the cases then run one after another.
	Parallel bool
}

// partitions is the number of partitions the suite migrates its tables
// with, unless a case needs every aggregate in one partition.
const partitions = 8

// testCase is one named subtest of the suite.
type testCase struct {
	name string
	run  func(s *suite, t *testing.T)
	// multiRelay marks a case that needs several relays competing for
	// partitions; it is left out for a SingleRelay driver.
	multiRelay bool
	why        string // what the case checks, logged when it is left out
}

// cases lists the suite.
var cases = []testCase{
	{name: "Migrate", run: (*suite).testMigrate},
	{name: "HostileTableNames", run: (*suite).testHostileNames},
	{name: "NotMigrated", run: (*suite).testNotMigrated},
	{name: "Atomicity", run: (*suite).testAtomicity},
	{name: "PlainSQLInsert", run: (*suite).testPlainSQLInsert},
	{name: "Insert", run: (*suite).testInsert},
	{name: "RecordFields", run: (*suite).testRecordFields},
	{name: "ClaimOrderLimitPartitions", run: (*suite).testClaimOrderLimitPartitions},
	{name: "ClaimExcludesBusyPartitions", run: (*suite).testClaimExcludesBusyPartitions},
	{name: "FinishOutcomes", run: (*suite).testFinishOutcomes},
	{name: "RetryAttempts", run: (*suite).testRetryAttempts},
	{name: "FailureHoldsItsAggregateOnly", run: (*suite).testFailureHoldsItsAggregateOnly},
	{name: "DeadLetters", run: (*suite).testDeadLetters},
	{name: "DuplicateID", run: (*suite).testDuplicateID},
	{name: "LeaseFence", run: (*suite).testLeaseFence},
	{name: "LeasesBetweenRelays", run: (*suite).testLeasesBetweenRelays, multiRelay: true,
		why: "two Sources competing for partitions: exclusive Acquire, expiry and take-over with a higher epoch, Finish under a lease taken over"},
	{name: "DelayedClaimKeepsOrder", run: (*suite).testDelayedClaimKeepsOrder},
	{name: "DelayedRelay", run: (*suite).testDelayedRelay},
	{name: "ClaimBeforeDeliverAt", run: (*suite).testClaimBeforeDeliverAt},
	{name: "RelayVersions", run: (*suite).testRelayVersions},
	{name: "Cleanup", run: (*suite).testCleanup},
	{name: "Status", run: (*suite).testStatus},
	{name: "BacklogBy", run: (*suite).testBacklogBy},
	{name: "Wait", run: (*suite).testWait},
	{name: "RelayEndToEnd", run: (*suite).testRelayEndToEnd},
	{name: "PauseResume", run: (*suite).testPauseResume},
	{name: "Masking", run: (*suite).testMasking},
	{name: "TwoRelaysEndToEnd", run: (*suite).testTwoRelaysEndToEnd, multiRelay: true,
		why: "two relays at once on one table while writers commit, one stopped mid-stream"},
}

// suite is one run of the suite against a harness.
type suite struct {
	h Harness
}

// Run runs the whole suite against h, each case as a subtest.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.Store == nil || h.NewTable == nil || h.Write == nil || h.ExecInsert == nil || h.ExecDelay == nil || h.DeliverAtVersion < 2 {
		t.Fatalf("outboxdrivertest: harness %q needs Store, NewTable, Write, ExecInsert, ExecDelay and DeliverAtVersion", h.Name)
	}
	s := &suite{h: h}
	for _, c := range cases {
		if c.multiRelay && h.SingleRelay {
			t.Logf("outboxdrivertest: %s serves one relay per table: case %s left out (%s)", h.Name, c.name, c.why)
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			if h.Parallel {
				t.Parallel()
			}
			c.run(s, t)
		})
	}
}

// env is one case's migrated table.
type env struct {
	t     *testing.T
	s     *suite
	table outboxdriver.Table
	ctx   context.Context
}

// testContext returns a context that ends after two minutes or when the
// test ends: no case may hang the whole run.
func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// newEnv returns a fresh table migrated with n partitions, reverted when
// the test ends.
func (s *suite) newEnv(t *testing.T, n int) *env {
	t.Helper()
	tb := s.h.NewTable(t)
	ctx := testContext(t)
	if _, err := s.h.Store.Migrate(ctx, tb, &outboxdriver.MigrateOptions{Partitions: n}); err != nil {
		t.Fatalf("%s: migrate %s: %v", s.h.Name, tb, err)
	}
	s.dropAtEnd(t, tb)
	return &env{t: t, s: s, table: tb, ctx: ctx}
}

// dropAtEnd reverts tb to version 0 when the test ends. Registered after
// the table was created, it runs before the harness drops what it made,
// and after every Source and batch of the test was closed.
func (s *suite) dropAtEnd(t *testing.T, tb outboxdriver.Table) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := s.h.Store.MigrateDown(ctx, tb, 0); err != nil {
			t.Errorf("%s: migrate %s down to 0 at the end of the test: %v", s.h.Name, tb, err)
		}
	})
}

// write commits events in one transaction.
func (e *env) write(events ...outbox.Event) {
	e.t.Helper()
	if err := e.s.h.Write(e.ctx, e.table, true, events...); err != nil {
		e.t.Fatalf("%s: write and commit %d event(s): %v", e.s.h.Name, len(events), err)
	}
}

// rollback writes events in one transaction and rolls it back.
func (e *env) rollback(events ...outbox.Event) {
	e.t.Helper()
	if err := e.s.h.Write(e.ctx, e.table, false, events...); err != nil {
		e.t.Fatalf("%s: write and roll back %d event(s): %v", e.s.h.Name, len(events), err)
	}
}

// source returns a Source on the env's table, closed when the test ends.
// An empty RelayName gets a fresh one.
func (e *env) source(cfg outboxdriver.SourceConfig) outboxdriver.Source {
	e.t.Helper()
	if cfg.RelayName == "" {
		cfg.RelayName = "relay-" + uuid.NewString()[:8]
	}
	src, err := e.s.h.Store.NewSource(e.table, &cfg)
	if err != nil {
		e.t.Fatalf("%s: new source on %s: %v", e.s.h.Name, e.table, err)
	}
	e.t.Cleanup(func() {
		if err := src.Close(); err != nil {
			e.t.Errorf("%s: close source: %v", e.s.h.Name, err)
		}
	})
	return src
}

// leaseAll registers src for a minute and leases every partition.
func (e *env) leaseAll(src outboxdriver.Source) []outboxdriver.Lease {
	e.t.Helper()
	_, n, err := src.Heartbeat(e.ctx, time.Minute)
	if err != nil {
		e.t.Fatalf("%s: heartbeat: %v", e.s.h.Name, err)
	}
	leases, err := src.Acquire(e.ctx, n, time.Minute)
	if err != nil {
		e.t.Fatalf("%s: acquire %d partitions: %v", e.s.h.Name, n, err)
	}
	if len(leases) != n {
		e.t.Fatalf("%s: a lone relay leased %d of %d partitions", e.s.h.Name, len(leases), n)
	}
	return leases
}

// open claims a batch and leaves it open; it is released when the test
// ends (Release is safe after Finish).
func (e *env) open(src outboxdriver.Source, leases []outboxdriver.Lease, limit int) outboxdriver.Batch {
	e.t.Helper()
	b, err := src.Claim(e.ctx, leases, limit)
	if err != nil {
		e.t.Fatalf("%s: claim %d: %v", e.s.h.Name, limit, err)
	}
	if b == nil {
		e.t.Fatalf("%s: Claim returned a nil batch and no error", e.s.h.Name)
	}
	e.t.Cleanup(func() { b.Release(context.Background()) })
	return b
}

// claim claims up to limit records and releases them untouched.
func (e *env) claim(src outboxdriver.Source, leases []outboxdriver.Lease, limit int) []outboxdriver.Record {
	e.t.Helper()
	b := e.open(src, leases, limit)
	recs := b.Records()
	b.Release(e.ctx)
	return recs
}

// finish records out for b.
func (e *env) finish(b outboxdriver.Batch, out outboxdriver.Outcome) {
	e.t.Helper()
	if err := b.Finish(e.ctx, out); err != nil {
		e.t.Fatalf("%s: finish: %v", e.s.h.Name, err)
	}
}

// publishAll claims and publishes everything claimable, batch by batch,
// and returns what it published.
func (e *env) publishAll(src outboxdriver.Source, leases []outboxdriver.Lease) []outboxdriver.Record {
	e.t.Helper()
	var all []outboxdriver.Record
	for range 100 {
		b := e.open(src, leases, 100)
		recs := b.Records()
		if len(recs) == 0 {
			b.Release(e.ctx)
			return all
		}
		e.finish(b, outboxdriver.Outcome{Published: ids(recs)})
		all = append(all, recs...)
	}
	e.t.Fatalf("%s: still claiming after 100 batches", e.s.h.Name)
	return nil
}

// status returns the table's Status.
func (e *env) status() outboxdriver.Status {
	e.t.Helper()
	st, err := e.s.h.Store.Status(e.ctx, e.table)
	if err != nil {
		e.t.Fatalf("%s: status of %s: %v", e.s.h.Name, e.table, err)
	}
	return st
}

// body is the JSON payload of the suite's events.
type body struct {
	Agg string `json:"agg"`
	N   int    `json:"n"`
}

// ev returns event n of aggregate agg (type "order") with a fresh id.
func ev(agg string, n int) outbox.Event {
	p, _ := json.Marshal(body{Agg: agg, N: n})
	return outbox.Event{ID: newID(), AggregateType: "order", AggregateID: agg, Type: "Placed", Payload: p}
}

// newID returns a fresh UUIDv7 in canonical lower-case text.
func newID() string { return uuid.Must(uuid.NewV7()).String() }

// ids lists the ids of records.
func ids(recs []outboxdriver.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.ID
	}
	return out
}

// eventIDs lists the ids of events.
func eventIDs(events ...outbox.Event) []string {
	out := make([]string, len(events))
	for i, e := range events {
		out[i] = e.ID
	}
	return out
}

// describe names records as aggregate/n for failure messages.
func describe(recs []outboxdriver.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		var b body
		if json.Unmarshal(r.Payload, &b) == nil && b.Agg != "" {
			out[i] = fmt.Sprintf("%s/%d", b.Agg, b.N)
		} else {
			out[i] = r.AggregateID + "/" + r.ID
		}
	}
	return out
}

// has reports whether recs holds the event with id.
func has(recs []outboxdriver.Record, id string) bool {
	for _, r := range recs {
		if r.ID == id {
			return true
		}
	}
	return false
}

// jsonEqual reports whether a and b are the same JSON value (databases
// may normalise whitespace and key order).
func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// sameIDs reports whether got lists exactly want, in order.
func sameIDs(got, want []string) bool { return slices.Equal(got, want) }

// sameSet reports whether a and b hold the same elements, in any order.
func sameSet[T cmp.Ordered](a, b []T) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
