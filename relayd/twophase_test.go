package relayd_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/relayd"
	"github.com/outboxkit/outbox/route"
)

// A writer whose transaction ends in PREPARE TRANSACTION works while a
// relay is idle and listening (the state in which the insert trigger
// sends a NOTIFY, which PostgreSQL refuses to prepare): with SET LOCAL
// outbox.notify = off, with outboxpgx.WithoutWakeups, and with the
// setting on the connection. Each event is published after COMMIT
// PREPARED, found by the relay's poll.
func TestTwoPhaseCommitWritersWorkWhileARelayIsIdle(t *testing.T) {
	ctx := testenv.Context(t, 2*time.Minute)
	pool := testenv.Pool(t)
	var maxPrepared int
	if err := pool.QueryRow(ctx, `SELECT current_setting('max_prepared_transactions')::int`).Scan(&maxPrepared); err != nil {
		t.Fatal(err)
	}
	if maxPrepared < 4 {
		t.Fatalf("max_prepared_transactions is %d on the test database: this test needs at least 4; set it in postgresql.conf and restart PostgreSQL", maxPrepared)
	}
	tb := testenv.Table(t, pool)
	// The notify trigger, whose NOTIFY a plain insert sends while a relay
	// waits: what makes PREPARE fail without outbox.notify = off.
	if _, err := outboxpgx.New(pool).Migrate(ctx, tb, &outboxdriver.MigrateOptions{Wakeups: outboxdriver.WakeupsTrigger}); err != nil {
		t.Fatal(err)
	}
	_, js := testenv.JetStream(t)
	st, prefix := testenv.Stream(t, js)
	router, err := route.New(&route.Config{Destination: prefix + ".all"})
	if err != nil {
		t.Fatal(err)
	}
	rl, err := relayd.Open(ctx, testenv.DatabaseURL(), natsSink(t, ctx, testenv.NATSURL(), prefix), &relayd.Options{
		Schema: tb.Schema, Table: tb.Name,
		Relay: relay.Config{Router: router, PollInterval: 200 * time.Millisecond, LeaseTTL: 2 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := rl.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rl.Stop(context.Background()) })

	table := driverkit.NamesOf(tb.Qualified)
	gid := func(name string) string {
		g := "outbox_test_" + testenv.Hex(t) + "_" + name
		t.Cleanup(func() {
			// A failed step must not leave a prepared transaction behind.
			pool.Exec(context.Background(), `ROLLBACK PREPARED '`+g+`'`)
		})
		return g
	}
	insert := `INSERT INTO ` + table.Table + ` (id, aggregatetype, aggregateid, type, payload)
VALUES (gen_random_uuid(), 'order', $1, 'Placed', '{}')`

	// The precondition the defect needs: the relay is idle, so a plain
	// insert notifies, and PREPARE fails.
	awaitIdle(t, ctx, pool, table.Wakeup)
	{
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, insert, "baseline"); err != nil {
			t.Fatal(err)
		}
		_, err = tx.Exec(ctx, `PREPARE TRANSACTION '`+gid("baseline")+`'`)
		tx.Rollback(ctx)
		if err == nil || !strings.Contains(err.Error(), "NOTIFY") {
			t.Fatalf("PREPARE after a plain insert while the relay is idle: %v, want PostgreSQL's refusal (the relay was not idle?)", err)
		}
	}

	var published uint64
	// twoPhase runs write inside BEGIN ... PREPARE TRANSACTION on one
	// connection of db, then COMMIT PREPARED from another, and waits for
	// the event to be published.
	twoPhase := func(name string, db *pgxpool.Pool, write func(context.Context, pgx.Tx) error) {
		t.Helper()
		awaitIdle(t, ctx, pool, table.Wakeup)
		g := gid(name)
		conn, err := db.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			conn.Release()
			t.Fatal(err)
		}
		if err := write(ctx, tx); err != nil {
			tx.Rollback(ctx)
			conn.Release()
			t.Fatalf("%s: write: %v", name, err)
		}
		_, err = tx.Exec(ctx, `PREPARE TRANSACTION '`+g+`'`)
		// The session is outside any transaction now; pgx's COMMIT finds
		// none and only warns.
		tx.Commit(ctx)
		conn.Release()
		if err != nil {
			t.Fatalf("%s: PREPARE TRANSACTION while the relay is idle: %v", name, err)
		}
		if _, err := pool.Exec(ctx, `COMMIT PREPARED '`+g+`'`); err != nil {
			t.Fatalf("%s: COMMIT PREPARED: %v", name, err)
		}
		published++
		testenv.WaitStreamMsgs(t, st, published, 30*time.Second)
	}

	twoPhase("set_local", pool, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL outbox.notify = off`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, insert, "set-local")
		return err
	})

	quiet, err := outbox.New(outboxpgx.New(nil, outboxpgx.WithoutWakeups()), &outbox.Config{Schema: tb.Schema, Table: tb.Name})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 3} { // the one-row and the multi-row INSERT
		twoPhase(fmt.Sprintf("driver_option_%d", n), pool, func(ctx context.Context, tx pgx.Tx) error {
			events := make([]outbox.Event, n)
			for i := range events {
				events[i] = outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("quiet-%d", i), Type: "Placed", Payload: []byte(`{}`)}
			}
			published += uint64(n - 1)
			return quiet.WriteTx(ctx, tx, events...)
		})
	}

	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["outbox.notify"] = "off"
	offPool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer offPool.Close()
	twoPhase("connection_setting", offPool, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, insert, "connection")
		return err
	})
}

// awaitIdle waits, until ctx's deadline, for a relay to be registered for
// wake-ups.
func awaitIdle(t *testing.T, ctx context.Context, pool *pgxpool.Pool, wakeup string) {
	t.Helper()
	deadline, _ := ctx.Deadline()
	await.Eventually(t, time.Until(deadline), func() error {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+wakeup+` WHERE expires_at > now()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return errors.New("the relay never registered for wake-ups")
		}
		return nil
	})
}
