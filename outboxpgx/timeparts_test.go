package outboxpgx_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/route"
	"github.com/outboxkit/outbox/sink/stdoutsink"
)

// setupByTime returns a pool and a table partitioned by hour, ahead
// hours made ahead, in a fresh schema.
func setupByTime(t *testing.T, ahead int) (*pgxpool.Pool, outboxdriver.Table) {
	t.Helper()
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	if _, err := outboxpgx.New(pool).Migrate(context.Background(), tb, &outboxdriver.MigrateOptions{
		TimePartitions: outboxdriver.TimePartitionsHour, TimePartitionsAhead: ahead}); err != nil {
		t.Fatal(err)
	}
	return pool, tb
}

// pastHour makes the partition of the hour that began back hours before
// the current one (as the maintenance names it) and returns its name and
// a time inside it. Partitions of the past are made here for rows dated
// back; relays make them only ahead.
func pastHour(t *testing.T, pool *pgxpool.Pool, tb outboxdriver.Table, back int) (string, time.Time) {
	t.Helper()
	lo := time.Now().UTC().Truncate(time.Hour).Add(-time.Duration(back) * time.Hour)
	name := tb.Name + "_p" + lo.Format("2006010215")
	if _, err := pool.Exec(context.Background(), fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')`,
		outboxdriver.QuoteIdent(tb.Schema)+"."+outboxdriver.QuoteIdent(name), tb.Qualified(""),
		lo.Format(time.RFC3339), lo.Add(time.Hour).Format(time.RFC3339))); err != nil {
		t.Fatal(err)
	}
	return name, lo.Add(30 * time.Minute)
}

