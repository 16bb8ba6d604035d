package outboxpgx_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/route"
	"github.com/outboxkit/outbox/sink/stdoutsink"
)

// leanVersion is the migration that moves the table to the lean row.
const leanVersion = 10

// eventKeyVersion is the migration that gives id its key back.
const eventKeyVersion = 26

// published collects what a stdoutsink wrote: every event id in the
// order first published, and every copy.
type published struct {
	mu     sync.Mutex
	order  map[string][]int // aggregate -> n, in publish order
	copies map[string]int   // id -> times published
	err    error
}

func (p *published) Write(b []byte) (int, error) {
	var l struct {
		ID      string `json:"id"`
		Key     string `json:"key"`
		Payload struct {
			N int `json:"n"`
		} `json:"payload"`
	}
	err := json.Unmarshal(b, &l)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.err = fmt.Errorf("line %q: %v", b, err)
		return len(b), nil
	}
	p.copies[l.ID]++
	if p.copies[l.ID] == 1 {
		p.order[l.Key] = append(p.order[l.Key], l.Payload.N)
	}
	return len(b), nil
}

// startRelay starts rl and returns what stops it and closes src.
func startRelay(ctx context.Context, t *testing.T, rl *relay.Relay, src outboxdriver.Source) func() {
	t.Helper()
	if err := rl.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rl.Stop(sctx); err != nil {
			t.Errorf("stop relay: %v", err)
		}
		src.Close()
	}
}

// hasLeanShape reports whether tb has neither the primary key on id nor
// the (partition, seq) index.
func hasLeanShape(t *testing.T, ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, table string) bool {
	t.Helper()
	var pk, byPart bool
	err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'p'),
       EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
               WHERE i.indrelid = $1::regclass AND a.attname = 'partition')`, table).Scan(&pk, &byPart)
	if err != nil {
		t.Fatal(err)
	}
	// Before version 10 both; from 10 neither; from 26 the key again.
	if byPart && !pk {
		t.Fatalf("table %s half migrated: primary key %v, (partition, seq) index %v", table, pk, byPart)
	}
	return !byPart
}

// hasEventKey reports whether table has its primary key on id (schema
// version 26).
func hasEventKey(t *testing.T, ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, table string) bool {
	t.Helper()
	var pk bool
	err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_constraint c JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
WHERE c.conrelid = $1::regclass AND c.contype = 'p' AND a.attname = 'id' AND cardinality(c.conkey) = 1)`, table).Scan(&pk)
	if err != nil {
		t.Fatal(err)
	}
	return pk
}

