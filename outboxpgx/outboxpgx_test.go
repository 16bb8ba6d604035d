package outboxpgx_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

// setup returns a pool and a migrated table in a fresh schema, with the
// notify trigger (a new table's default has none since schema version
// 26): the tests that use it wake relays with plain SQL inserts.
func setup(t *testing.T) (*pgxpool.Pool, outboxdriver.Table) {
	t.Helper()
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	if _, err := outboxpgx.New(pool).Migrate(context.Background(), tb, &outboxdriver.MigrateOptions{Wakeups: outboxdriver.WakeupsTrigger}); err != nil {
		t.Fatal(err)
	}
	return pool, tb
}

func newOutbox(t *testing.T, tb outboxdriver.Table) *outbox.Outbox[pgx.Tx] {
	t.Helper()
	ob, err := outbox.New(outboxpgx.New(nil), &outbox.Config{Schema: tb.Schema, Table: tb.Name})
	if err != nil {
		t.Fatal(err)
	}
	return ob
}

func write(t *testing.T, pool *pgxpool.Pool, ob *outbox.Outbox[pgx.Tx], commit bool, events ...outbox.Event) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.WriteTx(ctx, tx, events...); err != nil {
		tx.Rollback(ctx)
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

func count(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func ev(agg string, i int) outbox.Event {
	return outbox.Event{AggregateType: "order", AggregateID: agg, Type: "OrderPlaced", Payload: fmt.Appendf(nil, `{"n":%d}`, i)}
}

func TestHostileNamesAreRefused(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	for _, tb := range []outboxdriver.Table{
		{Schema: "public", Name: `outbox"; DROP TABLE x; --`},
		{Schema: `x" CASCADE; --`, Name: "outbox"},
		{Schema: "public", Name: "out box"},
	} {
		_, err := outboxpgx.New(pool).Migrate(context.Background(), tb, nil)
		if err == nil || !strings.Contains(err.Error(), "not a valid identifier") {
			t.Errorf("Migrate(%q.%q) = %v; want a clear refusal", tb.Schema, tb.Name, err)
		}
		if _, err := outbox.New(outboxpgx.New(pool), &outbox.Config{Schema: tb.Schema, Table: tb.Name}); err == nil {
			t.Errorf("outbox.New accepted %q.%q", tb.Schema, tb.Name)
		}
		if _, err := outboxpgx.New(pool).NewSource(tb, nil); err == nil {
			t.Errorf("NewSource accepted %q.%q", tb.Schema, tb.Name)
		}
	}
}

func TestWriteTxStoresEverything(t *testing.T) {
	t.Parallel()
	pool, tb := setup(t)
	ob := newOutbox(t, tb)
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled,
	})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	given := "0190a5a4-1111-7000-8000-000000000001"
	err = ob.WriteTx(ctx, tx,
		outbox.Event{ID: given, AggregateType: "order", AggregateID: "42", Type: "OrderPlaced", Payload: []byte(`{"total": 9.5}`), Headers: map[string]string{"tenant": "acme"}},
		outbox.Event{AggregateType: "blob", AggregateID: "7", Type: "Raw", RawPayload: []byte{0, 1, 2, 0xff}},
	)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	rows, _ := pool.Query(ctx, `SELECT id::text, payload::text, payload_raw, headers->>'tenant', tracingspancontext FROM `+tb.Qualified("")+` ORDER BY seq`)
	type row struct {
		ID      string
		Payload *string
		Raw     []byte
		Tenant  *string
		Trace   *string
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("%d rows", len(got))
	}
	if got[0].ID != given || got[0].Payload == nil || *got[0].Payload != `{"total": 9.5}` || *got[0].Tenant != "acme" {
		t.Fatalf("first row = %+v", got[0])
	}
	wantTrace := "traceparent=00-01020300000000000000000000000000-0405060000000000-01"
	if got[0].Trace == nil || *got[0].Trace != wantTrace {
		t.Fatalf("trace context = %v, want %q", got[0].Trace, wantTrace)
	}
	if got[1].Payload != nil || string(got[1].Raw) != "\x00\x01\x02\xff" {
		t.Fatalf("raw row = %+v", got[1])
	}
	// Generated ids are UUIDv7: version nibble 7.
	if got[1].ID[14] != '7' {
		t.Fatalf("generated id %s is not a UUIDv7", got[1].ID)
	}
}

