package outboxpgx_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

// setup returns a pool and a migrated table in a fresh schema.
func setup(t *testing.T) (*pgxpool.Pool, outboxdriver.Table) {
	t.Helper()
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	if _, err := outboxpgx.Migrate(context.Background(), pool, tb, nil); err != nil {
		t.Fatal(err)
	}
	return pool, tb
}

func newOutbox(t *testing.T, tb outboxdriver.Table) *outbox.Outbox[pgx.Tx] {
	t.Helper()
	ob, err := outbox.New(outboxpgx.New(), &outbox.Config{Schema: tb.Schema, Table: tb.Name})
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

func TestMigrateIsIdempotentAndReversible(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	first, err := outboxpgx.Migrate(ctx, pool, tb, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != pgschema.Latest() {
		t.Fatalf("first run applied %v, want every version up to %d", first, pgschema.Latest())
	}
	second, err := outboxpgx.Migrate(ctx, pool, tb, nil)
	if err != nil || len(second) != 0 {
		t.Fatalf("second run applied %v, %v; want a no-op", second, err)
	}
	// Concurrent migrators serialise on an advisory lock: exactly one applies.
	other := outboxdriver.Table{Schema: tb.Schema, Name: "other"}
	var wg sync.WaitGroup
	applied := make([][]int, 4)
	errs := make([]error, 4)
	for i := range 4 {
		wg.Go(func() { applied[i], errs[i] = outboxpgx.Migrate(ctx, pool, other, nil) })
	}
	wg.Wait()
	total := 0
	for i := range 4 {
		if errs[i] != nil {
			t.Fatalf("concurrent migrate: %v", errs[i])
		}
		total += len(applied[i])
	}
	if total != pgschema.Latest() {
		t.Fatalf("concurrent migrators applied %d migrations in all, want %d", total, pgschema.Latest())
	}
	down, err := outboxpgx.MigrateDown(ctx, pool, tb, 0)
	if err != nil || len(down) != pgschema.Latest() {
		t.Fatalf("down: %v, %v", down, err)
	}
	var exists bool
	pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, tb.Qualified("")).Scan(&exists)
	if exists {
		t.Fatal("table still exists after MigrateDown to 0")
	}
	if _, err := outboxpgx.Migrate(ctx, pool, tb, nil); err != nil {
		t.Fatalf("migrate again after down: %v", err)
	}
}

func TestHostileNamesAreRefused(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	for _, tb := range []outboxdriver.Table{
		{Schema: "public", Name: `outbox"; DROP TABLE x; --`},
		{Schema: `x" CASCADE; --`, Name: "outbox"},
		{Schema: "public", Name: "out box"},
	} {
		_, err := outboxpgx.Migrate(context.Background(), pool, tb, nil)
		if err == nil || !strings.Contains(err.Error(), "not a valid identifier") {
			t.Errorf("Migrate(%q.%q) = %v; want a clear refusal", tb.Schema, tb.Name, err)
		}
		if _, err := outbox.New(outboxpgx.New(), &outbox.Config{Schema: tb.Schema, Table: tb.Name}); err == nil {
			t.Errorf("outbox.New accepted %q.%q", tb.Schema, tb.Name)
		}
		if _, err := outboxpgx.NewSource(pool, tb, nil); err == nil {
			t.Errorf("NewSource accepted %q.%q", tb.Schema, tb.Name)
		}
	}
}

func TestWriteTxCommitAndRollback(t *testing.T) {
	t.Parallel()
	pool, tb := setup(t)
	ob := newOutbox(t, tb)
	write(t, pool, ob, false, ev("1", 1), ev("1", 2))
	write(t, pool, ob, true, ev("2", 1))
	write(t, pool, ob, true, ev("3", 1), ev("3", 2), ev("3", 3))
	if n := count(t, pool, tb.Qualified("")); n != 4 {
		t.Fatalf("%d rows, want 4 (the rolled-back two must not exist)", n)
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

func newSource(t *testing.T, pool *pgxpool.Pool, tb outboxdriver.Table, r outboxpgx.Retention) *outboxpgx.Source {
	t.Helper()
	src, err := outboxpgx.NewSource(pool, tb, &outboxpgx.SourceConfig{Retention: r})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	return src
}

// leaseAll registers src and leases every partition for a minute.
func leaseAll(t *testing.T, src *outboxpgx.Source) []outboxdriver.Lease {
	t.Helper()
	ctx := context.Background()
	_, n, err := src.Heartbeat(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	leases, err := src.Acquire(ctx, n, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(leases) != n {
		t.Fatalf("leased %d of %d partitions", len(leases), n)
	}
	return leases
}

func TestPlainSQLInsertIsClaimed(t *testing.T) {
	t.Parallel()
	pool, tb := setup(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO `+tb.Qualified("")+` (id, aggregatetype, aggregateid, type, payload)
		VALUES (gen_random_uuid(), 'order', '42', 'OrderPlaced', '{"orderId": 42}')`)
	if err != nil {
		t.Fatal(err)
	}
	src := newSource(t, pool, tb, outboxpgx.RetentionDelete)
	leases := leaseAll(t, src)
	b, err := src.Claim(ctx, leases, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	recs := b.Records()
	if len(recs) != 1 || recs[0].AggregateID != "42" || string(recs[0].Payload) != `{"orderId": 42}` || recs[0].CreatedAt.IsZero() {
		t.Fatalf("claimed %+v", recs)
	}
}

func TestClaimNeverExceedsLimitAndExcludesBusyPartitions(t *testing.T) {
	t.Parallel()
	pool, tb := setup(t)
	ob := newOutbox(t, tb)
	events := make([]outbox.Event, 25)
	for i := range events {
		events[i] = ev(fmt.Sprint(i%5), i)
	}
	write(t, pool, ob, true, events...)
	src := newSource(t, pool, tb, outboxpgx.RetentionDelete)
	leases := leaseAll(t, src)
	ctx := context.Background()
	a, err := src.Claim(ctx, leases, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Records()) != 10 {
		t.Fatalf("a claim of 10 took %d rows", len(a.Records()))
	}
	var last int64
	for _, r := range a.Records() {
		if r.Seq <= last {
			t.Fatal("claim not in seq order")
		}
		last = r.Seq
	}
	// While a's transaction relays those partitions, nobody else can claim
	// from them, even with the leases: one batch per partition at a time.
	b, err := src.Claim(ctx, leases, 10)
	if err != nil {
		t.Fatal(err)
	}
	busy := map[int]bool{}
	for _, r := range a.Records() {
		busy[r.Partition] = true
	}
	for _, r := range b.Records() {
		if busy[r.Partition] {
			t.Fatalf("second claim took row %d of partition %d, which the first claim relays", r.Seq, r.Partition)
		}
	}
	b.Release(ctx)
	a.Release(ctx)
	d, err := src.Claim(ctx, leases, 100)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Release(ctx)
	if len(d.Records()) != 25 {
		t.Fatalf("after release, claim took %d rows, want 25", len(d.Records()))
	}
	// Without leases nothing is claimed.
	e, err := src.Claim(ctx, nil, 100)
	if err != nil || len(e.Records()) != 0 {
		t.Fatalf("claim without leases: %d rows, %v", len(e.Records()), err)
	}
}

func TestFinishOutcomes(t *testing.T) {
	t.Parallel()
	for _, retention := range []outboxpgx.Retention{outboxpgx.RetentionDelete, outboxpgx.RetentionKeep} {
		t.Run(fmt.Sprint("retention", retention), func(t *testing.T) {
			t.Parallel()
			pool, tb := setup(t)
			ob := newOutbox(t, tb)
			write(t, pool, ob, true, ev("a", 1), ev("b", 1), ev("c", 1), ev("d", 1))
			src := newSource(t, pool, tb, retention)
			leases := leaseAll(t, src)
			ctx := context.Background()
			b, err := src.Claim(ctx, leases, 10)
			if err != nil {
				t.Fatal(err)
			}
			r := b.Records()
			err = b.Finish(ctx, outboxdriver.Outcome{
				Published: []string{r[0].ID},
				Failed: []outboxdriver.Failure{
					{ID: r[1].ID, Err: errors.New("broker busy"), RetryAfter: time.Hour},
					{ID: r[2].ID, Err: errors.New("too large\x00"), DeadLetter: true, Hold: true},
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			st, err := outboxpgx.Status(ctx, pool, tb)
			if err != nil {
				t.Fatal(err)
			}
			wantPublished := int64(0)
			if retention == outboxpgx.RetentionKeep {
				wantPublished = 1
			}
			if st.Backlog != 2 || st.DeadLetters != 1 || st.Published != wantPublished || st.SchemaVersion != pgschema.Latest() {
				t.Fatalf("status = %+v", st)
			}
			var attempts int
			var lastErr string
			pool.QueryRow(ctx, `SELECT attempts, last_error FROM `+tb.Qualified("_dead_letter")+` WHERE id = $1`, r[2].ID).Scan(&attempts, &lastErr)
			if attempts != 1 || lastErr != "too large" {
				t.Fatalf("dead letter attempts=%d last_error=%q", attempts, lastErr)
			}
			// The delayed event is not due; the untouched one is claimed again.
			b2, err := src.Claim(ctx, leases, 10)
			if err != nil {
				t.Fatal(err)
			}
			defer b2.Release(ctx)
			if got := b2.Records(); len(got) != 1 || got[0].ID != r[3].ID {
				t.Fatalf("second claim = %+v, want only %s", got, r[3].ID)
			}
		})
	}
}

func TestWaitIsWokenByInsertWhileIdle(t *testing.T) {
	t.Parallel()
	pool, tb := setup(t)
	ob := newOutbox(t, tb)
	src := newSource(t, pool, tb, outboxpgx.RetentionDelete)
	ctx := context.Background()
	// The first Wait connects the listener and returns at once.
	if err := src.Wait(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := src.SetIdle(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	woke := make(chan error, 1)
	go func() { woke <- src.Wait(ctx, time.Minute) }()
	write(t, pool, ob, true, ev("1", 1))
	select {
	case err := <-woke:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no wake-up within 20s of a committed insert while idle")
	}
}

func TestNoNotifyWhileBusy(t *testing.T) {
	t.Parallel()
	pool, tb := setup(t)
	ob := newOutbox(t, tb)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `LISTEN `+outboxdriver.QuoteIdent(tb.Channel())); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(ctx, `UNLISTEN *`)
	// No relay registered idle: a commit sends no notification.
	write(t, pool, ob, true, ev("1", 1))
	src := newSource(t, pool, tb, outboxpgx.RetentionDelete)
	// Registered idle, a commit notifies; a marker written after it
	// proves the first commit sent nothing.
	if err := src.SetIdle(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	write(t, pool, ob, true, ev("2", 1))
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := conn.Conn().WaitForNotification(wctx); err != nil {
		t.Fatalf("no notification while idle: %v", err)
	}
	wctx2, cancel2 := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel2()
	if n, err := conn.Conn().WaitForNotification(wctx2); err == nil {
		t.Fatalf("a second notification %+v arrived: the busy commit notified", n)
	}
	// An expired registration (a relay that died idle) draws no more.
	if err := src.SetIdle(ctx, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // let the registration expire by the database clock
	write(t, pool, ob, true, ev("3", 1))
	wctx3, cancel3 := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel3()
	if n, err := conn.Conn().WaitForNotification(wctx3); err == nil {
		t.Fatalf("notification %+v after the idle registration expired", n)
	}
}

func TestStatusOfMissingTable(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	_, err := outboxpgx.Status(context.Background(), pool, tb)
	if !errors.Is(err, outboxpgx.ErrNotMigrated) {
		t.Fatalf("err = %v, want ErrNotMigrated", err)
	}
}

func TestLeasesAreExclusiveFencedAndBalanced(t *testing.T) {
	t.Parallel()
	pool, tb := setup(t)
	ob := newOutbox(t, tb)
	ctx := context.Background()
	a := newSource(t, pool, tb, outboxpgx.RetentionDelete)
	b := newSource(t, pool, tb, outboxpgx.RetentionDelete)
	if relays, parts, err := a.Heartbeat(ctx, time.Minute); err != nil || relays != 1 || parts != pgschema.DefaultPartitions {
		t.Fatalf("heartbeat = %d relays, %d partitions, %v", relays, parts, err)
	}
	if relays, _, _ := b.Heartbeat(ctx, time.Minute); relays != 2 {
		t.Fatalf("second relay sees %d live relays, want 2", relays)
	}
	aLeases, err := a.Acquire(ctx, 1000, 500*time.Millisecond)
	if err != nil || len(aLeases) != pgschema.DefaultPartitions {
		t.Fatalf("a acquired %d, %v", len(aLeases), err)
	}
	if got, err := b.Acquire(ctx, 1000, time.Minute); err != nil || len(got) != 0 {
		t.Fatalf("b acquired %d partitions a holds (%v)", len(got), err)
	}
	write(t, pool, ob, true, ev("x", 1), ev("y", 1))
	batch, err := a.Claim(ctx, aLeases, 10)
	if err != nil || len(batch.Records()) != 2 {
		t.Fatalf("a claimed %d, %v", len(batch.Records()), err)
	}
	// a stalls past its TTL; b takes every partition over with new epochs.
	deadline := time.Now().Add(10 * time.Second)
	var bLeases []outboxdriver.Lease
	for len(bLeases) < pgschema.DefaultPartitions {
		if time.Now().After(deadline) {
			t.Fatalf("b took over %d partitions after a's leases expired", len(bLeases))
		}
		got, err := b.Acquire(ctx, 1000, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		bLeases = append(bLeases, got...)
		time.Sleep(20 * time.Millisecond)
	}
	for _, l := range bLeases {
		if l.Epoch < 2 {
			t.Fatalf("partition %d changed owner without a new epoch (%d)", l.Partition, l.Epoch)
		}
	}
	// a's late outcome is refused: the fence.
	err = batch.Finish(ctx, outboxdriver.Outcome{Published: []string{batch.Records()[0].ID}})
	if !errors.Is(err, outboxdriver.ErrLeaseLost) {
		t.Fatalf("stale owner's Finish = %v, want ErrLeaseLost", err)
	}
	if st, _ := outboxpgx.Status(ctx, pool, tb); st.Backlog != 2 {
		t.Fatalf("backlog %d after a refused outcome, want 2", st.Backlog)
	}
	// a's renewal returns nothing, its claims find nothing.
	if kept, err := a.Renew(ctx, aLeases, time.Minute); err != nil || len(kept) != 0 {
		t.Fatalf("a renewed %d lost leases (%v)", len(kept), err)
	}
	stale, err := a.Claim(ctx, aLeases, 10)
	if err != nil {
		t.Fatal(err)
	}
	stale.Release(ctx)
	if len(stale.Records()) != 0 {
		t.Fatalf("a claimed %d rows with lost leases", len(stale.Records()))
	}
	// Status names the owner; release hands partitions back.
	st, err := outboxpgx.Status(ctx, pool, tb)
	if err != nil || len(st.Partitions) != pgschema.DefaultPartitions || st.Partitions[0].Owner != b.RelayName() {
		t.Fatalf("status partitions %+v, %v", st.Partitions[:1], err)
	}
	if err := b.Release(ctx, bLeases, true); err != nil {
		t.Fatal(err)
	}
	if got, _ := a.Acquire(ctx, 1000, time.Minute); len(got) != pgschema.DefaultPartitions {
		t.Fatalf("after release a acquired %d", len(got))
	}
}

func TestFailedEventHoldsItsAggregateOnly(t *testing.T) {
	t.Parallel()
	for _, hold := range []bool{true, false} {
		t.Run(fmt.Sprint("hold=", hold), func(t *testing.T) {
			t.Parallel()
			pool, tb := setup(t)
			ob := newOutbox(t, tb)
			ctx := context.Background()
			write(t, pool, ob, true, ev("a", 1), ev("a", 2), ev("b", 1))
			src := newSource(t, pool, tb, outboxpgx.RetentionDelete)
			leases := leaseAll(t, src)
			claim := func() []outboxdriver.Record {
				b, err := src.Claim(ctx, leases, 10)
				if err != nil {
					t.Fatal(err)
				}
				defer b.Release(ctx)
				return b.Records()
			}
			ids := func(rs []outboxdriver.Record) (out []string) {
				for _, r := range rs {
					out = append(out, fmt.Sprintf("%s%s", r.AggregateID, r.Payload))
				}
				return out
			}
			b, _ := src.Claim(ctx, leases, 10)
			r := b.Records()
			a1 := r[0].ID
			// a1 fails transiently (retry in 300ms); b1 was published.
			if err := b.Finish(ctx, outboxdriver.Outcome{Published: []string{r[2].ID}, Failed: []outboxdriver.Failure{{ID: a1, Err: errors.New("busy"), RetryAfter: 300 * time.Millisecond}}}); err != nil {
				t.Fatal(err)
			}
			if got := claim(); len(got) != 0 {
				t.Fatalf("claimed %v while a1 waits for its retry: a2 must wait behind it", ids(got))
			}
			write(t, pool, ob, true, ev("c", 1))
			if got := claim(); len(got) != 1 || got[0].AggregateID != "c" {
				t.Fatalf("other aggregates must flow: claimed %v", ids(got))
			}
			deadline := time.Now().Add(10 * time.Second)
			var got []outboxdriver.Record
			for len(got) == 0 || got[0].ID != a1 {
				if time.Now().After(deadline) {
					t.Fatalf("a1 not claimed again after its retry delay: %v", ids(got))
				}
				time.Sleep(20 * time.Millisecond)
				got = claim()
			}
			for _, rec := range got {
				if rec.AggregateID == "a" && rec.ID != a1 {
					t.Fatalf("a2 claimed together with the retried a1: %v", ids(got))
				}
			}
			// Now a1 is dead-lettered: with hold a2 keeps waiting; with
			// continue it flows.
			b, _ = src.Claim(ctx, leases, 10)
			var fin outboxdriver.Outcome
			for _, rec := range b.Records() {
				if rec.ID == a1 {
					fin.Failed = append(fin.Failed, outboxdriver.Failure{ID: a1, Err: errors.New("too large"), DeadLetter: true, Hold: hold})
				} else {
					fin.Published = append(fin.Published, rec.ID)
				}
			}
			if err := b.Finish(ctx, fin); err != nil {
				t.Fatal(err)
			}
			got = claim()
			if hold && len(got) != 0 {
				t.Fatalf("hold: claimed %v after a1 was dead-lettered", ids(got))
			}
			if !hold && (len(got) != 1 || got[0].AggregateID != "a") {
				t.Fatalf("continue: claimed %v, want a2", ids(got))
			}
			st, _ := outboxpgx.Status(ctx, pool, tb)
			if want := map[bool]int64{true: 1, false: 0}[hold]; st.Held != want || st.DeadLetters != 1 {
				t.Fatalf("held %d dead letters %d, want %d and 1", st.Held, st.DeadLetters, want)
			}
		})
	}
}

func TestPartitionIsComputedByTheDatabase(t *testing.T) {
	t.Parallel()
	pool, tb := setup(t)
	ctx := context.Background()
	for _, agg := range []string{"1", "1", "2", "order-42", ""} {
		if _, err := pool.Exec(ctx, `INSERT INTO `+tb.Qualified("")+` (id, aggregatetype, aggregateid, type) VALUES (gen_random_uuid(), 'o', $1, 'T')`, agg); err != nil {
			t.Fatal(err)
		}
	}
	rows, _ := pool.Query(ctx, `SELECT aggregateid, partition FROM `+tb.Qualified(""))
	parts := map[string]int{}
	for rows.Next() {
		var agg string
		var p int
		if err := rows.Scan(&agg, &p); err != nil {
			t.Fatal(err)
		}
		if p < 0 || p >= pgschema.DefaultPartitions {
			t.Fatalf("partition %d out of range", p)
		}
		if old, ok := parts[agg]; ok && old != p {
			t.Fatalf("aggregate %q in partitions %d and %d", agg, old, p)
		}
		parts[agg] = p
	}
	if len(parts) != 4 {
		t.Fatalf("rows: %v", parts)
	}
}

func TestCleanupDeletesKeptRowsInBatches(t *testing.T) {
	t.Parallel()
	pool, tb := setup(t)
	ob := newOutbox(t, tb)
	ctx := context.Background()
	for i := range 7 {
		write(t, pool, ob, true, ev(fmt.Sprint(i), i))
	}
	src := newSource(t, pool, tb, outboxpgx.RetentionKeep)
	leases := leaseAll(t, src)
	b, err := src.Claim(ctx, leases, 5)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range b.Records() {
		ids = append(ids, r.ID)
	}
	if err := b.Finish(ctx, outboxdriver.Outcome{Published: ids}); err != nil {
		t.Fatal(err)
	}
	if n, err := src.Cleanup(ctx, leases, time.Hour, 100); err != nil || n != 0 {
		t.Fatalf("cleanup of rows younger than the window deleted %d (%v)", n, err)
	}
	for _, want := range []int{3, 2, 0} {
		n, err := src.Cleanup(ctx, leases, 0, 3)
		if err != nil || n != want {
			t.Fatalf("cleanup deleted %d (%v), want %d", n, err, want)
		}
	}
	st, _ := outboxpgx.Status(ctx, pool, tb)
	if st.Published != 0 || st.Backlog != 2 {
		t.Fatalf("after cleanup: %d published kept, backlog %d; want 0 and 2 (unpublished rows stay)", st.Published, st.Backlog)
	}
}

func TestQueueRidesTheBusinessBatch(t *testing.T) {
	t.Parallel()
	pool, tb := setup(t)
	drv := outboxpgx.New()
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
		if err := drv.Queue(ctx, &b, ob, events...); err != nil {
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
	if err := drv.Queue(ctx, &b, ob, outbox.Event{AggregateType: "x"}); !errors.Is(err, outbox.ErrInvalidEvent) || b.Len() != 0 {
		t.Fatalf("invalid event: err %v, %d statements queued", err, b.Len())
	}
}
