package cdc_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxmysql"
	"github.com/outboxkit/outbox/outboxmysql/cdc"
)

// fixture is a migrated outbox table in a database of its own on the
// test MariaDB (row-based binary log: `bash .ci/test --setup-only`).
type fixture struct {
	t   *testing.T
	ctx context.Context
	db  *sql.DB
	tb  outboxdriver.Table
	dsn string
	ttl time.Duration // of the last acquire
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	admin := testenv.MySQL(t, "")
	name := testenv.MySQLDatabase(t, admin, "bl")
	f := &fixture{t: t, ctx: testenv.Context(t, 3*time.Minute), db: testenv.MySQL(t, name),
		tb: outboxdriver.Table{Schema: name, Name: "outbox"}, dsn: testenv.MySQLConfig(t, name).FormatDSN()}
	if _, err := outboxmysql.New(f.db).Migrate(f.ctx, f.tb, nil); err != nil {
		t.Fatal(err)
	}
	return f
}

type testLog struct{ t testing.TB }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// source opens a binlog source under relay name, closed at the end.
func (f *fixture) source(relay string, mode cdc.Mode, ret outboxdriver.Retention) *cdc.Source {
	f.t.Helper()
	src, err := cdc.NewSource(f.db, f.tb, &cdc.Config{DSN: f.dsn, Mode: mode, SaveInterval: 50 * time.Millisecond,
		SourceConfig: outboxdriver.SourceConfig{RelayName: relay, Retention: ret,
			Logger: slog.New(slog.NewTextHandler(testLog{f.t}, &slog.HandlerOptions{Level: slog.LevelInfo}))}})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { src.Close() })
	return src
}