func TestInvalidEventsAreRefusedBeforeSQL(t *testing.T) {
	t.Parallel()
	pool, tb := setup(t)
	ob := newOutbox(t, tb)
	ctx := context.Background()
	bad := []outbox.Event{
		{AggregateID: "1", Type: "T", Payload: []byte(`{}`)},
		{AggregateType: "a", Type: "T"},
		{AggregateType: "a", AggregateID: "1"},
		{AggregateType: "a", AggregateID: "1", Type: "T", Payload: []byte(`{not json`)},
		{AggregateType: "a", AggregateID: "1", Type: "T", Payload: []byte(`{}`), RawPayload: []byte("x")},
		{AggregateType: "a", AggregateID: "1", Type: "T", ID: "not-a-uuid"},
		{AggregateType: "a", AggregateID: "1", Type: "T", Headers: map[string]string{"": "v"}},
		{AggregateType: "a", AggregateID: "1", Type: "T", Headers: map[string]string{strings.Repeat("h", 256): "v"}},
		{AggregateType: " ", AggregateID: "1", Type: "T"},
		{AggregateType: "a", AggregateID: "1\x00", Type: "T"},
		{AggregateType: "a", AggregateID: "1", Type: "T", Payload: []byte(`"\u0000"`)},
	}
	for i, e := range bad {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		err = ob.WriteTx(ctx, tx, ev("ok", 1), e)
		if !errors.Is(err, outbox.ErrInvalidEvent) {
			t.Errorf("case %d: err = %v, want ErrInvalidEvent", i, err)
		}
		// No SQL ran: the transaction is still healthy and commits nothing.
		if err := tx.Commit(ctx); err != nil {
			t.Errorf("case %d: transaction broken after refusal: %v", i, err)
		}
	}
	if n := count(t, pool, tb.Qualified("")); n != 0 {
		t.Fatalf("%d rows written by refused calls", n)
	}
	// Given ids are normalised; an empty call writes nothing.
	write(t, pool, ob, true)
	write(t, pool, ob, true, outbox.Event{ID: "0190A5A4-1111-7000-8000-00000000000A", AggregateType: "a", AggregateID: "1", Type: "T"})
	var id string
	pool.QueryRow(ctx, `SELECT id::text FROM `+tb.Qualified("")).Scan(&id)
	if id != "0190a5a4-1111-7000-8000-00000000000a" {
		t.Fatalf("stored id %q", id)
	}
}

func newSource(t *testing.T, pool *pgxpool.Pool, tb outboxdriver.Table, r outboxdriver.Retention) outboxdriver.Source {
	t.Helper()
	return newSourceWith(t, pool, tb, &outboxdriver.SourceConfig{Retention: r})
}

