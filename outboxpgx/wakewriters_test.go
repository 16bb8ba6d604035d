package outboxpgx

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
)

// wakeRig is a table migrated with the given wake-ups, a Driver on it, a
// relay's Source, and a connection listening on the table's channel.
type wakeRig struct {
	t      *testing.T
	pool   *pgxpool.Pool
	table  outboxdriver.Table
	drv    *Driver
	src    *source
	listen *pgxpool.Conn
}

func newWakeRig(t *testing.T, wakeups string) *wakeRig {
	t.Helper()
	ctx := context.Background()
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	if _, err := New(pool).Migrate(ctx, tb, &outboxdriver.MigrateOptions{Wakeups: wakeups}); err != nil {
		t.Fatal(err)
	}
	s, err := New(pool).NewSource(tb, &outboxdriver.SourceConfig{RelayName: "relay-w"})
	if err != nil {
		t.Fatal(err)
	}
	src := s.(*source)
	t.Cleanup(func() { src.Close() })
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
	return &wakeRig{t: t, pool: pool, table: tb, drv: New(pool), src: src, listen: conn}
}

// write commits one event through the Driver's InsertTx, with setup run
// first in the transaction when it is not empty.
func (r *wakeRig) write(setup string) {
	r.t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		if setup != "" {
			if _, err := tx.Exec(ctx, setup); err != nil {
				return err
			}
		}
		return r.drv.InsertTx(ctx, tx, r.table, []outboxdriver.Row{{ID: uuid.NewString(), AggregateType: "order", AggregateID: "1", Type: "Placed", Payload: []byte(`{}`)}})
	})
	if err != nil {
		r.t.Fatal(err)
	}
}

// notified reports whether a notification arrives within d.
func (r *wakeRig) notified(d time.Duration) bool {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	_, err := r.listen.Conn().WaitForNotification(ctx)
	if err != nil && ctx.Err() == nil {
		r.t.Fatal(err)
	}
	return err == nil
}

// expectNone fails unless the next notification is a marker sent now: no
// commit before it notified.
func (r *wakeRig) expectNone(what string) {
	r.t.Helper()
	if _, err := r.pool.Exec(context.Background(), `SELECT pg_notify($1, 'marker')`, r.table.Channel()); err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := r.listen.Conn().WaitForNotification(ctx)
	if err != nil {
		r.t.Fatalf("the marker did not arrive within 10s: %v", err)
	}
	if n.Payload != "marker" {
		r.t.Fatalf("a notification arrived before the marker: %s notified", what)
	}
}

// fresh reads the Driver's view of the table now and holds its age at a
// millisecond: the writes that follow act on what the read saw, however
// slowly a busy machine runs them.
func (r *wakeRig) fresh() {
	r.t.Helper()
	if err := r.drv.wake.Hold(context.Background(), r.table, time.Millisecond); err != nil {
		r.t.Fatal(err)
	}
}

// stale reads the view now and makes it WakeViewMaxAge old.
func (r *wakeRig) stale() {
	r.t.Helper()
	if err := r.drv.wake.Hold(context.Background(), r.table, driverkit.WakeViewMaxAge); err != nil {
		r.t.Fatal(err)
	}
}

