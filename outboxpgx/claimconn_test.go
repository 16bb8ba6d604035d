package outboxpgx

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// listening connects the rig's listener and registers the relay idle, so
// that commits notify.
func (r *floorRig) listening() {
	r.t.Helper()
	ctx := context.Background()
	if err := r.src.Wait(ctx, time.Minute); err != nil { // connects the listener
		r.t.Fatal(err)
	}
	if err := r.src.SetIdle(ctx, time.Minute); err != nil {
		r.t.Fatal(err)
	}
}

// claimOne claims from leases and expects the batch to hold exactly the
// event of seq want. The batch is released when the test ends, if it is
// still open then.
func (r *floorRig) claimOne(leases []outboxdriver.Lease, want int64) *batch {
	r.t.Helper()
	ctx := context.Background()
	b, err := r.src.Claim(ctx, leases, 100)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { b.Release(ctx) })
	recs := b.Records()
	if len(recs) != 1 || recs[0].Seq != want {
		r.t.Fatalf("claimed %v, want the one event of seq %d", recs, want)
	}
	return b.(*batch)
}

// split returns the lease of seq's partition, and all the others.
func (r *floorRig) split(seq int64) (its, others []outboxdriver.Lease) {
	r.t.Helper()
	var p int
	if err := r.pool.QueryRow(context.Background(), `SELECT `+pgschema.PartitionOf("", r.table)+` FROM `+r.table.Qualified("")+` WHERE seq = $1`, seq).Scan(&p); err != nil {
		r.t.Fatal(err)
	}
	for _, l := range r.leases {
		if l.Partition == p {
			its = append(its, l)
		} else {
			others = append(others, l)
		}
	}
	return its, others
}

// partitionOf returns the partition an event of aggregate agg falls into.
func (r *floorRig) partitionOf(agg string) int {
	r.t.Helper()
	var p int
	if err := r.pool.QueryRow(context.Background(), `SELECT `+pgschema.PartitionOf("v.", r.table)+` FROM (VALUES ($1::text)) AS v(aggregateid)`, agg).Scan(&p); err != nil {
		r.t.Fatal(err)
	}
	return p
}

// published finishes b with all its records published.
func published(b *batch) outboxdriver.Outcome {
	var out outboxdriver.Outcome
	for _, rec := range b.Recs {
		out.Published = append(out.Published, rec.ID)
	}
	return out
}

// listen returns a pooled connection that LISTENs on the table's
// channel until the test ends.
func (r *floorRig) listen() *pgxpool.Conn {
	r.t.Helper()
	ctx := context.Background()
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `LISTEN `+outboxdriver.QuoteIdent(r.table.Channel())); err != nil {
		conn.Release()
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() {
		conn.Exec(context.Background(), `UNLISTEN *`)
		conn.Release()
	})
	return conn
}

// awaitNotifications fails unless conn receives n notifications within
// 20s.
func (r *floorRig) awaitNotifications(conn *pgxpool.Conn, n int) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range n {
		if _, err := conn.Conn().WaitForNotification(ctx); err != nil {
			r.t.Fatalf("notification %d of %d did not arrive: %v", i+1, n, err)
		}
	}
}

// waitNotified fails unless Wait returns for a notification (not its
// poll interval) within 20s.
func (r *floorRig) waitNotified(after string) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := r.src.Wait(ctx, time.Hour); err != nil {
		r.t.Fatalf("no wake-up after %s: %v", after, err)
	}
}

// A claim runs on the listener when it is free; a commit made while the
// batch is open still wakes the Wait after it (PostgreSQL delivers the
// notification once the claim's transaction ends), and a second claim
// while the first holds the listener runs on a pooled connection.
func TestClaimRunsOnTheListenerAndLosesNoWakeUp(t *testing.T) {
	t.Parallel()
	r := newFloorRig(t)
	r.listening()
	ctx := context.Background()
	first := r.insert(r.pool, "a")
	r.waitNotified("the first commit") // consumed: a later wake-up comes from a later commit
	its, others := r.split(first)
	b1 := r.claimOne(its, first)
	if !b1.listener {
		t.Fatal("the claim did not run on the free listener")
	}
	// Committed while b1 holds the listener, in another partition (a
	// claim locks its partitions).
	agg := ""
	for i := 0; agg == ""; i++ {
		if r.partitionOf(fmt.Sprint("b", i)) != its[0].Partition {
			agg = fmt.Sprint("b", i)
		}
		if i == 1000 {
			t.Fatal("every aggregate falls into the first one's partition")
		}
	}
	second := r.insert(r.pool, agg)
	b2 := r.claimOne(others, second)
	if b2.listener || b2.conn.Conn().PgConn().PID() == b1.conn.Conn().PgConn().PID() {
		t.Fatal("a second claim shared the listener with the batch holding it")
	}
	if err := b2.Finish(ctx, published(b2)); err != nil {
		t.Fatal(err)
	}
	if err := b1.Finish(ctx, published(b1)); err != nil {
		t.Fatal(err)
	}
	r.waitNotified("a commit made while a claim held the listener")
	if got := r.relay(); len(got) != 0 {
		t.Fatalf("left over: %v", got)
	}
}

// A claim whose connection breaks takes the listener down with it; the
// next Wait connects a new one (and returns at once: notifications sent
// meanwhile are lost), and claims run on it again.
func TestBrokenClaimOnTheListenerReconnectsIt(t *testing.T) {
	t.Parallel()
	r := newFloorRig(t)
	r.listening()
	ctx := context.Background()
	seq := r.insert(r.pool, "a")
	b := r.claimOne(r.leases, seq)
	if !b.listener {
		t.Fatal("the claim did not run on the free listener")
	}
	old := b.conn.Conn().PgConn().PID()
	// Wait until the backend is gone: until it has exited it holds the
	// batch's row and partition locks, and the claim below would skip them.
	if _, err := r.pool.Exec(ctx, `SELECT pg_terminate_backend($1, 10000)`, old); err != nil {
		t.Fatal(err)
	}
	if err := b.Finish(ctx, published(b)); err == nil {
		t.Fatal("finish on a terminated connection succeeded")
	}
	if r.src.listener != nil {
		t.Fatal("the broken listener was kept")
	}
	r.waitNotified("the listener was lost") // reconnects
	b = r.claimOne(r.leases, seq)           // not recorded: claimed again
	if !b.listener || b.conn.Conn().PgConn().PID() == old {
		t.Fatalf("claim after reconnect: on listener %v, backend %d (old %d)", b.listener, b.conn.Conn().PgConn().PID(), old)
	}
	b.Release(ctx)
}

// A relay that claims back to back never Waits, yet the notifications
// its claims read on the listener do not pile up: each claim takes those
// the previous batches left.
func TestClaimsOnTheListenerLeaveNoNotificationsBehind(t *testing.T) {
	t.Parallel()
	r := newFloorRig(t)
	r.listening()
	ctx := context.Background()
	other := r.listen()
	for i := range 5 {
		r.insert(r.pool, fmt.Sprint(i)) // five commits, five notifications
	}
	// Another listener has them all: the commits did notify, and the
	// source's listener was sent them too. PostgreSQL sends a listener its
	// notifications ahead of the reply to its next statement, so the first
	// claim reads them with its reply.
	r.awaitNotifications(other, 5)
	for range 2 {
		r.relay() // read them with the claims' replies, then take them
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if n, err := r.src.listener.Conn().WaitForNotification(gone); err == nil {
		t.Fatalf("a notification (%q) was still held after two rounds of claims", n.Channel)
	}
}