// newSourceWith is newSource with a configuration of the test's own.
func newSourceWith(t *testing.T, pool *pgxpool.Pool, tb outboxdriver.Table, cfg *outboxdriver.SourceConfig) outboxdriver.Source {
	t.Helper()
	s, err := outboxpgx.New(pool).NewSource(tb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestWaitIsWokenByInsertWhileIdle(t *testing.T) {
	t.Parallel()
	pool, tb := setup(t)
	ob := newOutbox(t, tb)
	src := newSource(t, pool, tb, outboxdriver.RetentionDelete)
	ctx := context.Background()
	// The first Wait connects the listener and returns at once.
	if err := src.Wait(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := src.SetIdle(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	woke := waitInBackground(src)
	write(t, pool, ob, true, ev("1", 1))
	expectWoken(t, woke, "a committed insert while idle")
}

// listen returns a pooled connection that LISTENs on tb's channel until
// the test ends.
func listen(t *testing.T, pool *pgxpool.Pool, tb outboxdriver.Table) *pgxpool.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `LISTEN `+outboxdriver.QuoteIdent(tb.Channel())); err != nil {
		conn.Release()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Exec(context.Background(), `UNLISTEN *`)
		conn.Release()
	})
	return conn
}

// waitInBackground starts src.Wait and returns where its result goes.
func waitInBackground(src outboxdriver.Source) <-chan error {
	woke := make(chan error, 1)
	go func() { woke <- src.Wait(context.Background(), time.Minute) }()
	return woke
}

// expectWoken fails the test unless the Wait behind woke returns nil
// within 20s.
func expectWoken(t *testing.T, woke <-chan error, after string) {
	t.Helper()
	select {
	case err := <-woke:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("no wake-up within 20s of %s", after)
	}
}

// Notifications that queued up while the relay was busy end one Wait, not
// one Wait each: the claim that follows sees every commit that sent them.
// The listener keeps working afterwards.
func TestWaitAnswersQueuedNotificationsAtOnce(t *testing.T) {
	t.Parallel()
	pool, tb := setup(t)
	ob := newOutbox(t, tb)
	src := newSource(t, pool, tb, outboxdriver.RetentionDelete)
	ctx := context.Background()
	if err := src.Wait(ctx, time.Minute); err != nil { // connects the listener
		t.Fatal(err)
	}
	if err := src.SetIdle(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	leases := leaseAll(t, src)
	// A second listener sees when the five notifications have been sent.
	conn := listen(t, pool, tb)
	for i := range 5 {
		write(t, pool, ob, true, ev("q", i+1))
	}
	for i := range 5 {
		nextNotification(t, conn, fmt.Sprintf("notification %d of 5", i+1))
	}
	// The relay is busy meanwhile: a claim on its listener, which
	// PostgreSQL answers behind the five notifications. The listener's
	// connection holds them all once the claim returns.
	b, err := src.Claim(ctx, leases, 100)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(b.Records()); n != 5 {
		t.Fatalf("claimed %d events, want the 5 committed", n)
	}
	b.Release(ctx)
	if err := src.Wait(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	const d = 500 * time.Millisecond
	start := time.Now()
	if err := src.Wait(ctx, d); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < d*8/10 {
		t.Fatalf("the second Wait returned after %s, before its %s: a notification of the same five commits woke it again", el, d)
	}
	woke := waitInBackground(src)
	write(t, pool, ob, true, ev("q", 6))
	expectWoken(t, woke, "a commit after the queued notifications were answered")
}

// leaseAll registers src for a minute and leases every partition.
func leaseAll(t *testing.T, src outboxdriver.Source) []outboxdriver.Lease {
	t.Helper()
	ctx := context.Background()
	_, n, err := src.Heartbeat(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	leases, err := src.Acquire(ctx, n, time.Minute)
	if err != nil || len(leases) != n {
		t.Fatalf("acquire: %d of %d partitions, %v", len(leases), n, err)
	}
	return leases
}

// nextNotification returns the next notification conn receives, and
// fails the test when none arrives within 10s.
func nextNotification(t *testing.T, conn *pgxpool.Conn, what string) *pgconn.Notification {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := conn.Conn().WaitForNotification(ctx)
	if err != nil {
		t.Fatalf("%s did not arrive within 10s: %v", what, err)
	}
	return n
}

// expectMarker sends a notification with payload marker on tb's channel
// and fails the test unless it is the next one conn receives. A listener
// receives the notifications of committed transactions in commit order,
// so one that a commit before the marker sent would arrive first.
func expectMarker(t *testing.T, pool *pgxpool.Pool, conn *pgxpool.Conn, tb outboxdriver.Table, marker, after string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `SELECT pg_notify($1, $2)`, tb.Channel(), marker); err != nil {
		t.Fatal(err)
	}
	if n := nextNotification(t, conn, "the marker "+marker); n.Payload != marker {
		t.Fatalf("a notification (payload %q) arrived before the marker %q: %s notified", n.Payload, marker, after)
	}
}

func TestNoNotifyWhileBusy(t *testing.T) {
	t.Parallel()
	pool, tb := setup(t)
	ob := newOutbox(t, tb)
	ctx := context.Background()
	conn := listen(t, pool, tb)
	// No relay registered idle: a commit sends no notification.
	write(t, pool, ob, true, ev("1", 1))
	expectMarker(t, pool, conn, tb, "after-busy", "the commit made while no relay was idle")
	// Registered idle, a commit notifies (without a payload).
	src := newSource(t, pool, tb, outboxdriver.RetentionDelete)
	if err := src.SetIdle(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	write(t, pool, ob, true, ev("2", 1))
	if n := nextNotification(t, conn, "the notification of a commit while a relay was idle"); n.Payload != "" {
		t.Fatalf("the commit's notification has payload %q, want none", n.Payload)
	}
	// An expired registration (a relay that died idle) draws no more.
	if err := src.SetIdle(ctx, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// Expired by the database clock: a transaction that starts later sees
	// no registration still running. The writers' check keeps the expiry
	// in whole milliseconds, rounded up, so it may count a registration
	// live for up to a millisecond past its expires_at.
	await.Eventually(t, 10*time.Second, func() error {
		var live bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+tb.Qualified("_wakeup")+` WHERE expires_at + interval '1 millisecond' > now())`).Scan(&live); err != nil {
			t.Fatal(err)
		}
		if live {
			return errors.New("the idle registration of 1ms still runs")
		}
		return nil
	})
	write(t, pool, ob, true, ev("3", 1))
	expectMarker(t, pool, conn, tb, "after-expiry", "the commit made after the idle registration expired")
}

// A row's partition is its aggregate id's hash over the table's
// partitions, computed by the claim (schema version 18 no longer stores it):
// every event of an aggregate is claimed in one partition, the one of the
// hash the earlier versions stored, and a claim under the other leases
// does not see it.
func TestClaimDerivesEachRowsPartition(t *testing.T) {
	t.Parallel()
	pool, tb := setup(t)
	ctx := context.Background()
	aggs := []string{"1", "1", "2", "order-42", "", "order-42"}
	for _, agg := range aggs {
		if _, err := pool.Exec(ctx, `INSERT INTO `+tb.Qualified("")+` (id, aggregatetype, aggregateid, type) VALUES (gen_random_uuid(), 'o', $1, 'T')`, agg); err != nil {
			t.Fatal(err)
		}
	}
	src := newSource(t, pool, tb, outboxdriver.RetentionDelete)
	leases := leaseAll(t, src)
	b, err := src.Claim(ctx, leases, 100)
	if err != nil {
		t.Fatal(err)
	}
	recs := b.Records()
	b.Release(ctx)
	parts := map[string]int{}
	for _, r := range recs {
		var want int
		if err := pool.QueryRow(ctx, `SELECT ((hashtextextended($1::text, 0) & 9223372036854775807) % $2)::integer`, r.AggregateID, outboxdriver.DefaultPartitions).Scan(&want); err != nil {
			t.Fatal(err)
		}
		if r.Partition != want {
			t.Fatalf("aggregate %q claimed in partition %d, want %d (its hash)", r.AggregateID, r.Partition, want)
		}
		parts[r.AggregateID] = r.Partition
	}
	if len(recs) != len(aggs) || len(parts) != 4 {
		t.Fatalf("claimed %d events of %d aggregates, want %d of 4", len(recs), len(parts), len(aggs))
	}
	// Under every lease but order-42's, none of its events is claimed.
	var others []outboxdriver.Lease
	for _, l := range leases {
		if l.Partition != parts["order-42"] {
			others = append(others, l)
		}
	}
	b, err = src.Claim(ctx, others, 100)
	if err != nil {
		t.Fatal(err)
	}
	recs = b.Records()
	b.Release(ctx)
	for _, r := range recs {
		if r.AggregateID == "order-42" {
			t.Fatalf("an event of order-42 (partition %d) claimed without its lease, as partition %d", parts["order-42"], r.Partition)
		}
	}
	if n := len(recs); n != len(aggs)-2 {
		t.Fatalf("claimed %d events under the other leases, want %d", n, len(aggs)-2)
	}
}

func TestQueueRidesTheBusinessBatch(t *testing.T) {
	t.Parallel()
	pool, tb := setup(t)
	drv := outboxpgx.New(pool)
	ob, err := outbox.New(drv, &outbox.Config{Schema: tb.Schema, Table: tb.Name})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+tb.Qualified("_orders")+` (id int PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	send := func(commit bool, orderID int, events ...outbox.Event) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		var b pgx.Batch
		b.Queue(`INSERT INTO `+tb.Qualified("_orders")+` (id) VALUES ($1)`, orderID)
		if err := ob.Queue(ctx, &b, events...); err != nil {
			t.Fatal(err)
		}
		if b.Len() != 2 {
			t.Fatalf("batch holds %d statements, want the business one and one INSERT for all events", b.Len())
		}
		if err := tx.SendBatch(ctx, &b).Close(); err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	send(false, 1, ev("1", 1))
	send(true, 2, ev("2", 1), ev("2", 2))
	send(true, 3, ev("3", 1))
	if n := count(t, pool, tb.Qualified("")); n != 3 {
		t.Fatalf("%d events, want the 3 of committed transactions", n)
	}
	var b pgx.Batch
	if err := ob.Queue(ctx, &b, outbox.Event{AggregateType: "x"}); !errors.Is(err, outbox.ErrInvalidEvent) || b.Len() != 0 {
		t.Fatalf("invalid event: err %v, %d statements queued", err, b.Len())
	}
}

// A JSON payload is stored as written, byte for byte, whether it goes in
// alone (VALUES) or with others (unnest), so that a consumer may verify a
// signature over its bytes.
func TestJSONPayloadIsKeptByteForByte(t *testing.T) {
	t.Parallel()
	pool, tb := setup(t)
	ob := newOutbox(t, tb)
	payload := []byte(`{ "total": 9.50, "items": [{"sku": "a-1", "qty": 2}],  "note": "ünïcødé", "a": 1e2}`)
	write(t, pool, ob, true, outbox.Event{AggregateType: "order", AggregateID: "1", Type: "T", Payload: payload})
	write(t, pool, ob, true,
		outbox.Event{AggregateType: "order", AggregateID: "2", Type: "T", Payload: payload},
		outbox.Event{AggregateType: "order", AggregateID: "3", Type: "T", Payload: payload})
	rows, err := pool.Query(context.Background(), `SELECT payload::text FROM `+tb.Qualified("")+` ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("%d rows, want 3", len(got))
	}
	for i, g := range got {
		if g != string(payload) {
			t.Fatalf("row %d payload %q, want %q byte for byte", i, g, payload)
		}
	}
}
