package outboxpgx_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

// roundTrips records what a pool sends: one entry per statement sent on
// its own, one per batch (a batch is one round trip), with the batch's
// statements.
type roundTrips struct {
	mu   sync.Mutex
	sent [][]string
}

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if d.SQL == pgschema.WakeViewSQL {
		// The Driver's read of whether relays wait, in the background on
		// another connection: no round trip of the transaction's.
		return ctx
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent = append(r.sent, []string{d.SQL})
	return ctx
}

func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	var sqls []string
	for _, q := range d.Batch.QueuedQueries {
		sqls = append(sqls, q.SQL)
	}
	r.sent = append(r.sent, sqls)
	return ctx
}

func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// since returns what was sent after the first n round trips.
func (r *roundTrips) since(n int) [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]string(nil), r.sent[n:]...)
}

func (r *roundTrips) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.sent)
}

// txRig is a migrated table with an orders table beside it, and a pool
// whose round trips are recorded.
type txRig struct {
	pool, traced *pgxpool.Pool
	table        outboxdriver.Table
	orders       string
	drv          *outboxpgx.Driver
	ob           *outbox.Outbox[pgx.Tx]
	trips        *roundTrips
}

func newTxRig(t *testing.T) *txRig {
	t.Helper()
	pool, tb := setup(t)
	ctx := context.Background()
	r := &txRig{pool: pool, table: tb, orders: tb.Qualified("_orders"), trips: &roundTrips{}}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+r.orders+` (id bigserial PRIMARY KEY, customer text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = r.trips
	if r.traced, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.traced.Close)
	r.drv = outboxpgx.New(r.traced)
	if r.ob, err = outbox.New(r.drv, &outbox.Config{Schema: tb.Schema, Table: tb.Name}); err != nil {
		t.Fatal(err)
	}
	return r
}

// begin begins a Tx on the traced pool, rolled back when the test ends
// if it is still open then.
func (r *txRig) begin(t *testing.T) *outboxpgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := r.drv.Begin(ctx, pgx.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(ctx) })
	return tx
}

// order inserts an order in tx and returns its id, which names the
// aggregate of its events: the kind of statement Driver.Queue cannot
// batch with the events.
func (r *txRig) order(t *testing.T, tx pgx.Tx) string {
	t.Helper()
	var id int64
	if err := tx.QueryRow(context.Background(), `INSERT INTO `+r.orders+` (customer) VALUES ('c') RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return strconv.FormatInt(id, 10)
}

// noneAcquired fails unless every connection of the traced pool is back
// in it within 10s: the Driver's background read of the wake-up view
// holds one for a moment; a Tx that kept its own would hold it for good.
func (r *txRig) noneAcquired(t *testing.T, when string) {
	t.Helper()
	await.Eventually(t, 10*time.Second, func() error {
		if n := r.traced.Stat().AcquiredConns(); n != 0 {
			return fmt.Errorf("%d connections still acquired %s", n, when)
		}
		return nil
	})
}

func (r *txRig) counts(t *testing.T) (orders, events int) {
	t.Helper()
	return count(t, r.pool, r.orders), count(t, r.pool, r.table.Qualified(""))
}

