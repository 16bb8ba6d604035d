package outboxmysql_test

// Tests of what is particular to MySQL and MariaDB; what every driver must
// do is in the conformance suite (drivertest_test.go).

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxmysql"
)

// fixture is a migrated table in a fresh database, with a pool on it.
type fixture struct {
	db  *sql.DB
	tb  outboxdriver.Table
	ctx context.Context
}

func newFixture(t *testing.T, partitions int) *fixture {
	t.Helper()
	admin := openDB(t, "")
	name := newDatabase(t, admin)
	f := &fixture{db: openDB(t, name), tb: outboxdriver.Table{Schema: name, Name: "outbox"}, ctx: testenv.Context(t, 2*time.Minute)}
	if _, err := outboxmysql.New(f.db).Migrate(f.ctx, f.tb, &outboxdriver.MigrateOptions{Partitions: partitions}); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return f
}

// source returns a Source named name that leases every partition for a
// minute.
func (f *fixture) source(t *testing.T, name string, ttl time.Duration) (outboxdriver.Source, []outboxdriver.Lease) {
	t.Helper()
	s0, err := outboxmysql.New(f.db).NewSource(f.tb, &outboxdriver.SourceConfig{RelayName: name})
	if err != nil {
		t.Fatal(err)
	}
	src := s0
	_, n, err := src.Heartbeat(f.ctx, ttl)
	if err != nil {
		t.Fatal(err)
	}
	leases, err := src.Acquire(f.ctx, n, ttl)
	if err != nil {
		t.Fatal(err)
	}
	return src, leases
}

type body struct {
	Agg string `json:"agg"`
	N   int    `json:"n"`
}

func event(agg string, n int) outbox.Event {
	p, _ := json.Marshal(body{agg, n})
	return outbox.Event{AggregateType: "order", AggregateID: agg, Type: "Changed", Payload: p}
}