// insertAt writes one event with plain SQL, dated at, published at
// published (nil: unpublished), and returns its id.
func insertAt(t *testing.T, pool *pgxpool.Pool, tb outboxdriver.Table, at time.Time, published *time.Time) string {
	t.Helper()
	var id string
	if err := pool.QueryRow(context.Background(), `INSERT INTO `+tb.Qualified("")+` (id, aggregatetype, aggregateid, type, payload, created_at, published_at)
VALUES (gen_random_uuid(), 'order', 'o1', 'Placed', '{}', $1, $2) RETURNING id::text`, at, published).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// partitionOf names the partition the row id is in; "" when it is gone.
func partitionOf(t *testing.T, pool *pgxpool.Pool, tb outboxdriver.Table, id string) string {
	t.Helper()
	var name string
	err := pool.QueryRow(context.Background(), `SELECT tableoid::regclass::text FROM `+tb.Qualified("")+` WHERE id = $1`, id).Scan(&name)
	if err == pgx.ErrNoRows {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	_, name, _ = strings.Cut(name, ".")
	return name
}

func exists(t *testing.T, pool *pgxpool.Pool, tb outboxdriver.Table, name string) bool {
	t.Helper()
	var ok bool
	if err := pool.QueryRow(context.Background(), `SELECT to_regclass($1) IS NOT NULL`,
		outboxdriver.QuoteIdent(tb.Schema)+"."+outboxdriver.QuoteIdent(name)).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func maintain(t *testing.T, pool *pgxpool.Pool, tb outboxdriver.Table, m outboxdriver.TimePartitionMaintenance) map[string]outboxdriver.TimePartitionChange {
	t.Helper()
	changes, err := outboxpgx.New(pool).MaintainTimePartitions(context.Background(), tb, m)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]outboxdriver.TimePartitionChange{}
	for _, c := range changes {
		byName[c.Partition] = c
	}
	return byName
}

func ago(d time.Duration) *time.Time {
	at := time.Now().Add(-d)
	return &at
}

func TestTimePartitionsAreMadeAtCreationOnly(t *testing.T) {
	ctx := context.Background()
	pool, tb := setupByTime(t, 3)
	drv := outboxpgx.New(pool)

	st, err := drv.Status(ctx, tb)
	if err != nil {
		t.Fatal(err)
	}
	tp := st.TimePartitions
	now := time.Now().UTC().Truncate(time.Hour)
	if tp != nil && tp.Oldest.Equal(now.Add(-time.Hour)) {
		now = tp.Oldest // migrated in the hour before
	}
	if tp == nil || tp.Unit != "hour" || tp.Ahead != 3 || tp.Partitions != 4 || !tp.Oldest.Equal(now) || !tp.Newest.Equal(now.Add(3*time.Hour)) || tp.MaintainedAt.IsZero() {
		t.Fatalf("time partitions after migrate: %+v, want 4 hours from %s", tp, now)
	}
	if !exists(t, pool, tb, tb.Name+"_pdefault") {
		t.Fatal("no default partition")
	}

	// A second run with the same unit changes nothing; another unit is refused.
	if vs, err := drv.Migrate(ctx, tb, &outboxdriver.MigrateOptions{TimePartitions: "hour"}); err != nil || len(vs) != 0 {
		t.Fatalf("second migrate: %v, %v", vs, err)
	}
	if _, err := drv.Migrate(ctx, tb, &outboxdriver.MigrateOptions{TimePartitions: "day"}); err == nil || !strings.Contains(err.Error(), "another unit") {
		t.Fatalf("migrate by day a table by hour: %v", err)
	}
	if _, err := drv.Migrate(ctx, tb, &outboxdriver.MigrateOptions{TimePartitions: "week"}); err == nil || !strings.Contains(err.Error(), `"week"`) {
		t.Fatalf("migrate by week: %v", err)
	}

	// A table made without them is not converted.
	_, plain := setup(t)
	if _, err := drv.Migrate(ctx, plain, &outboxdriver.MigrateOptions{TimePartitions: "day"}); err == nil || !strings.Contains(err.Error(), "not converted") {
		t.Fatalf("time partitions on an existing plain table: %v", err)
	}
	if st, err := drv.Status(ctx, plain); err != nil || st.TimePartitions != nil {
		t.Fatalf("status of a plain table: %+v, %v", st.TimePartitions, err)
	}

	// Below version 13 is refused (earlier relays know nothing of
	// partitions); down to 0 drops it all.
	if _, err := drv.MigrateDown(ctx, tb, 12); err == nil || !strings.Contains(err.Error(), "partitioned by time") {
		t.Fatalf("down to 12: %v", err)
	}
	if _, err := drv.MigrateDown(ctx, tb, 0); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{tb.Name, tb.Name + "_pdefault", tb.Name + "_tparts", tb.Name + "_p" + now.Format("2006010215")} {
		if exists(t, pool, tb, name) {
			t.Errorf("%s is still there after migrate --down 0", name)
		}
	}
}

func TestTimePartitionsDropOnlyWhatIsPublishedAndPastTheWindow(t *testing.T) {
	ctx := context.Background()
	pool, tb := setupByTime(t, 2)
	window := 10 * time.Minute
	m := outboxdriver.TimePartitionMaintenance{KeepFor: window, Actor: "retention-test"}

	done, atDone := pastHour(t, pool, tb, 5)       // every event published long ago
	pending, atPending := pastHour(t, pool, tb, 4) // one event unpublished
	recent, atRecent := pastHour(t, pool, tb, 3)   // published within the window
	doneIDs := []string{insertAt(t, pool, tb, atDone, ago(2*time.Hour)), insertAt(t, pool, tb, atDone, ago(2*time.Hour))}
	insertAt(t, pool, tb, atPending, ago(2*time.Hour))
	unpublished := insertAt(t, pool, tb, atPending, nil)
	recentID := insertAt(t, pool, tb, atRecent, ago(time.Minute))
	ancient := insertAt(t, pool, tb, time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC), ago(48*time.Hour)) // the default partition
	current := insertAt(t, pool, tb, time.Now(), ago(2*time.Hour))

	got := maintain(t, pool, tb, m)
	if got[done].Action != outboxdriver.PartitionDropped || exists(t, pool, tb, done) {
		t.Fatalf("fully published partition: %+v, still there: %v", got[done], exists(t, pool, tb, done))
	}
	for _, id := range doneIDs {
		if p := partitionOf(t, pool, tb, id); p != "" {
			t.Fatalf("event %s is still in %s", id, p)
		}
	}
	if c := got[pending]; c.Action != outboxdriver.PartitionKept || !strings.Contains(c.Detail, "1 unpublished") {
		t.Fatalf("partition with an unpublished event: %+v", c)
	}
	if p := partitionOf(t, pool, tb, unpublished); p != pending {
		t.Fatalf("the unpublished event is in %q, want %s", p, pending)
	}
	if c := got[recent]; c.Action != outboxdriver.PartitionWaiting || partitionOf(t, pool, tb, recentID) != recent {
		t.Fatalf("partition published within the window: %+v", c)
	}
	if p := partitionOf(t, pool, tb, ancient); p != tb.Name+"_pdefault" {
		t.Fatalf("a row dated 2000 is in %q, want the default partition", p)
	}
	if p := partitionOf(t, pool, tb, current); p == "" || got[p].Action == outboxdriver.PartitionDropped {
		t.Fatalf("the current hour's partition: %q, %+v", p, got[p])
	}

	// Status says what is kept and why.
	st, err := outboxpgx.New(pool).Status(ctx, tb)
	if err != nil {
		t.Fatal(err)
	}
	if tp := st.TimePartitions; tp == nil || len(tp.Kept) != 1 || tp.Kept[0].Partition != pending || tp.Kept[0].Unpublished != 1 || tp.DefaultRows != 1 {
		t.Fatalf("status: %+v", st.TimePartitions)
	}
	// The drop is audited.
	audit, err := outboxpgx.New(pool).FindAudit(ctx, tb, outboxdriver.AuditQuery{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(audit) != 1 || audit[0].Actor != "retention-test" || audit[0].Action != "partition-drop" || !strings.Contains(audit[0].Detail, done) {
		t.Fatalf("audit: %+v", audit)
	}

	// Once the event is published and the window has passed, its
	// partition goes too.
	if _, err := pool.Exec(ctx, `UPDATE `+tb.Qualified("")+` SET published_at = now() - interval '1 hour' WHERE id = $1`, unpublished); err != nil {
		t.Fatal(err)
	}
	got = maintain(t, pool, tb, m)
	if got[pending].Action != outboxdriver.PartitionDropped || exists(t, pool, tb, pending) {
		t.Fatalf("partition once published: %+v", got[pending])
	}
	// A window of zero drops nothing.
	if _, err := pool.Exec(ctx, `UPDATE `+tb.Qualified("")+` SET published_at = now() - interval '1 hour' WHERE id = $1`, recentID); err != nil {
		t.Fatal(err)
	}
	if got := maintain(t, pool, tb, outboxdriver.TimePartitionMaintenance{}); len(got) != 0 || !exists(t, pool, tb, recent) {
		t.Fatalf("maintenance with no window: %+v", got)
	}
	if p := partitionOf(t, pool, tb, ancient); p != tb.Name+"_pdefault" {
		t.Fatalf("the default partition's row: %q", p)
	}
}

func TestTimePartitionDropWaitsForAnOpenWriter(t *testing.T) {
	ctx := context.Background()
	pool, tb := setupByTime(t, 2)
	old, at := pastHour(t, pool, tb, 6)
	insertAt(t, pool, tb, at, ago(2*time.Hour))

	// A writer's transaction, still open, has put an unpublished event
	// into the old partition (a plain-SQL writer may date its rows).
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var late string
	if err := tx.QueryRow(ctx, `INSERT INTO `+tb.Qualified("")+` (id, aggregatetype, aggregateid, type, payload, created_at)
VALUES (gen_random_uuid(), 'order', 'o2', 'Placed', '{}', $1) RETURNING id::text`, at).Scan(&late); err != nil {
		t.Fatal(err)
	}
	m := outboxdriver.TimePartitionMaintenance{KeepFor: time.Minute, LockTimeout: 100 * time.Millisecond}
	if c := maintain(t, pool, tb, m)[old]; c.Action != outboxdriver.PartitionBusy || !exists(t, pool, tb, old) {
		t.Fatalf("drop while a writer's transaction is open: %+v", c)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if c := maintain(t, pool, tb, m)[old]; c.Action != outboxdriver.PartitionKept || partitionOf(t, pool, tb, late) != old {
		t.Fatalf("drop after the writer committed: %+v", c)
	}
}

func TestTimePartitionsNeverFailAWriter(t *testing.T) {
	ctx := context.Background()
	pool, tb := setupByTime(t, 3)
	table := tb.Qualified("")

	// WriteTx lands in the current hour's partition.
	ob := newOutbox(t, tb)
	write(t, pool, ob, true, outbox.Event{AggregateType: "order", AggregateID: "w1", Type: "Placed", Payload: []byte(`{}`)})
	var part string
	var created time.Time
	if err := pool.QueryRow(ctx, `SELECT tableoid::regclass::text, created_at FROM `+table+` WHERE aggregateid = 'w1'`).Scan(&part, &created); err != nil {
		t.Fatal(err)
	}
	if want := tb.Name + "_p" + created.UTC().Format("2006010215"); !strings.HasSuffix(part, want) {
		t.Fatalf("WriteTx's row is in %s, want %s", part, want)
	}

	// Rows no partition covers go to the default partition: dated far
	// back, and five hours ahead, past the three made.
	farBack := insertAt(t, pool, tb, time.Date(1999, 12, 31, 23, 0, 0, 0, time.UTC), nil)
	ahead := time.Now().UTC().Truncate(time.Hour).Add(5 * time.Hour)
	early := insertAt(t, pool, tb, ahead.Add(time.Minute), nil)
	for _, id := range []string{farBack, early} {
		if p := partitionOf(t, pool, tb, id); p != tb.Name+"_pdefault" {
			t.Fatalf("row %s is in %q, want the default partition", id, p)
		}
	}

	// Its hour cannot be made while the default partition holds a row of
	// it: reported, and writers still go on.
	if _, err := pool.Exec(ctx, `UPDATE `+tb.Qualified("_tparts")+` SET ahead = 6`); err != nil {
		t.Fatal(err)
	}
	blocked := tb.Name + "_p" + ahead.Format("2006010215")
	if c := maintain(t, pool, tb, outboxdriver.TimePartitionMaintenance{})[blocked]; c.Action != outboxdriver.PartitionBlocked {
		t.Fatalf("partition whose rows are in the default one: %+v", c)
	}
	st, err := outboxpgx.New(pool).Status(ctx, tb)
	if err != nil {
		t.Fatal(err)
	}
	if tp := st.TimePartitions; tp == nil || !slices.Equal(tp.Blocked, []string{blocked}) || tp.DefaultRows != 2 {
		t.Fatalf("status: %+v", st.TimePartitions)
	}
	insertAt(t, pool, tb, ahead.Add(2*time.Minute), nil)

	// The relay's cleanup deletes published rows of the default partition
	// only; then the hour can be made.
	published := insertAt(t, pool, tb, time.Now(), ago(time.Hour)) // in the current hour's partition
	if _, err := pool.Exec(ctx, `UPDATE `+table+` SET published_at = now() - interval '1 hour' WHERE created_at >= $1`, ahead); err != nil {
		t.Fatal(err)
	}
	src := newSource(t, pool, tb, outboxdriver.RetentionKeep)
	n, err := src.Cleanup(ctx, leaseAll(t, src), time.Minute, 100)
	if err != nil || n != 2 {
		t.Fatalf("cleanup: %d rows, %v; want the 2 published rows of the default partition", n, err)
	}
	if partitionOf(t, pool, tb, published) == "" || partitionOf(t, pool, tb, farBack) == "" {
		t.Fatal("the cleanup deleted a row it must not: one outside the default partition, or an unpublished one")
	}
	if c := maintain(t, pool, tb, outboxdriver.TimePartitionMaintenance{})[blocked]; c.Action != outboxdriver.PartitionCreated {
		t.Fatalf("partition once the default one holds none of its rows: %+v", c)
	}
}

func TestRelayDropsPartitionsOnceTheirEventsArePublished(t *testing.T) {
	ctx := context.Background()
	pool, tb := setupByTime(t, 2)
	drv := outboxpgx.New(pool)
	table := tb.Qualified("")

	// A backlog in two past hours, aggregates b0..b9 with n = 1, 2, ... in
	// order, and events written now.
	older, atOlder := pastHour(t, pool, tb, 3)
	newer, atNewer := pastHour(t, pool, tb, 2)
	const perHour, aggs = 500, 10
	for _, at := range []time.Time{atOlder, atNewer} {
		if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (id, aggregatetype, aggregateid, type, payload, created_at)
SELECT gen_random_uuid(), 'order', 'b' || (g % $2), 'Placed', json_build_object('n', g / $2 + 1 + $4::int), $3
FROM generate_series(0, $1 - 1) AS g ORDER BY g`, perHour, aggs, at, map[bool]int{true: 0, false: perHour / aggs}[at.Equal(atOlder)]); err != nil {
			t.Fatal(err)
		}
	}
	ob := newOutbox(t, tb)
	for i := range 20 {
		write(t, pool, ob, true, outbox.Event{AggregateType: "order", AggregateID: "w", Type: "Placed", Payload: fmt.Appendf(nil, `{"n":%d}`, i+1)})
	}
	const total = 2*perHour + 20

	out := &published{order: map[string][]int{}, copies: map[string]int{}}
	src, err := drv.NewSource(tb, &outboxdriver.SourceConfig{Retention: outboxdriver.RetentionKeep, RelayName: "tp-relay"})
	if err != nil {
		t.Fatal(err)
	}
	router, err := route.New(&route.Config{})
	if err != nil {
		t.Fatal(err)
	}
	logs := &testenv.Buffer{}
	rl, err := relay.New(src, stdoutsink.New(out), &relay.Config{
		BatchSize: 50, LeaseTTL: 2 * time.Second, PollInterval: 50 * time.Millisecond, Router: router,
		DropPartitionsAfter: time.Millisecond, PartitionsEvery: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer startRelay(ctx, t, rl, src)()

	// The relay logs a drop once its transaction has committed, a moment
	// after the partition is gone: wait for both, and for every row left
	// to be marked published. The events written now are behind the
	// backlog in their lane and may still be in flight when the past
	// partitions go, which wait only for their own events. A partition
	// dropped before its events were published takes them with it: they
	// are never published, and the count below falls short.
	unpublished := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE published_at IS NULL`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	await.Eventually(t, 30*time.Second, func() error {
		switch {
		case exists(t, pool, tb, older) || exists(t, pool, tb, newer):
			return fmt.Errorf("past partitions not dropped; relay log:\n%s", logs)
		case !strings.Contains(logs.String(), "time partition dropped"):
			return fmt.Errorf("the drops not logged; relay log:\n%s", logs)
		}
		if n := unpublished(); n > 0 {
			return fmt.Errorf("%d events left unpublished; relay log:\n%s", n, logs)
		}
		return nil
	})

	out.mu.Lock()
	defer out.mu.Unlock()
	if out.err != nil {
		t.Fatal(out.err)
	}
	if len(out.copies) != total {
		t.Fatalf("%d events published, want %d: a partition went before its events were published", len(out.copies), total)
	}
	for key, ns := range out.order {
		if !slices.IsSorted(ns) {
			t.Errorf("aggregate %s published out of order: %v", key, ns)
		}
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE published_at IS NOT NULL`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 20 {
		t.Fatalf("%d published rows kept, want the 20 of the current hour", left)
	}
	audit, err := drv.FindAudit(ctx, tb, outboxdriver.AuditQuery{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(audit) != 2 || audit[0].Actor != "relay:tp-relay" {
		t.Fatalf("audit: %+v", audit)
	}
}

// Insert + delete writes only where a replication slot relays the table,
// and log tailing does not read a table partitioned by time (its slot is
// never made): the writer is refused with outboxpgx.ErrNoSlot, for one
// event (a path of its own) and for several, and the rows of the table's
// partitions stay as they were.
func TestInsertDeleteIsRefusedOnAPartitionedTable(t *testing.T) {
	t.Parallel()
	pool, tb := setupByTime(t, 2)
	ctx := context.Background()
	_, past := pastHour(t, pool, tb, 3)
	var others []string
	for range 3 {
		others = append(others, insertAt(t, pool, tb, past, nil))
	}
	ob, err := outbox.New(outboxpgx.New(nil, outboxpgx.WithInsertDelete()), &outbox.Config{Schema: tb.Schema, Table: tb.Name})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 3} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var evs []outbox.Event
		for i := range n {
			evs = append(evs, ev("a", i))
		}
		err = ob.WriteTx(ctx, tx, evs...)
		tx.Rollback(ctx)
		if !errors.Is(err, outboxpgx.ErrNoSlot) {
			t.Fatalf("insert + delete of %d event(s) on a table partitioned by time: %v, want outboxpgx.ErrNoSlot", n, err)
		}
		rows, err := pool.Query(ctx, `SELECT id::text FROM `+tb.Qualified("")+` ORDER BY seq`)
		if err != nil {
			t.Fatal(err)
		}
		left, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(left, others) {
			t.Fatalf("after a refused insert + delete of %d event(s) the table holds %v, want the other partition's rows %v", n, left, others)
		}
	}
}
