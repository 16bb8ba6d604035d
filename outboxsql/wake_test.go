package outboxsql

import (
	"context"
	"database/sql"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
)

// On a table without the notify trigger (--wakeups writers), a writer
// through database/sql wakes relays itself: with its view of the registry
// older than WakeViewMaxAge (as for a writer that writes seldom), each
// form of its INSERT (one row, several, several with a delayed one)
// carries the notification and writes every row; with a fresh view that
// shows no relay waiting, it sends none. The rest of the view's rules are
// outboxpgx's tests (the same view).
func TestWriteTxWakesRelaysWithoutTheTrigger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	db, err := sql.Open("pgx", testenv.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	drv := New(db)
	if _, err := drv.Migrate(ctx, tb, &outboxdriver.MigrateOptions{Wakeups: outboxdriver.WakeupsWriters}); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(drv, &outbox.Config{Schema: tb.Schema, Table: tb.Name})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `LISTEN `+outboxdriver.QuoteIdent(tb.Channel())); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(context.Background(), `UNLISTEN *`)
	// view reads the view now and holds its age at age.
	view := func(age time.Duration) {
		t.Helper()
		if err := drv.wake.Hold(ctx, tb, age); err != nil {
			t.Fatal(err)
		}
	}
	write := func(events ...outbox.Event) {
		t.Helper()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if err := ob.WriteTx(ctx, tx, events...); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	next := func(wait time.Duration) (string, bool) {
		wctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		n, err := conn.Conn().WaitForNotification(wctx)
		if err != nil {
			return "", false
		}
		return n.Payload, true
	}
	ev := func(agg string) outbox.Event {
		return outbox.Event{AggregateType: "order", AggregateID: agg, Type: "Placed", Payload: []byte(`{}`)}
	}
	late := ev("3")
	late.DeliverAt = time.Now().Add(time.Hour)
	marker := func(what string) {
		t.Helper()
		if _, err := pool.Exec(ctx, `SELECT pg_notify($1, 'marker')`, tb.Channel()); err != nil {
			t.Fatal(err)
		}
		if p, ok := next(10 * time.Second); !ok || p != "marker" {
			t.Fatalf("%s: notification %q before the marker", what, p)
		}
	}
	// A relay waits (registered as relays register): a write whose view
	// is too old to rule it out leaves the question to the server, which
	// wakes it, in every form of the INSERT.
	if _, err := pool.Exec(ctx, `INSERT INTO `+tb.Qualified("_wakeup")+` (relay, expires_at) VALUES ('idle-relay', now() + interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	for _, events := range [][]outbox.Event{{ev("1")}, {ev("1"), ev("2")}, {late, ev("4")}} {
		view(driverkit.WakeViewMaxAge)
		write(events...)
		if p, ok := next(10 * time.Second); !ok || p != "" {
			t.Fatalf("a write of %d events with an old view while a relay waits: notification %v (payload %q), want the wake-up", len(events), ok, p)
		}
	}
	// No relay waits: an old view costs the server's check, no NOTIFY.
	if _, err := pool.Exec(ctx, `DELETE FROM `+tb.Qualified("_wakeup")); err != nil {
		t.Fatal(err)
	}
	view(driverkit.WakeViewMaxAge)
	write(ev("5"))
	marker("with an old view and no relay waiting")
	view(time.Millisecond)
	write(ev("6"))
	marker("with a fresh view and no relay waiting")
	var n, delayed int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(deliver_at) FROM `+tb.Qualified("")).Scan(&n, &delayed); err != nil {
		t.Fatal(err)
	}
	if n != 7 || delayed != 1 {
		t.Fatalf("%d events (%d delayed), want 7 (1)", n, delayed)
	}
}