// TestConcurrentClaimsKeepOrder claims from disjoint sets of partitions at
// the same time (as a relay's lanes, or several relays, do) while writers
// commit one- and two-event transactions and roll some back. InnoDB locks
// a row before it filters it, so claiming the outbox rows with FOR UPDATE
// SKIP LOCKED would make one claimer skip a row the other had just
// scanned and take a later event of the same aggregate; the claim reads
// rows without locks instead. Every aggregate's events must be claimed in
// commit order, each exactly once.
func TestConcurrentClaimsKeepOrder(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 8)
	src, leases := f.source(t, "lanes", time.Minute)
	var writers sync.WaitGroup
	var mu sync.Mutex
	committed := map[string]int{} // events per aggregate
	for w := range 4 {
		writers.Go(func() {
			for k := range 60 {
				agg := fmt.Sprintf("w%d-a%d", w, k%5)
				commit := k%7 != 6
				mu.Lock()
				next := committed[agg]
				mu.Unlock()
				var evs []outbox.Event
				for j := range 1 + k%2 {
					n := next + j
					if !commit {
						n = -1
					}
					evs = append(evs, event(agg, n))
				}
				if err := write(f.ctx, f.db, f.tb, commit, evs...); err != nil {
					t.Errorf("write: %v", err)
					return
				}
				if commit {
					mu.Lock()
					committed[agg] += len(evs)
					mu.Unlock()
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { writers.Wait(); close(done) }()
	seen := map[string]int{}
	var claimers sync.WaitGroup
	for lane := range 2 {
		var mine []outboxdriver.Lease
		for _, l := range leases {
			if l.Partition%2 == lane {
				mine = append(mine, l)
			}
		}
		claimers.Go(func() {
			for {
				finished := false
				select {
				case <-done:
					finished = true
				default:
				}
				b, err := src.Claim(f.ctx, mine, 7)
				if err != nil {
					t.Errorf("claim: %v", err)
					return
				}
				recs := b.Records()
				ids := make([]string, len(recs))
				mu.Lock()
				for i, r := range recs {
					var p body
					_ = json.Unmarshal(r.Payload, &p)
					if p.N != seen[p.Agg] {
						t.Errorf("%s: claimed event %d (seq %d) when event %d was next", p.Agg, p.N, r.Seq, seen[p.Agg])
					}
					seen[p.Agg] = p.N + 1
					ids[i] = r.ID
				}
				mu.Unlock()
				if err := b.Finish(f.ctx, outboxdriver.Outcome{Published: ids}); err != nil {
					t.Errorf("finish: %v", err)
					return
				}
				if finished && len(recs) == 0 {
					return
				}
			}
		})
	}
	claimers.Wait()
	for agg, n := range committed {
		if seen[agg] != n {
			t.Errorf("%s: %d events claimed, %d committed", agg, seen[agg], n)
		}
	}
}

// TestOpenBatchDoesNotBlockWriters keeps a batch open (as while it is
// published) and inserts into the same partition meanwhile: the claim's
// READ COMMITTED transaction takes no gap locks, so the writer commits
// at once instead of waiting for the batch.
func TestOpenBatchDoesNotBlockWriters(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	if err := write(f.ctx, f.db, f.tb, true, event("a", 0), event("b", 0)); err != nil {
		t.Fatal(err)
	}
	src, leases := f.source(t, "r", time.Minute)
	b, err := src.Claim(f.ctx, leases, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(f.ctx)
	if len(b.Records()) != 2 {
		t.Fatalf("claimed %d records, want 2", len(b.Records()))
	}
	// A writer that waited for the batch would wait until this test
	// gives up; innodb_lock_wait_timeout makes it fail instead of hang.
	conn, err := f.db.Conn(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(f.ctx, `SET SESSION innodb_lock_wait_timeout = 20`); err != nil {
		t.Fatal(err)
	}
	tx, err := conn.BeginTx(f.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	ob, _ := outbox.New(outboxmysql.New(f.db), &outbox.Config{Schema: f.tb.Schema})
	if err := ob.WriteTx(f.ctx, tx, event("a", 1), event("c", 0)); err != nil {
		t.Fatalf("insert while a batch is open: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(f.ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (UUID(), 'order', 'd', 'Changed', '{}')`); err != nil {
		t.Fatalf("plain insert while a batch is open: %v", err)
	}
	if err := b.Finish(f.ctx, outboxdriver.Outcome{Published: []string{b.Records()[0].ID, b.Records()[1].ID}}); err != nil {
		t.Fatal(err)
	}
}

// TestPlainInsertGetsEveryDefault inserts the Debezium columns only, with
// MySQL's UUID(): partition, seq, created_at and headers come from the
// database, and the relay claims the row.
func TestPlainInsertGetsEveryDefault(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 64)
	if _, err := f.db.ExecContext(f.ctx, "INSERT INTO `"+f.tb.Schema+"`.outbox (id, aggregatetype, aggregateid, type, payload) VALUES (UUID(), 'order', '42', 'OrderPlaced', '{\"orderId\":42}')"); err != nil {
		t.Fatal(err)
	}
	var part int
	var headers string
	var want int
	if err := f.db.QueryRowContext(f.ctx, "SELECT `partition`, headers, CRC32('42') % 64 FROM outbox").Scan(&part, &headers, &want); err != nil {
		t.Fatal(err)
	}
	if part != want || headers != "{}" {
		t.Fatalf("partition %d headers %q; want %d and {}", part, headers, want)
	}
	src, leases := f.source(t, "r", time.Minute)
	b, err := src.Claim(f.ctx, leases, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(f.ctx)
	recs := b.Records()
	if len(recs) != 1 || recs[0].Partition != want || recs[0].AggregateID != "42" || string(recs[0].Payload) != `{"orderId":42}` ||
		time.Since(recs[0].CreatedAt) > time.Hour || time.Since(recs[0].CreatedAt) < -time.Hour {
		t.Fatalf("claimed %+v", recs)
	}
}

// TestLongTextIsRefusedBeforeSQL checks that an aggregate id longer than
// the column is refused with ErrInvalidEvent (a server outside strict
// mode would truncate it and merge two aggregates), and the transaction
// stays usable.
func TestLongTextIsRefusedBeforeSQL(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 4)
	ob, err := outbox.New(outboxmysql.New(f.db), &outbox.Config{Schema: f.tb.Schema})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := f.db.BeginTx(f.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	long := event(strings.Repeat("x", 256), 0)
	if err := ob.WriteTx(f.ctx, tx, event("ok", 0), long); !errors.Is(err, outbox.ErrInvalidEvent) {
		t.Fatalf("WriteTx with a 256-character aggregate id: %v, want ErrInvalidEvent", err)
	}
	if err := ob.WriteTx(f.ctx, tx, event(strings.Repeat("é", 255), 0)); err != nil {
		t.Fatalf("a 255-character id must fit: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := f.db.QueryRowContext(f.ctx, "SELECT COUNT(*) FROM outbox").Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d rows (%v), want the one valid event", n, err)
	}
}

// TestManyEventsInOneWrite writes more events than one INSERT takes.
func TestManyEventsInOneWrite(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 4)
	evs := make([]outbox.Event, 12001)
	for i := range evs {
		evs[i] = event(fmt.Sprint("a", i%10), i)
	}
	if err := write(f.ctx, f.db, f.tb, true, evs...); err != nil {
		t.Fatal(err)
	}
	st, err := outboxmysql.New(f.db).Status(f.ctx, f.tb)
	if err != nil || st.Backlog != int64(len(evs)) {
		t.Fatalf("backlog %d (%v), want %d", st.Backlog, err, len(evs))
	}
}

// TestMigrateConcurrentlyAndAgain runs four migrators at once (the named
// lock lets one apply the migrations, the others find nothing to do), then
// simulates a migration cut short (MySQL commits DDL at once): the
// bookkeeping lost its record, so the next run applies the migration
// again over what exists, without error. A run with another partition
// count than the half-done one is refused.
func TestMigrateConcurrentlyAndAgain(t *testing.T) {
	t.Parallel()
	admin := openDB(t, "")
	name := newDatabase(t, admin)
	db := openDB(t, name)
	ctx := testenv.Context(t, time.Minute)
	tb := outboxdriver.Table{Schema: name, Name: "orders_outbox"}
	// Versions need not be contiguous (a gap waits for another branch's
	// migration): count the migrations, not the latest version.
	ups, err := filepath.Glob("migrations/*.up.sql")
	if err != nil || len(ups) == 0 {
		t.Fatalf("the migrations: %v, %v", ups, err)
	}
	versions := len(ups)
	var wg sync.WaitGroup
	applied := make([][]int, 4)
	errs := make([]error, 4)
	for i := range 4 {
		wg.Go(func() {
			applied[i], errs[i] = outboxmysql.New(db).Migrate(ctx, tb, &outboxdriver.MigrateOptions{Partitions: 16})
		})
	}
	wg.Wait()
	total := 0
	for i := range 4 {
		if errs[i] != nil {
			t.Fatalf("migrator %d: %v", i, errs[i])
		}
		total += len(applied[i])
	}
	if total != versions {
		t.Fatalf("migrators applied %v together, want each of the %d versions once", applied, versions)
	}
	if _, err := db.ExecContext(ctx, "DELETE FROM orders_outbox_migrations"); err != nil {
		t.Fatal(err)
	}
	if _, err := outboxmysql.New(db).Migrate(ctx, tb, &outboxdriver.MigrateOptions{Partitions: 8}); err == nil || !strings.Contains(err.Error(), "16 partitions") {
		t.Fatalf("rerun with 8 partitions over a half-done migration with 16: %v", err)
	}
	vs, err := outboxmysql.New(db).Migrate(ctx, tb, &outboxdriver.MigrateOptions{Partitions: 16})
	if err != nil || len(vs) != versions {
		t.Fatalf("rerun applied %v, %v", vs, err)
	}
	var leases int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM orders_outbox_leases").Scan(&leases); err != nil || leases != 16 {
		t.Fatalf("%d leases (%v), want 16", leases, err)
	}
	if vs, err := outboxmysql.New(db).MigrateDown(ctx, tb, 0); err != nil || len(vs) != versions {
		t.Fatalf("migrate down: %v, %v", vs, err)
	}
	var left int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ?", name).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d tables left after migrate down to 0 (%v)", left, err)
	}
}

// TestEmptySchemaIsTheCurrentDatabase uses a table without a schema:
// every operation works on the connection's current database.
func TestEmptySchemaIsTheCurrentDatabase(t *testing.T) {
	t.Parallel()
	admin := openDB(t, "")
	name := newDatabase(t, admin)
	db := openDB(t, name)
	ctx := testenv.Context(t, time.Minute)
	tb := outboxdriver.Table{Name: "outbox"}
	st := outboxmysql.New(db)
	if _, err := st.Migrate(ctx, tb, nil); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := outboxmysql.New(db).InsertTx(ctx, tx, tb, []outboxdriver.Row{{ID: uuid.NewString(), AggregateType: "order", AggregateID: "1", Type: "T", Payload: []byte(`{}`)}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	status, err := st.Status(ctx, tb)
	if err != nil || status.Backlog != 1 || len(status.Partitions) != outboxdriver.DefaultPartitions || status.SchemaVersion != outboxmysql.New(nil).LatestVersion() {
		t.Fatalf("status %+v, %v", status, err)
	}
	if _, err := st.Status(ctx, outboxdriver.Table{Schema: name, Name: "missing"}); !errors.Is(err, outboxdriver.ErrNotMigrated) {
		t.Fatalf("status of a missing table: %v, want ErrNotMigrated", err)
	}
}

// TestPausedClaimIsEndedByTheServer leaves a claim idle longer than the
// lease TTL, as a relay paused mid-batch does: MariaDB ends the
// transaction (idle_transaction_timeout), so another relay can claim the
// partition once the lease has expired, and the paused relay's late
// Finish records nothing.
func TestPausedClaimIsEndedByTheServer(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	if err := write(f.ctx, f.db, f.tb, true, event("a", 0)); err != nil {
		t.Fatal(err)
	}
	stale, leases := f.source(t, "paused", time.Second)
	b, err := stale.Claim(f.ctx, leases, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(f.ctx)
	if len(b.Records()) != 1 {
		t.Fatalf("claimed %d records, want 1", len(b.Records()))
	}
	next, err := outboxmysql.New(f.db).NewSource(f.tb, &outboxdriver.SourceConfig{RelayName: "next"})
	if err != nil {
		t.Fatal(err)
	}
	await.Eventually(t, 60*time.Second, func() error {
		got, err := next.Acquire(f.ctx, 1, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 {
			return errors.New("the partition of a paused claim was never leased again")
		}
		nb, err := next.Claim(f.ctx, got, 10)
		if err != nil {
			t.Fatal(err)
		}
		recs := nb.Records()
		if err := nb.Finish(f.ctx, outboxdriver.Outcome{Published: []string{b.Records()[0].ID}}); err != nil {
			t.Fatal(err)
		}
		if len(recs) == 0 {
			// Leased, but the paused claim still holds the partition.
			if err := next.Release(f.ctx, got, false); err != nil {
				t.Fatal(err)
			}
			return errors.New("the partition of a paused claim was leased again but never claimable")
		}
		return nil
	})
	if err := b.Finish(f.ctx, outboxdriver.Outcome{Published: []string{b.Records()[0].ID}}); err == nil {
		t.Fatal("the paused relay's Finish succeeded after its claim was ended and its lease taken over")
	}
}

// TestClaimLeavesThePoolClean checks that the idle timeout a claim sets
// on its connection is reset before the connection goes back to the
// pool, which may be the application's.
func TestClaimLeavesThePoolClean(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	f.db.SetMaxOpenConns(1)
	var before string
	if err := f.db.QueryRowContext(f.ctx, `SELECT @@SESSION.idle_transaction_timeout`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	if err := write(f.ctx, f.db, f.tb, true, event("a", 0)); err != nil {
		t.Fatal(err)
	}
	src, leases := f.source(t, "r", 5*time.Second)
	b, err := src.Claim(f.ctx, leases, 10)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Finish(f.ctx, outboxdriver.Outcome{Published: []string{b.Records()[0].ID}}); err != nil {
		t.Fatal(err)
	}
	var after string
	if err := f.db.QueryRowContext(f.ctx, `SELECT @@SESSION.idle_transaction_timeout`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Fatalf("idle_transaction_timeout of the pooled connection is %s after a batch, was %s", after, before)
	}
}

// TestDeliverAtIsStoredInUTCRoundedUp writes a delayed event with a time
// in another zone and a fraction below the microsecond, next to an
// undelayed one in the same INSERT: deliver_at holds the time in UTC,
// rounded up (the event is never due before its time), and NULL for the
// undelayed one.
func TestDeliverAtIsStoredInUTCRoundedUp(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	delayed, now := event("a", 0), event("b", 0)
	delayed.DeliverAt = time.Date(2030, 1, 2, 3, 4, 5, 123456001, time.FixedZone("UTC+2", 2*3600))
	if err := write(f.ctx, f.db, f.tb, true, delayed, now); err != nil {
		t.Fatal(err)
	}
	got := testenv.NullStrings(t, f.ctx, f.db, "SELECT aggregateid, DATE_FORMAT(deliver_at, '%Y-%m-%d %H:%i:%s.%f') FROM outbox")
	if a := got["a"]; !a.Valid || a.String != "2030-01-02 01:04:05.123457" {
		t.Errorf("deliver_at of the delayed event = %v; want 2030-01-02 01:04:05.123457", a)
	}
	if b := got["b"]; b.Valid {
		t.Errorf("deliver_at of the undelayed event = %q; want NULL", b.String)
	}
}

// TestDelayedClaimReadsPastPages claims one record at a time, so the
// claim reads past the rows that are not due in pages of 1, 2, 4, ...
// rows: wherever the pages split an aggregate, its later rows stay behind
// its waiting first one, and the claimable rows after them all are found.
func TestDelayedClaimReadsPastPages(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	var evs []outbox.Event
	for _, agg := range []string{"a", "b", "c"} {
		e := event(agg, 0)
		e.DeliverAt = time.Now().Add(time.Hour)
		evs = append(evs, e)
	}
	for n := 1; n <= 3; n++ {
		for _, agg := range []string{"a", "b", "c"} {
			evs = append(evs, event(agg, n))
		}
	}
	evs = append(evs, event("free", 0), event("free", 1))
	if err := write(f.ctx, f.db, f.tb, true, evs...); err != nil {
		t.Fatal(err)
	}
	src, leases := f.source(t, "pages", time.Minute)
	var claimed []string
	for range 4 {
		b, err := src.Claim(f.ctx, leases, 1)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, r := range b.Records() {
			var p body
			_ = json.Unmarshal(r.Payload, &p)
			claimed = append(claimed, fmt.Sprintf("%s%d", p.Agg, p.N))
			ids = append(ids, r.ID)
		}
		if err := b.Finish(f.ctx, outboxdriver.Outcome{Published: ids}); err != nil {
			t.Fatal(err)
		}
	}
	if got := strings.Join(claimed, " "); got != "free0 free1" {
		t.Fatalf("claimed %q; want free0 free1 (a, b and c wait behind their delayed first events)", got)
	}
	st, err := outboxmysql.New(f.db).Status(f.ctx, f.tb)
	if err != nil || st.Delayed != 3 || st.Backlog != 12 {
		t.Fatalf("status: %d delayed, backlog %d (%v); want 3 delayed in a backlog of 12", st.Delayed, st.Backlog, err)
	}
}

// Time partitions are PostgreSQL's: asked for here, migrate says so and
// creates nothing.
func TestTimePartitionsAreRefused(t *testing.T) {
	t.Parallel()
	admin := openDB(t, "")
	name := newDatabase(t, admin)
	db := openDB(t, name)
	tb := outboxdriver.Table{Schema: name, Name: "outbox"}
	ctx := testenv.Context(t, time.Minute)
	_, err := outboxmysql.New(db).Migrate(ctx, tb, &outboxdriver.MigrateOptions{TimePartitions: outboxdriver.TimePartitionsDay})
	if !errors.Is(err, outboxdriver.ErrNoTimePartitions) {
		t.Fatalf("migrate with time partitions: %v", err)
	}
	var tables int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_schema = ?`, name).Scan(&tables); err != nil || tables != 0 {
		t.Fatalf("%d tables made, %v", tables, err)
	}
}