// Events written to a Tx are written by its Commit in the COMMIT's round
// trip: the transaction sends BEGIN, its own statement, and one batch of
// the events' INSERT and the COMMIT, as many round trips as without
// events.
func TestTxWritesEventsInTheCommitsRoundTrip(t *testing.T) {
	t.Parallel()
	r := newTxRig(t)
	ctx := context.Background()
	tx := r.begin(t)
	id := r.order(t, tx)
	if err := r.ob.WriteTx(ctx, tx, ev(id, 1), ev(id, 2)); err != nil {
		t.Fatal(err)
	}
	if err := r.ob.WriteTx(ctx, tx, ev(id, 3)); err != nil {
		t.Fatal(err)
	}
	before := r.trips.count()
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	sent := r.trips.since(before)
	if len(sent) != 1 || len(sent[0]) != 2 || sent[0][1] != "commit" {
		t.Fatalf("Commit sent %q, want one batch of the events' INSERT and the commit", sent)
	}
	if o, e := r.counts(t); o != 1 || e != 3 {
		t.Fatalf("%d orders and %d events committed, want 1 and 3", o, e)
	}
	var aggs []string
	rows, err := r.pool.Query(ctx, `SELECT aggregateid FROM `+r.table.Qualified("")+` ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	if aggs, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	for _, a := range aggs {
		if a != id {
			t.Fatalf("events name aggregates %v, want the order %s", aggs, id)
		}
	}
	if _, err := tx.Exec(ctx, `SELECT 1`); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("Exec after Commit: %v, want pgx.ErrTxClosed (the connection is back in the pool)", err)
	}
	if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("Commit after Commit: %v, want pgx.ErrTxClosed", err)
	}
	r.noneAcquired(t, "after Commit")
}

// Nothing of a rolled-back Tx exists, its events included.
func TestTxRollbackDropsTheEvents(t *testing.T) {
	t.Parallel()
	r := newTxRig(t)
	ctx := context.Background()
	tx := r.begin(t)
	id := r.order(t, tx)
	if err := r.ob.WriteTx(ctx, tx, ev(id, 1)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("Commit after Rollback: %v, want pgx.ErrTxClosed", err)
	}
	if o, e := r.counts(t); o != 0 || e != 0 {
		t.Fatalf("%d orders and %d events after rollback", o, e)
	}
}

// A Commit whose events cannot be written commits nothing, the business
// statements included, and leaves a usable connection in the pool; so
// does the Commit of a transaction one of whose statements failed, with
// pgx's ErrTxCommitRollback. An invalid event is refused by WriteTx and
// changes nothing.
func TestTxCommitIsAllOrNothing(t *testing.T) {
	t.Parallel()
	r := newTxRig(t)
	ctx := context.Background()
	// The table refuses events of type Refused, so that the events'
	// INSERT, sent with the COMMIT, fails.
	if _, err := r.pool.Exec(ctx, `CREATE FUNCTION `+r.table.Qualified("_refuse")+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.type = 'Refused' THEN RAISE EXCEPTION 'refused'; END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse BEFORE INSERT ON `+r.table.Qualified("")+` FOR EACH ROW EXECUTE FUNCTION `+r.table.Qualified("_refuse")+`()`); err != nil {
		t.Fatal(err)
	}
	write(t, r.pool, r.ob, true, ev("1", 1))
	refused := ev("1", 2)
	refused.Type = "Refused"

	tx := r.begin(t)
	id := r.order(t, tx)
	if err := r.ob.WriteTx(ctx, tx, outbox.Event{AggregateType: "order"}); !errors.Is(err, outbox.ErrInvalidEvent) {
		t.Fatalf("WriteTx of an invalid event: %v, want outbox.ErrInvalidEvent", err)
	}
	if err := r.ob.WriteTx(ctx, tx, ev(id, 1), refused); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("Commit with an event the table refuses succeeded")
	}
	if o, e := r.counts(t); o != 0 || e != 1 {
		t.Fatalf("%d orders and %d events after a failed Commit, want 0 and the 1 from before", o, e)
	}

	tx = r.begin(t)
	r.order(t, tx)
	if _, err := tx.Exec(ctx, `SELECT 1/0`); err == nil {
		t.Fatal("division by zero succeeded")
	}
	if err := r.ob.WriteTx(ctx, tx, ev("2", 1)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("Commit of a failed transaction: %v, want pgx.ErrTxCommitRollback", err)
	}
	if o, e := r.counts(t); o != 0 || e != 1 {
		t.Fatalf("%d orders and %d events after committing a failed transaction, want 0 and 1", o, e)
	}

	// The pool's connections are idle and work.
	r.noneAcquired(t, "after the failed commit")
	tx = r.begin(t)
	id = r.order(t, tx)
	if err := r.ob.WriteTx(ctx, tx, ev(id, 1)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if o, e := r.counts(t); o != 1 || e != 2 {
		t.Fatalf("%d orders and %d events, want 1 and 2", o, e)
	}
}