// partitionShape reports how tb keeps its rows' partitions: "generated"
// (a stored generated column, schema versions 2 to 16), "trigger" (the
// column set by a row trigger, version 17) or "derived" (the column kept
// but no longer set: relays compute the partition, version 18). It checks
// that every partition the column holds is the hash of the row's
// aggregate id, and, but for "derived", that every row has one.
func partitionShape(t *testing.T, ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, table string) string {
	t.Helper()
	var generated, trigger bool
	err := db.QueryRow(ctx, `SELECT (SELECT attgenerated <> '' FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'partition'),
       EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = $1::regclass AND tgname LIKE '%\_partition' AND NOT tgisinternal AND tgenabled = 'A')`, table).Scan(&generated, &trigger)
	if err != nil {
		t.Fatal(err)
	}
	if generated && trigger {
		t.Fatalf("table %s half migrated: a generated partition and a partition trigger", table)
	}
	var wrong, empty int
	if err := db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE partition <> ((hashtextextended(aggregateid, 0) & 9223372036854775807) % 64)::integer),
       count(*) FILTER (WHERE partition IS NULL) FROM `+table).Scan(&wrong, &empty); err != nil {
		t.Fatal(err)
	}
	if wrong > 0 {
		t.Fatalf("table %s: %d rows in the wrong partition", table, wrong)
	}
	switch {
	case generated:
		return "generated"
	case trigger && empty > 0:
		t.Fatalf("table %s: %d rows without a partition while the trigger sets it", table, empty)
	case trigger:
		return "trigger"
	}
	return "derived"
}

// Migration 10 (the lean row) and its revert run while writers commit
// events and a relay drains a backlog: nothing is lost, nothing published
// twice, and every aggregate's events are published in the order written.
func TestLeanRowMigratesUnderLoad(t *testing.T) {
	t.Parallel()
	testMigratesUnderLoad(t, leanVersion, hasLeanShape)
}

// Migration 26 (the key on id again) and its revert, the same way: the
// writers wait for the key's lock, and nothing is lost or reordered.
func TestEventKeyMigratesUnderLoad(t *testing.T) {
	t.Parallel()
	testMigratesUnderLoad(t, eventKeyVersion, hasEventKey)
}

// Migration 17 (the partition set by a trigger) and its revert, the same
// way: every row keeps, and every new row gets, its aggregate's partition
// (the latest version, 18, stores none).
func TestPartitionTriggerMigratesUnderLoad(t *testing.T) {
	t.Parallel()
	testMigratesUnderLoad(t, 17, func(t *testing.T, ctx context.Context, db interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}, table string) bool {
		return partitionShape(t, ctx, db, table) != "generated"
	})
}

// Migration 18 (the partition computed by the relays, stored nowhere) and
// its revert, the same way: the relay claims by the same hash before and
// after, and the revert gives every row, old and new, its partition back.
func TestDerivedPartitionMigratesUnderLoad(t *testing.T) {
	t.Parallel()
	testMigratesUnderLoad(t, 18, func(t *testing.T, ctx context.Context, db interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}, table string) bool {
		return partitionShape(t, ctx, db, table) == "derived"
	})
}

// At version 17 the partition trigger sets every row's partition, whatever
// a plain-SQL writer gives, on insert and on update, also under
// session_replication_role = replica (a restore, a replication apply).
func TestPartitionTriggerSetsEveryRowsPartition(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, time.Minute)
	pool, tb := setup(t)
	if _, err := outboxpgx.New(pool).MigrateDown(ctx, tb, 17); err != nil {
		t.Fatal(err)
	}
	table := tb.Qualified("")
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (id, aggregatetype, aggregateid, type, payload, partition)
VALUES (gen_random_uuid(), 'order', 'given', 'Placed', '{}', 9999)`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (id, aggregatetype, aggregateid, type, payload)
VALUES (gen_random_uuid(), 'order', 'replica', 'Placed', '{}')`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE `+table+` SET aggregateid = 'moved' WHERE aggregateid = 'given'`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if shape := partitionShape(t, ctx, pool, table); shape != "trigger" { // also checks every row's partition
		t.Fatalf("partition %s at version 17, want set by its trigger", shape)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE aggregateid IN ('moved', 'replica') AND partition IS NOT NULL`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("%d of 2 rows with a partition", n)
	}
}

// testMigratesUnderLoad runs migration version up, down and up again
// while writers commit events and a relay drains a backlog written at the
// version before; shaped reports whether the table has the version's shape.
func testMigratesUnderLoad(t *testing.T, version int, shaped func(*testing.T, context.Context, interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, string) bool) {
	ctx := testenv.Context(t, 6*time.Minute)
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	drv := outboxpgx.New(pool)
	if _, err := drv.Migrate(ctx, tb, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := drv.MigrateDown(ctx, tb, version-1); err != nil {
		t.Fatal(err)
	}
	table := tb.Qualified("")
	if shaped(t, ctx, pool, table) {
		t.Fatalf("the table has the shape of migration %d before it ran", version)
	}

	// A backlog written with plain SQL: aggregates b0..b19, n = 1..100 each.
	const backlog, backlogAggs = 6000, 20
	if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (id, aggregatetype, aggregateid, type, payload)
SELECT gen_random_uuid(), 'order', 'b' || (g % $2), 'Placed', json_build_object('n', g / $2 + 1)
FROM generate_series(0, $1 - 1) AS g ORDER BY g`, backlog, backlogAggs); err != nil {
		t.Fatal(err)
	}

	out := &published{order: map[string][]int{}, copies: map[string]int{}}
	src, err := drv.NewSource(tb, nil)
	if err != nil {
		t.Fatal(err)
	}
	router, err := route.New(&route.Config{})
	if err != nil {
		t.Fatal(err)
	}
	rl, err := relay.New(src, stdoutsink.New(out), &relay.Config{
		BatchSize: 20, LeaseTTL: 2 * time.Second, PollInterval: 50 * time.Millisecond, Router: router,
		Logger: slog.New(slog.NewTextHandler(&testenv.Buffer{}, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer startRelay(ctx, t, rl, src)()

	// Writers: aggregates w0..w3, each its own n = 1, 2, ... in order,
	// one event per transaction, until told to stop.
	ob, err := outbox.New(drv, &outbox.Config{Schema: tb.Schema, Table: tb.Name})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	written := make([]int, 4)
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Go(func() {
			for n := 1; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					return ob.WriteTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("w%d", w),
						Type: "Placed", Payload: fmt.Appendf(nil, `{"n":%d}`, n)})
				})
				if err != nil {
					errs <- fmt.Errorf("writer %d, event %d: %w", w, n, err)
					return
				}
				written[w] = n
			}
		})
	}
	// Up, down and up again, each while the backlog is in flight.
	backlogLeft := func() int {
		var left int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE aggregateid LIKE 'b%'`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		return left
	}
	// The relays are of this build, but registered on a table too old to
	// record their version: that they work with it is the operator's word
	// (outbox migrate --force; docs/operations.md, Upgrades).
	force := &outboxdriver.MigrateOptions{IgnoreRelaysBehind: true}
	for i, step := range []func() error{
		func() error { _, err := drv.Migrate(ctx, tb, force); return err },
		func() error { _, err := drv.MigrateDown(ctx, tb, version-1); return err },
		func() error { _, err := drv.Migrate(ctx, tb, force); return err },
	} {
		if left := backlogLeft(); left == 0 {
			t.Fatalf("step %d: the backlog was drained before the migration ran (slow the relay down)", i)
		}
		if err := step(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if got := shaped(t, ctx, pool, table); got != (i != 1) {
			t.Fatalf("step %d: shape of migration %d %v", i, version, got)
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// Everything drains: every event published once, in order.
	total := backlog
	for _, n := range written {
		total += n
	}
	await.Eventually(t, 4*time.Minute, func() error {
		var left int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&left); err != nil {
			t.Fatal(err)
		}
		out.mu.Lock()
		got := len(out.copies)
		out.mu.Unlock()
		if left != 0 || got != total {
			return fmt.Errorf("%d rows left, %d of %d events published", left, got, total)
		}
		return nil
	})
	out.mu.Lock()
	defer out.mu.Unlock()
	if out.err != nil {
		t.Fatal(out.err)
	}
	for id, c := range out.copies {
		if c != 1 {
			t.Errorf("event %s published %d times", id, c)
		}
	}
	want := map[string]int{}
	for a := range backlogAggs {
		want[fmt.Sprintf("b%d", a)] = backlog / backlogAggs
	}
	for w, n := range written {
		want[fmt.Sprintf("w%d", w)] = n
	}
	for agg, n := range want {
		got := out.order[agg]
		if len(got) != n {
			t.Errorf("aggregate %s: %d events published, want %d", agg, len(got), n)
			continue
		}
		for i, v := range got {
			if v != i+1 {
				t.Errorf("aggregate %s: publish order %s, want 1..%d", agg, strings.Trim(fmt.Sprint(got), "[]"), n)
				break
			}
		}
	}
}
