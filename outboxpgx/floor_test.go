package outboxpgx

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
)

// floorRig is a migrated table and a source holding all its partitions.
type floorRig struct {
	t      *testing.T
	pool   *pgxpool.Pool
	table  outboxdriver.Table
	src    *source
	leases []outboxdriver.Lease
}

func newFloorRig(t *testing.T) *floorRig {
	t.Helper()
	ctx := context.Background()
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	// With the notify trigger: the rig's plain-SQL inserts wake the
	// listener.
	if _, err := New(pool).Migrate(ctx, tb, &outboxdriver.MigrateOptions{Wakeups: outboxdriver.WakeupsTrigger}); err != nil {
		t.Fatal(err)
	}
	s0, err := New(pool).NewSource(tb, nil)
	if err != nil {
		t.Fatal(err)
	}
	src := s0.(*source)
	t.Cleanup(func() { src.Close() })
	if _, _, err := src.Heartbeat(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	leases, err := src.Acquire(ctx, 1000, time.Minute)
	if err != nil || len(leases) == 0 {
		t.Fatalf("acquire: %d leases, %v", len(leases), err)
	}
	return &floorRig{t: t, pool: pool, table: tb, src: src, leases: leases}
}

// insert commits one event per call (on db: the pool, or an open
// transaction) and returns its seq.
func (r *floorRig) insert(db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, agg string) int64 {
	r.t.Helper()
	var seq int64
	err := db.QueryRow(context.Background(), `INSERT INTO `+r.table.Qualified("")+` (id, aggregatetype, aggregateid, type, payload)
VALUES (gen_random_uuid(), 'order', $1, 'Placed', '{}') RETURNING seq`, agg).Scan(&seq)
	if err != nil {
		r.t.Fatal(err)
	}
	return seq
}

// relay claims and finishes as published until a claim comes back empty,
// waits for the floor probe its claims started (they do not wait for it),
// and returns the seqs it saw.
func (r *floorRig) relay() []int64 {
	r.t.Helper()
	ctx := context.Background()
	var seen []int64
	for {
		b, err := r.src.Claim(ctx, r.leases, 100)
		if err != nil {
			r.t.Fatal(err)
		}
		recs := b.Records()
		if len(recs) == 0 {
			b.Release(ctx)
			r.src.floors.tick.Lock()
			//lint:ignore SA2001 a running probe holds the lock: taking it waits for the probe's end
			r.src.floors.tick.Unlock()
			return seen
		}
		var out outboxdriver.Outcome
		for _, rec := range recs {
			seen = append(seen, rec.Seq)
			out.Published = append(out.Published, rec.ID)
		}
		if err := b.Finish(ctx, out); err != nil {
			r.t.Fatal(err)
		}
	}
}

// settle relays until the floors have been probed several times, enough
// for them to rise as far as they may.
func (r *floorRig) settle() {
	r.t.Helper()
	if got := r.relayWhileProbing(); len(got) > 0 {
		r.t.Fatalf("claimed %v while settling: nothing was pending", got)
	}
}

// relayWhileProbing relays until the floors have been probed five times
// (or turned off), and returns every seq claimed.
func (r *floorRig) relayWhileProbing() []int64 {
	r.t.Helper()
	return r.relayUntilProbed(5)
}

// relayUntilProbed relays, again and again, until its claims have probed
// the floors n times or a probe turned them off, and returns every seq
// claimed. A claim probes when a floorTick has passed since the last
// probe, which it marks by moving the next one's time; it fails the test
// when that has not happened n times within 10s.
func (r *floorRig) relayUntilProbed(n int) []int64 {
	r.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var seen []int64
	for probes := 0; probes < n; {
		before, _ := r.probeState()
		seen = append(seen, r.relay()...)
		after, off := r.probeState()
		switch {
		case off:
			return seen // no more probes
		case !after.Equal(before):
			probes++
		case time.Now().After(deadline):
			r.t.Fatalf("the floors were probed %d times in 10s, want %d", probes, n)
		default:
			time.Sleep(floorTick / 10) // poll until the next probe is due
		}
	}
	return seen
}

// probeState returns when the floors' next probe is due, and whether they
// are off.
func (r *floorRig) probeState() (next time.Time, off bool) {
	f := &r.src.floors
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.next, f.disabled
}

func (r *floorRig) floor() int64 {
	f, _ := r.src.floors.below(r.leases)
	return f
}

// The claim does not wait for the floor probe it starts: with the probe
// blocked (a transaction holds the seq column's sequence, which the probe
// reads and the claim does not), a due probe starts and the claim still
// returns the pending event; Close ends the blocked probe.
func TestClaimDoesNotWaitForTheFloorProbe(t *testing.T) {
	t.Parallel()
	r := newFloorRig(t)
	ctx := context.Background()
	seq := r.insert(r.pool, "a")
	blocker, err := r.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx)
	var seqName string
	if err := r.pool.QueryRow(ctx, `SELECT pg_get_serial_sequence($1, 'seq')`, r.table.Qualified("")).Scan(&seqName); err != nil {
		t.Fatal(err)
	}
	if _, err := blocker.Exec(ctx, `ALTER SEQUENCE `+seqName+` INCREMENT BY 1`); err != nil {
		t.Fatal(err)
	}
	r.src.floors.mu.Lock()
	r.src.floors.next = time.Time{} // a probe is due
	r.src.floors.mu.Unlock()
	type claimed struct {
		b   outboxdriver.Batch
		err error
	}
	done := make(chan claimed, 1)
	go func() {
		b, err := r.src.Claim(ctx, r.leases, 10)
		done <- claimed{b, err}
	}()
	var c claimed
	select {
	case c = <-done:
	case <-time.After(10 * time.Second):
		blocker.Rollback(ctx) // lets the probe, and the claim behind it, go on
		t.Fatal("the claim waited 10s for a blocked floor probe")
	}
	if c.err != nil {
		t.Fatalf("claim while the probe is blocked: %v", c.err)
	}
	b := c.b
	if recs := b.Records(); len(recs) != 1 || recs[0].Seq != seq {
		t.Fatalf("claimed %v while the probe is blocked; want seq %d", recs, seq)
	}
	b.Release(ctx)
	if r.src.floors.tick.TryLock() {
		r.src.floors.tick.Unlock()
		t.Fatal("no floor probe is running: the claim did not start one, and the test proves nothing")
	}
	closed := make(chan struct{})
	go func() { r.src.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the blocked floor probe within 10s")
	}
}