func (f *fixture) acquire(src *cdc.Source, ttl time.Duration) []outboxdriver.Lease {
	f.t.Helper()
	_, n, err := src.Heartbeat(f.ctx, ttl)
	if err != nil {
		f.t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		leases, err := src.Acquire(f.ctx, n, ttl)
		if err != nil {
			f.t.Fatal(err)
		}
		if len(leases) > 0 {
			if len(leases) != n {
				f.t.Fatalf("acquire %d partitions = %v", n, leases)
			}
			for _, l := range leases {
				if l.Epoch != leases[0].Epoch {
					f.t.Fatalf("acquire = %v: the log's partitions under different epochs", leases)
				}
			}
			f.ttl = ttl
			return leases
		}
		if time.Now().After(deadline) {
			f.t.Fatal("the binlog lease was not free within a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// write commits (or rolls back) events in one transaction.
func (f *fixture) write(commit bool, events ...outbox.Event) {
	f.t.Helper()
	if err := testenv.WriteSQL(f.ctx, f.db, outboxmysql.New(f.db), f.tb, commit, events...); err != nil {
		f.t.Fatal(err)
	}
}

func ev(agg string, n int) outbox.Event {
	return outbox.Event{AggregateType: "order", AggregateID: agg, Type: "Step", Payload: fmt.Appendf(nil, `{"n": %d}`, n)}
}

// collect claims and publishes until want events arrived (or the
// deadline), stopping after stopAfter events when it is > 0 (the batches
// of those finished), and returns the records in publishing order.
func (f *fixture) collect(src *cdc.Source, leases []outboxdriver.Lease, want int) []outboxdriver.Record {
	f.t.Helper()
	var got []outboxdriver.Record
	deadline := time.Now().Add(90 * time.Second)
	renewed := time.Now()
	for len(got) < want {
		if time.Since(renewed) > 500*time.Millisecond {
			// As the relay engine does, well within the TTL.
			if _, err := src.Renew(f.ctx, leases, f.ttl); err != nil {
				f.t.Fatal(err)
			}
			renewed = time.Now()
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%d of %d events within 90s", len(got), want)
		}
		b, err := src.Claim(f.ctx, leases, min(50, want-len(got)))
		if err != nil {
			f.t.Logf("claim: %v", err)
			_ = src.Wait(f.ctx, 100*time.Millisecond)
			continue
		}
		recs := b.Records()
		if len(recs) == 0 {
			b.Release(f.ctx)
			_ = src.Wait(f.ctx, 200*time.Millisecond)
			continue
		}
		ids := make([]string, len(recs))
		for i, r := range recs {
			ids[i] = r.ID
		}
		if err := b.Finish(f.ctx, outboxdriver.Outcome{Published: ids}); err != nil {
			f.t.Fatal(err)
		}
		got = append(got, recs...)
	}
	return got
}

// streaming makes sure src streams the log: it writes an event and
// collects it.
func (f *fixture) streaming(src *cdc.Source, leases []outboxdriver.Lease) {
	f.t.Helper()
	f.write(true, ev("warm-up", 0))
	f.collect(src, leases, 1)
}

// checkOrder checks every aggregate's events arrived in write order
// (payload n ascending) and returns the ids seen.
func checkOrder(t *testing.T, recs []outboxdriver.Record) map[string]int {
	t.Helper()
	last := map[string]int{}
	seen := map[string]int{}
	for _, r := range recs {
		var n int
		if _, err := fmt.Sscanf(string(r.Payload), `{"n": %d}`, &n); err != nil {
			t.Fatalf("payload %q: %v", r.Payload, err)
		}
		if prev, ok := last[r.AggregateID]; ok && n <= prev && seen[r.ID] == 0 {
			t.Fatalf("aggregate %s: event %d after %d", r.AggregateID, n, prev)
		}
		last[r.AggregateID] = n
		seen[r.ID]++
	}
	return seen
}

// TestBinlogDrainInOrder: events written before the relay started (read
// from the table) and after (read from the log) arrive once each, every
// aggregate in order, with their fields; the rows are marked published.
func TestBinlogDrainInOrder(t *testing.T) {
	f := newFixture(t)
	for i := range 20 {
		f.write(true, ev(fmt.Sprint("a", i%4), i))
	}
	src := f.source("r1", cdc.ModeTable, outboxdriver.RetentionKeep)
	leases := f.acquire(src, 10*time.Second)
	got := f.collect(src, leases, 20) // from the table
	for i := 20; i < 200; i += 4 {
		f.write(true, ev(fmt.Sprint("a", i%4), i), ev(fmt.Sprint("a", (i+1)%4), i+1), ev(fmt.Sprint("a", (i+2)%4), i+2), ev(fmt.Sprint("a", (i+3)%4), i+3))
	}
	got = append(got, f.collect(src, leases, 180)...) // from the log
	seen := checkOrder(t, got)
	if len(seen) != 200 {
		t.Fatalf("%d distinct events, want 200", len(seen))
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("event %s published %d times", id, n)
		}
	}
	r := got[len(got)-1]
	if r.AggregateType != "order" || r.Type != "Step" || r.Seq == 0 || r.CreatedAt.IsZero() || r.HeadersErr != nil {
		t.Errorf("record fields: %+v", r)
	}
	var unpublished int
	if err := f.db.QueryRowContext(f.ctx, "SELECT COUNT(*) FROM outbox WHERE published_at IS NULL").Scan(&unpublished); err != nil || unpublished != 0 {
		t.Fatalf("%d rows not marked published (%v)", unpublished, err)
	}
}

// TestBinlogRollbackNeverPublished: a rolled-back transaction's events
// never come; the committed ones around it do.
func TestBinlogRollbackNeverPublished(t *testing.T) {
	f := newFixture(t)
	src := f.source("r1", cdc.ModeTable, outboxdriver.RetentionDelete)
	leases := f.acquire(src, 10*time.Second)
	f.write(true, ev("x", 1))
	f.write(false, ev("x", 2), ev("y", 2))
	f.write(true, ev("x", 3))
	got := f.collect(src, leases, 2)
	for _, r := range got {
		if strings.Contains(string(r.Payload), "2") {
			t.Fatalf("a rolled-back event was published: %s", r.Payload)
		}
	}
	// Nothing else comes.
	b, err := src.Claim(f.ctx, leases, 10)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(b.Records()); n != 0 {
		t.Fatalf("%d more events after the committed ones", n)
	}
	b.Release(f.ctx)
	var left int
	if err := f.db.QueryRowContext(f.ctx, "SELECT COUNT(*) FROM outbox").Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d rows left with retention delete (%v)", left, err)
	}
}

// TestBinlogResumeAfterCrash: a relay that stops without giving its lease
// up (as after SIGKILL) leaves the position of its last finished batch;
// the next relay takes over once the lease expired and publishes the
// rest: nothing lost, and nothing recorded as published before comes
// again (the rows of replayed transactions are checked).
func TestBinlogResumeAfterCrash(t *testing.T) {
	f := newFixture(t)
	a := f.source("a", cdc.ModeTable, outboxdriver.RetentionKeep)
	leases := f.acquire(a, 2*time.Second)
	for i := range 60 {
		f.write(true, ev(fmt.Sprint("c", i%3), i))
	}
	first := f.collect(a, leases, 30)
	a.Close() // no Release: the lease stays until it expires
	for i := 60; i < 90; i++ {
		f.write(true, ev(fmt.Sprint("c", i%3), i))
	}
	b := f.source("b", cdc.ModeTable, outboxdriver.RetentionKeep)
	leases = f.acquire(b, 10*time.Second)
	if leases[0].Epoch < 2 {
		t.Fatalf("the second relay's epoch %d, want it above the first's", leases[0].Epoch)
	}
	var unpublished int
	if err := f.db.QueryRowContext(f.ctx, "SELECT COUNT(*) FROM outbox WHERE published_at IS NULL").Scan(&unpublished); err != nil {
		t.Fatal(err)
	}
	rest := f.collect(b, leases, unpublished)
	published := map[string]bool{}
	for _, r := range first {
		published[r.ID] = true
	}
	for _, r := range rest {
		if published[r.ID] {
			t.Errorf("event %s, published and recorded before the crash, was published again", r.ID)
		}
	}
	all := map[string]bool{}
	for _, r := range append(first, rest...) {
		all[r.ID] = true
	}
	if len(all) != 90 {
		t.Fatalf("%d distinct events after the take-over, want 90", len(all))
	}
	checkOrder(t, rest)
	if err := f.db.QueryRowContext(f.ctx, "SELECT COUNT(*) FROM outbox WHERE published_at IS NULL").Scan(&unpublished); err != nil || unpublished != 0 {
		t.Fatalf("%d rows unpublished at the end (%v)", unpublished, err)
	}
	var file sql.NullString
	if err := f.db.QueryRowContext(f.ctx, "SELECT file FROM outbox_binlog WHERE name = 'default'").Scan(&file); err != nil || !file.Valid {
		t.Fatalf("no saved position (%v)", err)
	}
}

// TestBinlogStaleStreamerFenced: a relay whose lease expired and was
// taken records nothing: its Finish fails with ErrLeaseLost, and the new
// owner publishes the events.
func TestBinlogStaleStreamerFenced(t *testing.T) {
	f := newFixture(t)
	a := f.source("a", cdc.ModeTable, outboxdriver.RetentionKeep)
	leasesA := f.acquire(a, 3*time.Second)
	f.write(true, ev("s", 1), ev("t", 2)) // two aggregates: both in one batch
	var batch outboxdriver.Batch
	deadline := time.Now().Add(time.Minute)
	for batch == nil {
		if _, err := a.Renew(f.ctx, leasesA, 3*time.Second); err != nil {
			t.Fatal(err)
		}
		b, err := a.Claim(f.ctx, leasesA, 10)
		if err == nil && len(b.Records()) == 2 {
			batch = b
			break
		}
		if err == nil {
			b.Release(f.ctx)
		}
		if time.Now().After(deadline) {
			t.Fatal("the events were not claimable within a minute")
		}
		_ = a.Wait(f.ctx, 100*time.Millisecond)
	}
	// a stops renewing: its lease expires and b takes it.
	b := f.source("b", cdc.ModeTable, outboxdriver.RetentionKeep)
	leasesB := f.acquire(b, 30*time.Second) // after a's lease expired
	ids := []string{batch.Records()[0].ID, batch.Records()[1].ID}
	if err := batch.Finish(f.ctx, outboxdriver.Outcome{Published: ids}); !errors.Is(err, outboxdriver.ErrLeaseLost) {
		t.Fatalf("stale Finish: %v, want ErrLeaseLost", err)
	}
	var unpublished int
	if err := f.db.QueryRowContext(f.ctx, "SELECT COUNT(*) FROM outbox WHERE published_at IS NULL").Scan(&unpublished); err != nil || unpublished != 2 {
		t.Fatalf("%d rows unpublished after the stale Finish, want 2 (%v)", unpublished, err)
	}
	if got := f.collect(b, leasesB, 2); got[0].ID != ids[0] || got[1].ID != ids[1] {
		t.Fatalf("the new owner published %v, want %v", got, ids)
	}
}

// TestBinlogInsertDeleteMode: rows deleted again in their transaction
// (the table stays empty) are published from the log.
func TestBinlogInsertDeleteMode(t *testing.T) {
	f := newFixture(t)
	src := f.source("r1", cdc.ModeInsertDelete, outboxdriver.RetentionDelete)
	if err := src.Setup(f.ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		tx, err := f.db.BeginTx(f.ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
		if _, err := tx.ExecContext(f.ctx, "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (?, 'order', 'd', 'Step', ?)", id, fmt.Sprintf(`{"n": %d}`, i)); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(f.ctx, "DELETE FROM outbox WHERE id = ?", id); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	leases := f.acquire(src, 10*time.Second)
	got := f.collect(src, leases, 10)
	checkOrder(t, got)
	if got[9].ID != "00000000-0000-4000-8000-000000000009" {
		t.Fatalf("last event %s", got[9].ID)
	}
}

// TestBinlogPositionLost: a saved position no longer on the server is
// reported; in table mode the rows still in the table are relayed and
// the stream starts again; in insert-delete mode claims fail, naming it.
func TestBinlogPositionLost(t *testing.T) {
	f := newFixture(t)
	f.write(true, ev("p", 1), ev("p", 2))
	if _, err := f.db.ExecContext(f.ctx, "INSERT INTO outbox_binlog (name, file, pos) VALUES ('default', 'mysql-bin.000000', 4), ('strict', 'mysql-bin.000000', 4)"); err != nil {
		t.Fatal(err)
	}
	src := f.source("r1", cdc.ModeTable, outboxdriver.RetentionKeep)
	leases := f.acquire(src, 10*time.Second)
	got := f.collect(src, leases, 2)
	f.write(true, ev("p", 3))
	got = append(got, f.collect(src, leases, 1)...)
	checkOrder(t, got)

	strict, err := cdc.NewSource(f.db, f.tb, &cdc.Config{DSN: f.dsn, Name: "strict", Mode: cdc.ModeInsertDelete,
		SourceConfig: outboxdriver.SourceConfig{RelayName: "r2", Logger: slog.New(slog.NewTextHandler(testLog{t}, nil))}})
	if err != nil {
		t.Fatal(err)
	}
	defer strict.Close()
	leases = f.acquire(strict, 10*time.Second)
	deadline := time.Now().Add(time.Minute)
	for {
		b, err := strict.Claim(f.ctx, leases, 10)
		if err != nil {
			if !strings.Contains(err.Error(), "no longer on the server") || !strings.Contains(err.Error(), "mysql-bin.000000") {
				t.Fatalf("claim with a lost position: %v", err)
			}
			return
		}
		b.Release(f.ctx)
		if time.Now().After(deadline) {
			t.Fatal("no error within a minute for a lost position in insert-delete mode")
		}
		_ = strict.Wait(f.ctx, 100*time.Millisecond)
	}
}

// TestBinlogLateCommitComesAfter: a transaction that began first and
// committed last comes after the one that committed before it, also for
// the same aggregate.
func TestBinlogLateCommitComesAfter(t *testing.T) {
	f := newFixture(t)
	src := f.source("r1", cdc.ModeTable, outboxdriver.RetentionDelete)
	leases := f.acquire(src, 10*time.Second)
	f.streaming(src, leases)
	early, err := f.db.BeginTx(f.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer early.Rollback()
	if _, err := early.ExecContext(f.ctx, "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('00000000-0000-4000-8000-0000000000e1', 'order', 'late', 'Step', '{\"n\": 2}')"); err != nil {
		t.Fatal(err)
	}
	first := ev("late", 1)
	first.ID = "00000000-0000-4000-8000-0000000000f1"
	f.write(true, first)
	if err := early.Commit(); err != nil {
		t.Fatal(err)
	}
	got := f.collect(src, leases, 2)
	if got[0].ID != first.ID || got[1].ID != "00000000-0000-4000-8000-0000000000e1" {
		t.Fatalf("order %s, %s: want the transaction committed first first", got[0].ID, got[1].ID)
	}
}

// TestBinlogLanes: claims under disjoint sets of the lease's partitions
// (the relay's lanes) hand out disjoint aggregates, in parallel.
func TestBinlogLanes(t *testing.T) {
	f := newFixture(t)
	src := f.source("r1", cdc.ModeTable, outboxdriver.RetentionDelete)
	leases := f.acquire(src, 10*time.Second)
	f.streaming(src, leases)
	for i := range 40 {
		f.write(true, ev(fmt.Sprint("l", i), 1))
	}
	var even, odd []outboxdriver.Lease
	for _, l := range leases {
		if l.Partition%2 == 0 {
			even = append(even, l)
		} else {
			odd = append(odd, l)
		}
	}
	deadline := time.Now().Add(time.Minute)
	seen := map[string]bool{}
	for len(seen) < 40 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 40 events within a minute", len(seen))
		}
		a, err := src.Claim(f.ctx, even, 100)
		if err != nil {
			t.Fatal(err)
		}
		b, err := src.Claim(f.ctx, odd, 100) // while a is in flight
		if err != nil {
			t.Fatal(err)
		}
		for _, batch := range []outboxdriver.Batch{a, b} {
			var ids []string
			for _, r := range batch.Records() {
				if (r.Partition%2 == 0) != (batch == a) {
					t.Fatalf("event of partition %d in the wrong lane", r.Partition)
				}
				if seen[r.ID] {
					t.Fatalf("event %s in two batches", r.ID)
				}
				seen[r.ID] = true
				ids = append(ids, r.ID)
			}
			if err := batch.Finish(f.ctx, outboxdriver.Outcome{Published: ids}); err != nil {
				t.Fatal(err)
			}
		}
		_ = src.Wait(f.ctx, 50*time.Millisecond)
	}
}

// claimN claims until a batch of n events comes (renewing the lease).
func (f *fixture) claimN(src *cdc.Source, leases []outboxdriver.Lease, n int) outboxdriver.Batch {
	f.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := src.Renew(f.ctx, leases, f.ttl); err != nil {
			f.t.Fatal(err)
		}
		b, err := src.Claim(f.ctx, leases, 100)
		if err != nil {
			f.t.Fatal(err)
		}
		if len(b.Records()) == n {
			return b
		}
		if len(b.Records()) > n {
			f.t.Fatalf("claimed %d events, want %d", len(b.Records()), n)
		}
		b.Release(f.ctx)
		if time.Now().After(deadline) {
			f.t.Fatalf("no batch of %d events within a minute", n)
		}
		_ = src.Wait(f.ctx, 50*time.Millisecond)
	}
}

// TestBinlogRetryAndDeadLetter: a retried event comes again after its
// delay, its aggregate's later event behind it; a dead letter under the
// hold policy goes to the dead-letter table, holds its aggregate, and an
// operator's discard (the held row removed) releases it at the next
// heartbeat.
func TestBinlogRetryAndDeadLetter(t *testing.T) {
	f := newFixture(t)
	src := f.source("r1", cdc.ModeTable, outboxdriver.RetentionDelete)
	leases := f.acquire(src, 10*time.Second)
	f.streaming(src, leases)
	f.write(true, ev("h", 1), ev("h", 2))
	b := f.claimN(src, leases, 1)
	first := b.Records()[0]
	if err := b.Finish(f.ctx, outboxdriver.Outcome{Failed: []outboxdriver.Failure{{ID: first.ID, Err: errors.New("broker said no"), RetryAfter: 200 * time.Millisecond}}}); err != nil {
		t.Fatal(err)
	}
	b = f.claimN(src, leases, 1)
	if again := b.Records()[0]; again.ID != first.ID || again.Attempts != 1 {
		t.Fatalf("after a retry came %s (attempts %d), want %s again with 1 attempt", again.ID, again.Attempts, first.ID)
	}
	if err := b.Finish(f.ctx, outboxdriver.Outcome{Failed: []outboxdriver.Failure{{ID: first.ID, Err: errors.New("poison"), DeadLetter: true, Hold: true}}}); err != nil {
		t.Fatal(err)
	}
	var lastErr string
	var held bool
	if err := f.db.QueryRowContext(f.ctx, "SELECT last_error, held FROM outbox_dead_letter WHERE id = ?", first.ID).Scan(&lastErr, &held); err != nil || lastErr != "poison" || !held {
		t.Fatalf("dead letter: %q held %v (%v)", lastErr, held, err)
	}
	var rows int
	if err := f.db.QueryRowContext(f.ctx, "SELECT COUNT(*) FROM outbox WHERE id = ?", first.ID).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("the dead letter's row is still in the table (%d, %v)", rows, err)
	}
	// Held: the aggregate's second event waits.
	nb, err := src.Claim(f.ctx, leases, 100)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(nb.Records()); n != 0 {
		t.Fatalf("%d events of a held aggregate claimed", n)
	}
	nb.Release(f.ctx)
	if _, err := f.db.ExecContext(f.ctx, "DELETE FROM outbox_held WHERE event_id = ?", first.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := src.Heartbeat(f.ctx, f.ttl); err != nil {
		t.Fatal(err)
	}
	if got := f.collect(src, leases, 1); !strings.Contains(string(got[0].Payload), "2") {
		t.Fatalf("after the discard came %s, want the aggregate's second event", got[0].Payload)
	}
}