// With --wakeups writers the table has no notify trigger, and the
// library's writer wakes an idle relay itself: a commit made while a
// relay is registered sends the notification, once the writer's view
// shows the registration; none while no relay waits and the view is
// fresh; none when outbox.notify is off (two-phase commit), registered or
// not; and, from a writer whose view is older than WakeViewMaxAge, which
// cannot rule out a registration, one while a relay waits (the server
// answers, WakeCTE) and none while none does.
func TestWritersWakeAnIdleRelayWithoutTheTrigger(t *testing.T) {
	t.Parallel()
	r := newWakeRig(t, outboxdriver.WakeupsWriters)
	ctx := context.Background()
	var triggers int
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FROM pg_trigger WHERE tgrelid = $1::regclass AND NOT tgisinternal`, r.table.Qualified("")).Scan(&triggers); err != nil {
		t.Fatal(err)
	}
	if triggers != 0 {
		t.Fatalf("%d triggers on the table, want none with --wakeups writers", triggers)
	}

	// No relay waits: a writer with a fresh view sends nothing.
	r.fresh()
	r.write("")
	r.expectNone("a commit while no relay waited")

	// A relay registers: a commit by a writer whose view shows it
	// notifies, once.
	if err := r.src.SetIdle(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	r.fresh()
	r.write("")
	if !r.notified(10 * time.Second) {
		t.Fatal("a commit while the writer's view showed a relay waiting sent no wake-up within 10s")
	}
	r.expectNone("one commit sent more than one notification")

	// Registered, but the transaction turned the wake-up off.
	r.fresh()
	r.write(`SET LOCAL outbox.notify = off`)
	r.expectNone("a commit with outbox.notify off")

	// The relay leaves; a fresh view says so.
	if err := r.src.SetIdle(ctx, 0); err != nil {
		t.Fatal(err)
	}
	r.fresh()
	r.write("")
	r.expectNone("a commit after the relay left")

	count := func() (n, delayed int) {
		t.Helper()
		if err := r.pool.QueryRow(ctx, `SELECT count(*), count(deliver_at) FROM `+r.table.Qualified("")).Scan(&n, &delayed); err != nil {
			t.Fatal(err)
		}
		return n, delayed
	}
	before, _ := count()
	// No relay waits: a view older than WakeViewMaxAge leaves the
	// question to the server, which sends nothing.
	r.stale()
	r.write("")
	r.expectNone("a commit with an old view and no relay waiting")
	before++
	// A relay waits again: a view older than WakeViewMaxAge cannot rule
	// it out, and every form of the INSERT asks the server then (one row,
	// several, several with a delayed one), which wakes it.
	if err := r.src.SetIdle(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, rows := range [][]outboxdriver.Row{
		{{ID: uuid.NewString(), AggregateType: "order", AggregateID: "3", Type: "Placed", Payload: []byte(`{}`)}},
		{{ID: uuid.NewString(), AggregateType: "order", AggregateID: "4", Type: "Placed", Payload: []byte(`{}`)},
			{ID: uuid.NewString(), AggregateType: "order", AggregateID: "4", Type: "Paid", Payload: []byte(`{}`)}},
		{{ID: uuid.NewString(), AggregateType: "order", AggregateID: "5", Type: "Placed", Payload: []byte(`{}`), DeliverAt: time.Now().Add(time.Hour)},
			{ID: uuid.NewString(), AggregateType: "order", AggregateID: "6", Type: "Placed", Payload: []byte(`{}`)}},
	} {
		r.stale()
		if err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error { return r.drv.InsertTx(ctx, tx, r.table, rows) }); err != nil {
			t.Fatal(err)
		}
		if !r.notified(10 * time.Second) {
			t.Fatalf("a writer of %d rows whose view was older than WakeViewMaxAge sent no wake-up", len(rows))
		}
	}
	if n, delayed := count(); n-before != 5 || delayed != 1 {
		t.Fatalf("%d events (%d delayed) written in the wake-up's forms, want 5 (1)", n-before, delayed)
	}
}

// With the trigger (the default), the writer adds no NOTIFY of its own: a
// commit while no relay waits sends nothing, whatever the writer's view,
// so a transaction that ends in PREPARE TRANSACTION still can.
func TestWritersAddNoWakeupToATableWithTheTrigger(t *testing.T) {
	t.Parallel()
	r := newWakeRig(t, outboxdriver.WakeupsTrigger)
	r.write("") // before the view was ever read
	r.stale()   // and with a view past its age
	r.write("")
	r.expectNone("a commit on a table with its trigger, no relay waiting")
	ctx := context.Background()
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.drv.InsertTx(ctx, tx, r.table, []outboxdriver.Row{{ID: uuid.NewString(), AggregateType: "order", AggregateID: "2", Type: "Placed", Payload: []byte(`{}`)}}); err != nil {
		t.Fatal(err)
	}
	gid := testenv.Name("gid")
	// Before PREPARE: it may prepare on the server and still fail here.
	t.Cleanup(func() { r.pool.Exec(context.Background(), `ROLLBACK PREPARED '`+gid+`'`) })
	if _, err := conn.Exec(ctx, `PREPARE TRANSACTION '`+gid+`'`); err != nil {
		t.Fatalf("prepare: %v", err)
	}
	if _, err := r.pool.Exec(ctx, `ROLLBACK PREPARED '`+gid+`'`); err != nil {
		t.Fatal(err)
	}

	// Moving the table to writers' wake-ups and back drops and restores
	// the trigger.
	for _, mode := range []string{outboxdriver.WakeupsWriters, outboxdriver.WakeupsTrigger} {
		if _, err := New(r.pool).Migrate(ctx, r.table, &outboxdriver.MigrateOptions{Wakeups: mode}); err != nil {
			t.Fatal(err)
		}
		var has bool
		if err := r.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = $1::regclass AND tgname = $2)`,
			r.table.Qualified(""), r.table.Name+"_notify").Scan(&has); err != nil {
			t.Fatal(err)
		}
		if has != (mode == outboxdriver.WakeupsTrigger) {
			t.Fatalf("after --wakeups %s: trigger there %v", mode, has)
		}
	}
	if _, err := New(r.pool).Migrate(ctx, r.table, &outboxdriver.MigrateOptions{Wakeups: "sometimes"}); err == nil || !strings.Contains(err.Error(), `wake-ups "sometimes": use "trigger" or "writers"`) {
		t.Fatalf("bad wake-ups: %v", err)
	}
}