// An unrelated transaction that holds the oldest snapshot (and so keeps
// every deleted row in the index) does not hold the floors back: claims
// start past the rows relayed meanwhile.
func TestFloorsRiseWhileAnUnrelatedTransactionStaysOpen(t *testing.T) {
	t.Parallel()
	r := newFloorRig(t)
	ctx := context.Background()
	long, err := r.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer long.Rollback(ctx)
	if _, err := long.Exec(ctx, `SELECT txid_current()`); err != nil {
		t.Fatal(err)
	}
	var last int64
	for i := range 50 {
		last = r.insert(r.pool, fmt.Sprint(i))
	}
	if got := r.relay(); len(got) != 50 {
		t.Fatalf("relayed %d of 50 events", len(got))
	}
	r.settle()
	if f := r.floor(); f <= last {
		t.Fatalf("floor %d after relaying every event up to seq %d: claims still read the relayed rows", f, last)
	}
	next := r.insert(r.pool, "after")
	if got := r.relay(); len(got) != 1 || got[0] != next {
		t.Fatalf("claimed %v after the floor rose; want [%d]", got, next)
	}
}

// A writer that took its seq before later writers committed, and commits
// after them (S3a), keeps the floors below its row until it ends: its
// event is claimed when it commits, not skipped.
func TestFloorWaitsForAWriterThatTookItsSeqEarlier(t *testing.T) {
	t.Parallel()
	r := newFloorRig(t)
	ctx := context.Background()
	slow, err := r.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Rollback(ctx)
	early := r.insert(slow, "slow")
	for i := range 20 {
		r.insert(r.pool, fmt.Sprint(i))
	}
	if got := r.relay(); len(got) != 20 {
		t.Fatalf("relayed %d of the 20 committed events", len(got))
	}
	r.settle()
	if f := r.floor(); f > early {
		t.Fatalf("floor %d passed seq %d of a writer still open", f, early)
	}
	if err := slow.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := r.relay(); len(got) != 1 || got[0] != early {
		t.Fatalf("claimed %v after the slow writer committed; want [%d]", got, early)
	}
	r.settle()
	if f := r.floor(); f <= early {
		t.Fatalf("floor %d stayed at or below seq %d after every writer ended", f, early)
	}
}

