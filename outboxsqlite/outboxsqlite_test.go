package outboxsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxsqlite"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// migrated opens a fresh file and migrates a table with n partitions.
func migrated(t testing.TB, n int) (*sql.DB, string, outboxdriver.Table) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "app.db")
	ctx := testContext(t)
	db, err := outboxsqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	tb := outboxdriver.Table{Schema: outboxsqlite.Schema, Name: "outbox"}
	if _, err := outboxsqlite.New(db).Migrate(ctx, tb, &outboxdriver.MigrateOptions{Partitions: n}); err != nil {
		t.Fatal(err)
	}
	return db, path, tb
}

func source(t testing.TB, db *sql.DB, tb outboxdriver.Table, name string) outboxdriver.Source {
	t.Helper()
	s, err := outboxsqlite.New(db).NewSource(tb, &outboxdriver.SourceConfig{RelayName: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func ev(agg string, n int) outbox.Event {
	return outbox.Event{AggregateType: "order", AggregateID: agg, Type: "Placed", Payload: []byte(fmt.Sprintf(`{"n":%d}`, n))}
}

// TestOpenSettings: every connection of the pool runs in WAL mode with
// the busy timeout, foreign keys, synchronous=FULL; bad paths get a clear
// one-line error and create nothing.
func TestOpenSettings(t *testing.T) {
	ctx := testContext(t)
	dir := t.TempDir()
	db, err := outboxsqlite.Open(ctx, filepath.Join(dir, "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var conns []*sql.Conn
	for range 3 { // several connections: the settings are per connection
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for i, c := range conns {
		var mode string
		var busy, fk, sync int
		if err := c.QueryRowContext(ctx, `SELECT (SELECT journal_mode FROM pragma_journal_mode), (SELECT timeout FROM pragma_busy_timeout),
			(SELECT foreign_keys FROM pragma_foreign_keys), (SELECT synchronous FROM pragma_synchronous)`).Scan(&mode, &busy, &fk, &sync); err != nil {
			t.Fatal(err)
		}
		if mode != "wal" || busy != outboxsqlite.BusyTimeoutMS || fk != 1 || sync != 2 {
			t.Fatalf("connection %d: journal_mode %s, busy_timeout %d, foreign_keys %d, synchronous %d; want wal, %d, 1, 2 (FULL)",
				i, mode, busy, fk, sync, outboxsqlite.BusyTimeoutMS)
		}
		c.Close()
	}
	for _, c := range []struct{ path, want string }{
		{filepath.Join(dir, "missing", "x.db"), "does not exist"},
		{"", "database file"},
		{":memory:", "database file"},
	} {
		_, err := outboxsqlite.Open(ctx, c.path)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("Open(%q) = %v; want a one-line error containing %q", c.path, err, c.want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open created the missing directory: %v", err)
	}
}

// TestSchemaNames: with no schema configured, the writer uses "main"; a
// configuration carrying PostgreSQL's "public" gets an error that names
// the fix; "temp" is refused (a temp table is private to one connection);
// an unknown schema is named in the error.
func TestSchemaNames(t *testing.T) {
	db, _, _ := migrated(t, 4)
	ctx := testContext(t)
	ob, err := outbox.New(outboxsqlite.New(db), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := ob.Table(); got.Schema != outboxsqlite.Schema || got.Name != "outbox" {
		t.Fatalf("outbox.New(outboxsqlite.New(db), nil) writes %v; want main.outbox", got)
	}
	if err := func() error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		return ob.WriteTx(ctx, tx, ev("a", 0))
	}(); err != nil {
		t.Fatalf("WriteTx into main.outbox: %v", err)
	}
	pg, err := outbox.New(outboxsqlite.New(db), &outbox.Config{Schema: "public"})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = pg.WriteTx(ctx, tx, ev("a", 0))
	tx.Rollback()
	if err == nil || !strings.Contains(err.Error(), "outboxsqlite.Schema") {
		t.Fatalf("WriteTx with schema public = %v; want an error naming outboxsqlite.Schema", err)
	}
	temp := outboxdriver.Table{Schema: "temp", Name: "outbox"}
	if _, err := outboxsqlite.New(db).Migrate(ctx, temp, nil); err == nil || !strings.Contains(err.Error(), "private to one connection") {
		t.Fatalf("Migrate into temp = %v; want it refused", err)
	}
	if _, err := outboxsqlite.New(db).NewSource(temp, nil); err == nil {
		t.Fatal("NewSource on temp accepted")
	}
	if _, err := outboxsqlite.New(db).Status(ctx, outboxdriver.Table{Schema: "elsewhere", Name: "outbox"}); err == nil || !strings.Contains(err.Error(), `no database named "elsewhere"`) {
		t.Fatalf("Status of an unattached schema = %v", err)
	}
	// An empty schema means main.
	if st, err := outboxsqlite.New(db).Status(ctx, outboxdriver.Table{}); err != nil || st.Table.Schema != "main" || len(st.Partitions) != 4 {
		t.Fatalf("Status of the default table = %+v, %v; want main.outbox with 4 partitions", st, err)
	}
}

// TestPublishingHoldsNoLock: between Claim and Finish the relay holds no
// lock. A writer whose connection will not wait at all (busy_timeout 0)
// commits while a batch is claimed and unfinished; with a write
// transaction held open across the publish, it would fail with
// SQLITE_BUSY at once.
func TestPublishingHoldsNoLock(t *testing.T) {
	db, path, tb := migrated(t, 4)
	ctx := testContext(t)
	if err := write(ctx, db, tb, true, ev("a", 0), ev("b", 0)); err != nil {
		t.Fatal(err)
	}
	src := source(t, db, tb, "relay-1")
	if _, n, err := src.Heartbeat(ctx, time.Minute); err != nil || n != 4 {
		t.Fatalf("heartbeat: %d partitions, %v", n, err)
	}
	leases, err := src.Acquire(ctx, 4, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	b, err := src.Claim(ctx, leases, 10)
	if err != nil || len(b.Records()) != 2 {
		t.Fatalf("claim: %v, %v", b, err)
	}
	impatient, err := sql.Open("sqlite", "file:"+path+"?_busy_timeout=0&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer impatient.Close()
	late := ev("c", 0)
	if err := write(ctx, impatient, tb, true, late); err != nil {
		t.Fatalf("a writer that never waits, while a batch is being published: %v; the claim must not hold the write lock", err)
	}
	if err := b.Finish(ctx, outboxdriver.Outcome{Published: []string{b.Records()[0].ID, b.Records()[1].ID}}); err != nil {
		t.Fatal(err)
	}
	b2, err := src.Claim(ctx, leases, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Release(ctx)
	if len(b2.Records()) != 1 || b2.Records()[0].AggregateID != "c" {
		t.Fatalf("after finishing the first batch: %d records; want the late event c/0", len(b2.Records()))
	}
}

// TestTwoSourcesInOneProcess: leases are exclusive between Sources of one
// process; a Source whose lease expired and was taken over (with a higher
// epoch) cannot record its batch (the fence); the new owner does not claim
// the partitions of that stale batch while it is in flight, and claims
// and publishes its events once the stale batch was refused.
func TestTwoSourcesInOneProcess(t *testing.T) {
	db, _, tb := migrated(t, 4)
	ctx := testContext(t)
	var events []outbox.Event
	for n := range 40 {
		events = append(events, ev(fmt.Sprint("agg-", n%8), n/8))
	}
	if err := write(ctx, db, tb, true, events...); err != nil {
		t.Fatal(err)
	}
	a, b := source(t, db, tb, "relay-a"), source(t, db, tb, "relay-b")
	// a's leases run 400ms, but its claims (which last one heartbeat TTL)
	// a minute: a stale batch outlives the lease it was claimed under.
	const ttl = 400 * time.Millisecond
	for _, s := range []outboxdriver.Source{a, b} {
		if relays, _, err := s.Heartbeat(ctx, time.Minute); err != nil || relays < 1 {
			t.Fatalf("heartbeat: %d, %v", relays, err)
		}
	}
	la, err := a.Acquire(ctx, 2, ttl)
	if err != nil || len(la) != 2 {
		t.Fatalf("a acquired %v, %v; want 2", la, err)
	}
	lb, err := b.Acquire(ctx, 4, time.Minute)
	if err != nil || len(lb) != 2 {
		t.Fatalf("b acquired %v, %v; want the 2 left", lb, err)
	}
	for _, x := range la {
		for _, y := range lb {
			if x.Partition == y.Partition {
				t.Fatalf("partition %d leased to both a and b", x.Partition)
			}
		}
	}
	// a claims; its partitions are marked until it finishes.
	ba, err := a.Claim(ctx, la, 100)
	if err != nil || len(ba.Records()) == 0 {
		t.Fatalf("a's claim: %v, %v", ba, err)
	}
	// b steals nothing while a's leases run; then a stops renewing. Once
	// its leases expire, b takes them over with higher epochs.
	var taken []outboxdriver.Lease
	await.Eventually(t, 30*time.Second, func() error {
		got, err := b.Acquire(ctx, 2-len(taken), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if taken = append(taken, got...); len(taken) < 2 {
			return fmt.Errorf("b took over %v of a's partitions", taken)
		}
		return nil
	})
	for _, l := range taken {
		for _, old := range la {
			if l.Partition == old.Partition && l.Epoch <= old.Epoch {
				t.Fatalf("take-over of partition %d at epoch %d, not above a's %d", l.Partition, l.Epoch, old.Epoch)
			}
		}
	}
	// The new owner does not claim what a's batch still holds.
	inA := map[string]bool{}
	for _, r := range ba.Records() {
		inA[r.ID] = true
	}
	stale, err := b.Claim(ctx, taken, 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range stale.Records() {
		if inA[r.ID] {
			t.Fatalf("b claimed %s/%s while a's batch (claimed under the old lease) still holds it", r.AggregateID, r.ID)
		}
	}
	stale.Release(ctx)
	if err := ba.Finish(ctx, outboxdriver.Outcome{Published: slices.Collect(func(yield func(string) bool) {
		for id := range inA {
			if !yield(id) {
				return
			}
		}
	})}); !errors.Is(err, outboxdriver.ErrLeaseLost) {
		t.Fatalf("a finished a batch under leases taken over: %v; want ErrLeaseLost", err)
	}
	all := slices.Concat(lb, taken)
	got := map[string]bool{}
	await.Eventually(t, 30*time.Second, func() error {
		bb, err := b.Claim(ctx, all, 100)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, r := range bb.Records() {
			got[r.ID] = true
			ids = append(ids, r.ID)
		}
		if err := bb.Finish(ctx, outboxdriver.Outcome{Published: ids}); err != nil {
			t.Fatal(err)
		}
		if len(got) < len(events) {
			return fmt.Errorf("b published %d of %d events", len(got), len(events))
		}
		return nil
	})
	for id := range inA {
		if !got[id] {
			t.Fatalf("event %s of a's refused batch was never published by b", id)
		}
	}
}

// TestWaitWakesOnCommit: a waiting Source returns when another connection
// (here another pool, as another process would) commits, long before its
// poll interval.
func TestWaitWakesOnCommit(t *testing.T) {
	db, path, tb := migrated(t, 4)
	ctx := testContext(t)
	src := source(t, db, tb, "relay-w")
	if _, _, err := src.Heartbeat(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	leases, err := src.Acquire(ctx, 4, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	other, err := outboxsqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	for round := range 3 {
		b, err := src.Claim(ctx, leases, 10) // nothing: the relay goes idle
		if err != nil || len(b.Records()) != 0 {
			t.Fatalf("round %d: claim of an empty outbox: %v, %v", round, b.Records(), err)
		}
		done := make(chan error, 1)
		go func() { done <- src.Wait(ctx, time.Hour) }()
		if err := write(ctx, other, tb, true, ev("w", round)); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("round %d: Wait: %v", round, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: Wait(1h) did not return 30s after a commit", round)
		}
		b, err = src.Claim(ctx, leases, 10)
		if err != nil || len(b.Records()) != 1 {
			t.Fatalf("round %d: claim after the wake-up: %v, %v", round, b, err)
		}
		if err := b.Finish(ctx, outboxdriver.Outcome{Published: []string{b.Records()[0].ID}}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestConcurrentWritersAndRelayLoseNothing: writers in goroutines read
// and then write (the pattern that fails with SQLITE_BUSY on an upgrade
// from a read lock) in transactions with a business row and 1-3 events,
// some rolled back, while two relay loops (two Sources, half the
// partitions each) claim, fail some events for a quick retry, and publish
// the rest. No writer fails; every committed event is published and, per
// aggregate, first in commit order; nothing rolled back is ever seen.
func TestConcurrentWritersAndRelayLoseNothing(t *testing.T) {
	db, _, tb := migrated(t, 8)
	ctx := testContext(t)
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id INTEGER PRIMARY KEY, agg TEXT NOT NULL, n INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(outboxsqlite.New(db), &outbox.Config{Schema: tb.Schema, Table: tb.Name})
	if err != nil {
		t.Fatal(err)
	}
	const (
		writers = 4
		txs     = 40 // per writer
		aggs    = 4  // per writer: an aggregate belongs to one writer, so its commit order is known
	)
	type written struct {
		ids        map[string][]string // committed event ids per aggregate, in commit order
		rolledBack map[string]bool
	}
	results := make([]written, writers)
	var wg sync.WaitGroup
	writeErrs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			res := written{ids: map[string][]string{}, rolledBack: map[string]bool{}}
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			next := map[string]int{}
			for range txs {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					writeErrs <- err
					return
				}
				var count int
				if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&count); err != nil {
					tx.Rollback()
					writeErrs <- fmt.Errorf("read in a write transaction: %w", err)
					return
				}
				var evs []outbox.Event
				for range 1 + rng.IntN(3) {
					agg := fmt.Sprintf("w%d-a%d", w, rng.IntN(aggs))
					e := ev(agg, next[agg])
					e.ID = fmt.Sprintf("0190a0d0-%04x-7000-8000-%012x", w, rng.Uint64()&0xffffffffffff)
					evs = append(evs, e)
					if _, err := tx.ExecContext(ctx, `INSERT INTO orders (agg, n) VALUES (?, ?)`, agg, next[agg]); err != nil {
						tx.Rollback()
						writeErrs <- err
						return
					}
				}
				if err := ob.WriteTx(ctx, tx, evs...); err != nil {
					tx.Rollback()
					writeErrs <- err
					return
				}
				if rng.IntN(10) == 0 {
					if err := tx.Rollback(); err != nil {
						writeErrs <- err
						return
					}
					for _, e := range evs {
						res.rolledBack[e.ID] = true
					}
					continue
				}
				if err := tx.Commit(); err != nil {
					writeErrs <- fmt.Errorf("commit: %w", err)
					return
				}
				for _, e := range evs {
					res.ids[e.AggregateID] = append(res.ids[e.AggregateID], e.ID)
					next[e.AggregateID]++
				}
			}
			results[w] = res
		})
	}

	var (
		mu        sync.Mutex
		published = map[string][]string{} // per aggregate, in publish order
		failures  int
	)
	stop := make(chan struct{})
	relayErrs := make(chan error, 2)
	var relays sync.WaitGroup
	for i := range 2 {
		src := source(t, db, tb, fmt.Sprint("relay-", i))
		relays.Go(func() {
			if _, _, err := src.Heartbeat(ctx, time.Minute); err != nil {
				relayErrs <- err
				return
			}
			leases, err := src.Acquire(ctx, 4, time.Minute)
			if err != nil || len(leases) != 4 {
				relayErrs <- fmt.Errorf("acquire: %v, %v", leases, err)
				return
			}
			rng := rand.New(rand.NewPCG(uint64(i), 11))
			for {
				b, err := src.Claim(ctx, leases, 25)
				if err != nil {
					relayErrs <- err
					return
				}
				recs := b.Records()
				if len(recs) == 0 {
					select {
					case <-stop:
						return
					default:
					}
					if err := src.Wait(ctx, 50*time.Millisecond); err != nil {
						relayErrs <- err
						return
					}
					continue
				}
				// Publish in order per aggregate; a failure stops the rest of
				// its aggregate in this batch, as the relay engine does.
				var out outboxdriver.Outcome
				failed := map[string]bool{}
				mu.Lock()
				for _, r := range recs {
					switch {
					case failed[r.AggregateID]:
					case rng.IntN(8) == 0:
						failed[r.AggregateID] = true
						failures++
						out.Failed = append(out.Failed, outboxdriver.Failure{ID: r.ID, Err: errors.New("broker busy"), RetryAfter: time.Duration(rng.IntN(20)) * time.Millisecond})
					default:
						published[r.AggregateID] = append(published[r.AggregateID], r.ID)
						out.Published = append(out.Published, r.ID)
					}
				}
				mu.Unlock()
				if err := b.Finish(ctx, out); err != nil {
					relayErrs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(writeErrs)
	for err := range writeErrs {
		t.Fatalf("a writer failed: %v (WAL, busy_timeout and BEGIN IMMEDIATE must make writers wait, never fail)", err)
	}
	await.Eventually(t, 90*time.Second, func() error {
		select {
		case err := <-relayErrs:
			t.Fatalf("relay: %v", err)
		default:
		}
		st, err := outboxsqlite.New(db).Status(ctx, tb)
		if err != nil {
			t.Fatal(err)
		}
		if st.Backlog != 0 {
			return fmt.Errorf("backlog still %d", st.Backlog)
		}
		return nil
	})
	close(stop)
	relays.Wait()
	close(relayErrs)
	for err := range relayErrs {
		t.Fatalf("relay: %v", err)
	}
	committed, business := 0, 0
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&business); err != nil {
		t.Fatal(err)
	}
	for _, res := range results {
		for agg, want := range res.ids {
			committed += len(want)
			if got := published[agg]; !slices.Equal(got, want) {
				t.Fatalf("aggregate %s: published %d events %v; want the %d committed, in commit order %v", agg, len(got), got, len(want), want)
			}
		}
		for agg, got := range published {
			for _, id := range got {
				if res.rolledBack[id] {
					t.Fatalf("aggregate %s: event %s of a rolled-back transaction was published", agg, id)
				}
			}
		}
	}
	if business != committed {
		t.Fatalf("%d business rows committed but %d events: a transaction committed one without the other", business, committed)
	}
	t.Logf("%d events committed by %d writers, all published in order by 2 sources; %d publish failures retried", committed, writers, failures)
}

// TestDeliverAtFormat writes a delayed event with a time in another zone
// and a fraction below the millisecond, next to an undelayed one in the
// same INSERT: deliver_at holds the time as UTC text in the format of the
// other time columns, rounded up (the event is never due before its
// time), and NULL for the undelayed one.
func TestDeliverAtFormat(t *testing.T) {
	db, _, tb := migrated(t, 1)
	ctx := testContext(t)
	delayed, now := ev("a", 0), ev("b", 0)
	delayed.DeliverAt = time.Date(2030, 1, 2, 3, 4, 5, 123000001, time.FixedZone("UTC+2", 2*3600))
	if err := write(ctx, db, tb, true, delayed, now); err != nil {
		t.Fatal(err)
	}
	got := testenv.NullStrings(t, ctx, db, `SELECT aggregateid, deliver_at FROM outbox`)
	if a := got["a"]; !a.Valid || a.String != "2030-01-02 01:04:05.124" {
		t.Errorf("deliver_at of the delayed event = %v; want 2030-01-02 01:04:05.124", a)
	}
	if b := got["b"]; b.Valid {
		t.Errorf("deliver_at of the undelayed event = %q; want NULL", b.String)
	}
}

// Status reads everything, the pauses in force included, in its one
// read-only transaction: on a pool of one connection it answers rather
// than wait for a second connection until its context ends.
func TestStatusOnAPoolOfOneConnection(t *testing.T) {
	db := openDB(t)
	db.SetMaxOpenConns(1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	drv := outboxsqlite.New(db)
	tb := outboxdriver.Table{Schema: outboxsqlite.Schema, Name: newTableName()}
	if _, err := drv.Migrate(ctx, tb, nil); err != nil {
		t.Fatal(err)
	}
	scope := outboxdriver.PauseScope{Kind: outboxdriver.PauseAggregateType, Value: "order"}
	if _, err := drv.SetPause(ctx, tb, scope, outboxdriver.Acting{Name: "ops", Role: "operator", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	st, err := drv.Status(ctx, tb)
	if err != nil {
		t.Fatalf("Status on a pool of one connection: %v", err)
	}
	if len(st.Pauses) != 1 || st.Pauses[0].PauseScope != scope {
		t.Fatalf("Status lists the pauses %+v; want the one set", st.Pauses)
	}
}