// A dead letter retried by an operator comes back with its old seq, below
// the floors; the retry's notification drops them, and the event is
// claimed again.
func TestRetriedDeadLetterBelowTheFloorIsClaimed(t *testing.T) {
	t.Parallel()
	r := newFloorRig(t)
	ctx := context.Background()
	if err := r.src.Wait(ctx, time.Minute); err != nil { // connects the listener
		t.Fatal(err)
	}
	poison := r.deadLetterBelowTheFloor()
	if err := r.src.Wait(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if f := r.floor(); f != 0 {
		t.Fatalf("floor %d after the retry's notification; want 0", f)
	}
	if got := r.relay(); len(got) != 1 || got[0] != poison {
		t.Fatalf("claimed %v after the retry; want the retried event's seq [%d]", got, poison)
	}
}

// A source that reads no notification (it is not listening: a pooler
// that cannot LISTEN, say) still claims a retried dead letter at once: the
// retry's audit row tells the claim to start from zero, and the next
// probe drops the floors.
func TestRetriedDeadLetterIsClaimedWithoutTheNotification(t *testing.T) {
	t.Parallel()
	r := newFloorRig(t)
	poison := r.deadLetterBelowTheFloor()
	if got := r.relay(); len(got) != 1 || got[0] != poison {
		t.Fatalf("claimed %v right after the retry, no notification read; want the retried event's seq [%d]", got, poison)
	}
	r.relayUntilProbed(1)
	if f := r.floor(); f != 0 {
		t.Fatalf("floor %d after a probe that followed the retry; want 0", f)
	}
}

// deadLetterBelowTheFloor dead-letters an event, relays ten more until
// the floors are past it, retries it, and returns its seq.
func (r *floorRig) deadLetterBelowTheFloor() int64 {
	r.t.Helper()
	ctx := context.Background()
	poison := r.insert(r.pool, "poison")
	b, err := r.src.Claim(ctx, r.leases, 10)
	if err != nil || len(b.Records()) != 1 {
		r.t.Fatalf("claim: %v", err)
	}
	id := b.Records()[0].ID
	if err := b.Finish(ctx, outboxdriver.Outcome{Failed: []outboxdriver.Failure{{ID: id, Err: errors.New("refused"), DeadLetter: true}}}); err != nil {
		r.t.Fatal(err)
	}
	for i := range 10 {
		r.insert(r.pool, fmt.Sprint(i))
	}
	r.relay()
	r.settle()
	if f := r.floor(); f <= poison {
		r.t.Fatalf("floor %d not past the dead letter's seq %d; the test proves nothing", f, poison)
	}
	moved, err := New(r.pool).RetryDeadLetters(ctx, r.table, nil, outboxdriver.Acting{Name: "test"})
	if err != nil || len(moved) != 1 {
		r.t.Fatalf("retry: %v, %v", moved, err)
	}
	return poison
}

// A table made again starts its seqs from 1, below the floors of a source
// that relayed the old one: they drop, and the new rows are claimed.
func TestFloorsDropWhenTheSequenceGoesBack(t *testing.T) {
	t.Parallel()
	r := newFloorRig(t)
	ctx := context.Background()
	for i := range 20 {
		r.insert(r.pool, fmt.Sprint(i))
	}
	r.relay()
	r.settle()
	if f := r.floor(); f <= 20 {
		t.Fatalf("floor %d did not rise past 20 relayed rows; the test proves nothing", f)
	}
	if _, err := r.pool.Exec(ctx, `ALTER TABLE `+r.table.Qualified("")+` ALTER COLUMN seq RESTART WITH 1`); err != nil {
		t.Fatal(err)
	}
	first := r.insert(r.pool, "again")
	if got := r.relayWhileProbing(); len(got) != 1 || got[0] != first {
		t.Fatalf("claimed %v after the sequence restarted; want [%d]", got, first)
	}
}

// A sequence that caches values makes no seq final when probed: floors
// stay off, and every claim starts from the table's first row.
func TestFloorsAreOffWhenTheSequenceCaches(t *testing.T) {
	t.Parallel()
	r := newFloorRig(t)
	ctx := context.Background()
	if _, err := r.pool.Exec(ctx, `ALTER TABLE `+r.table.Qualified("")+` ALTER COLUMN seq SET CACHE 20`); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		r.insert(r.pool, fmt.Sprint(i))
	}
	r.relay()
	r.settle()
	if f := r.floor(); f != 0 {
		t.Fatalf("floor %d with a caching sequence; want 0 (off)", f)
	}
}

// A relay whose role may not read the seq column's sequence has no floors
// (it says so once in its log) and relays every event all the same.
func TestFloorsAreOffWithoutPrivilegeOnTheSequence(t *testing.T) {
	t.Parallel()
	r := newFloorRig(t)
	ctx := context.Background()
	schema := outboxdriver.QuoteIdent(r.table.Schema)
	role, pool := testenv.PoolAs(t, r.pool, "outbox_relay_role",
		`GRANT USAGE ON SCHEMA `+schema+` TO %s`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA `+schema+` TO %s`)
	s0, err := New(pool).NewSource(r.table, &outboxdriver.SourceConfig{RelayName: role})
	if err != nil {
		t.Fatal(err)
	}
	src := s0.(*source)
	defer src.Close()
	r.src.Release(ctx, r.leases, true) // the rig's source steps aside
	if _, _, err := src.Heartbeat(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if r.leases, err = src.Acquire(ctx, 1000, time.Minute); err != nil || len(r.leases) == 0 {
		t.Fatalf("acquire as %s: %d leases, %v", role, len(r.leases), err)
	}
	r.src = src
	for i := range 20 {
		r.insert(r.pool, fmt.Sprint(i))
	}
	if got := r.relayWhileProbing(); len(got) != 20 {
		t.Fatalf("relayed %d of 20 events without floors", len(got))
	}
	if f, _ := src.floors.below(r.leases); !src.floors.disabled || f != 0 {
		t.Fatalf("floors disabled=%v at %d; want off at 0 for a role that may not read the sequence", src.floors.disabled, f)
	}
}
