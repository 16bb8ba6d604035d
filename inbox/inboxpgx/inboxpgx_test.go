package inboxpgx_test

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
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/inboxpgx"
	"github.com/outboxkit/outbox/inbox/internal/inboxtest"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

// setup migrates an inbox table and an effects table in a fresh schema.
func setup(t *testing.T) (*pgxpool.Pool, outboxdriver.Table) {
	t.Helper()
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	tbl.Name = "inbox"
	ctx := testenv.Context(t, 30*time.Second)
	if _, err := inboxpgx.Migrate(ctx, pool, tbl); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+outboxdriver.QuoteIdent(tbl.Schema)+`.effects (key text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return pool, tbl
}

func env(t *testing.T) inboxtest.Env[pgx.Tx] {
	pool, tbl := setup(t)
	schema := outboxdriver.QuoteIdent(tbl.Schema)
	return inboxtest.Env[pgx.Tx]{
		Driver:   inboxpgx.New(pool),
		Table:    tbl,
		Begin:    func(ctx context.Context) (pgx.Tx, error) { return pool.Begin(ctx) },
		Commit:   func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
		Rollback: func(ctx context.Context, tx pgx.Tx) error { return tx.Rollback(ctx) },
		Effect: func(ctx context.Context, tx pgx.Tx, key string) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+schema+`.effects (key) VALUES ($1)`, key)
			return err
		},
		Effects: func(ctx context.Context, key string) (n int, err error) {
			err = pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.effects WHERE key = $1`, key).Scan(&n)
			return n, err
		},
		Age: func(ctx context.Context, consumer, id string, d time.Duration) error {
			_, err := pool.Exec(ctx, `UPDATE `+tbl.Qualified("")+` SET processed_at = now() - make_interval(secs => $3) WHERE consumer = $1 AND event_id = $2`,
				consumer, id, d.Seconds())
			return err
		},
		Records: func(ctx context.Context, consumer string) (n int, err error) {
			err = pool.QueryRow(ctx, `SELECT count(*) FROM `+tbl.Qualified("")+` WHERE consumer = $1`, consumer).Scan(&n)
			return n, err
		},
		WaitBlocked: func(ctx context.Context) error { return waitBlocked(ctx, pool, tbl) },
	}
}

// waitBlocked polls, until ctx's deadline, for a session to wait for a
// lock while writing tbl.
func waitBlocked(ctx context.Context, pool *pgxpool.Pool, tbl outboxdriver.Table) error {
	pattern := "%" + tbl.Qualified("") + "%"
	deadline, _ := ctx.Deadline()
	return await.Poll(time.Until(deadline), func() error {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE $1`, pattern).Scan(&n)
		if err != nil {
			return err
		}
		if n == 0 {
			return errors.New("no session waits for a lock while writing " + tbl.Qualified(""))
		}
		return nil
	})
}

func TestConformance(t *testing.T) {
	inboxtest.Run(t, env)
}

// A handler publishes new events through the outbox in the consumer's
// transaction: consume → change state → publish, once.
func TestChainToOutbox(t *testing.T) {
	pool, tbl := setup(t)
	ctx := testenv.Context(t, 30*time.Second)
	obt := outboxdriver.Table{Schema: tbl.Schema, Name: "outbox"}
	if _, err := outboxpgx.New(pool).Migrate(ctx, obt, nil); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(outboxpgx.New(pool), &outbox.Config{Schema: obt.Schema, Table: obt.Name})
	if err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(inboxpgx.New(pool), &inbox.Config{Consumer: "billing", Schema: tbl.Schema})
	if err != nil {
		t.Fatal(err)
	}
	id := "0190a5c8-3a1e-7c3e-9a2b-000000000001"
	handle := func(fail bool) (inbox.Result, error) {
		return ib.Handle(ctx, inbox.Message{EventID: id, AggregateType: "order", AggregateID: "42"}, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO `+outboxdriver.QuoteIdent(tbl.Schema)+`.effects (key) VALUES ('invoice-42')`); err != nil {
				return err
			}
			if err := ob.WriteTx(ctx, tx, outbox.Event{AggregateType: "invoice", AggregateID: "42", Type: "InvoiceCreated", Payload: []byte(`{"order": 42}`)}); err != nil {
				return err
			}
			if fail {
				return errors.New("boom after publishing")
			}
			return nil
		})
	}
	if _, err := handle(true); err == nil {
		t.Fatal("a failing handler returned no error")
	}
	st, err := outboxpgx.New(pool).Status(ctx, obt)
	if err != nil {
		t.Fatal(err)
	}
	if st.Backlog != 0 {
		t.Fatalf("outbox backlog after a failed handler = %d, want 0 (rolled back with it)", st.Backlog)
	}
	for i, want := range []bool{true, false} {
		r, err := handle(false)
		if err != nil || r.Applied() != want {
			t.Fatalf("delivery %d: %+v, %v; want applied=%v", i, r, err, want)
		}
	}
	st, err = outboxpgx.New(pool).Status(ctx, obt)
	if err != nil {
		t.Fatal(err)
	}
	if st.Backlog != 1 {
		t.Fatalf("outbox backlog = %d, want exactly 1 InvoiceCreated", st.Backlog)
	}
}

func TestMigrate(t *testing.T) {
	pool := testenv.Pool(t)
	ctx := testenv.Context(t, 30*time.Second)
	tbl := testenv.Table(t, pool)
	tbl.Name = "my_inbox"
	vs, err := inboxpgx.Migrate(ctx, pool, tbl)
	if err != nil || len(vs) != inboxpgx.LatestVersion() {
		t.Fatalf("first Migrate = %v, %v; want every version", vs, err)
	}
	if vs, err := inboxpgx.Migrate(ctx, pool, tbl); err != nil || len(vs) != 0 {
		t.Fatalf("second Migrate = %v, %v; want nothing applied", vs, err)
	}
	tables := func() []string {
		rows, err := pool.Query(ctx, `SELECT table_name FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1`, tbl.Schema)
		if err != nil {
			t.Fatal(err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return names
	}
	if got, want := strings.Join(tables(), ","), "my_inbox,my_inbox_dead_letter,my_inbox_migrations,my_inbox_versions"; got != want {
		t.Fatalf("tables %s, want %s", got, want)
	}
	if vs, err := inboxpgx.MigrateDown(ctx, pool, tbl, 0); err != nil || len(vs) != inboxpgx.LatestVersion() {
		t.Fatalf("MigrateDown = %v, %v", vs, err)
	}
	if got := tables(); len(got) != 0 {
		t.Fatalf("tables after MigrateDown 0: %v", got)
	}
	if _, err := inboxpgx.Migrate(ctx, pool, tbl); err != nil {
		t.Fatalf("Migrate after MigrateDown: %v", err)
	}
	if _, err := inboxpgx.MigrateDown(ctx, pool, tbl, 99); err == nil {
		t.Fatal("MigrateDown to an unknown version succeeded")
	}

	// Concurrent migrations of one table wait for each other.
	tbl2 := testenv.Table(t, pool)
	errs := make(chan error, 4)
	for range 4 {
		go func() { _, err := inboxpgx.Migrate(ctx, pool, tbl2); errs <- err }()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent Migrate: %v", err)
		}
	}
}

func TestHostileNames(t *testing.T) {
	pool := testenv.Pool(t)
	ctx := testenv.Context(t, 30*time.Second)
	for _, tbl := range []outboxdriver.Table{
		{Schema: "public", Name: `inbox"; DROP TABLE x; --`},
		{Schema: `a b`, Name: "inbox"},
		{Schema: "public", Name: strings.Repeat("i", 60)},
	} {
		if _, err := inboxpgx.Migrate(ctx, pool, tbl); err == nil {
			t.Errorf("Migrate(%q) succeeded", tbl)
		}
		if _, err := inbox.New(inboxpgx.New(pool), &inbox.Config{Consumer: "c", Schema: tbl.Schema, Table: tbl.Name}); err == nil {
			t.Errorf("inbox.New(%q) succeeded", tbl)
		}
	}
}

func TestNotMigrated(t *testing.T) {
	pool := testenv.Pool(t)
	ctx := testenv.Context(t, 30*time.Second)
	tbl := testenv.Table(t, pool)
	ib, err := inbox.New(inboxpgx.New(pool), &inbox.Config{Consumer: "c", Schema: tbl.Schema})
	if err != nil {
		t.Fatal(err)
	}
	_, err = ib.Handle(ctx, inbox.Message{EventID: "0190a5c8-3a1e-7c3e-9a2b-000000000001"}, func(context.Context, pgx.Tx) error { return nil })
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%s.inbox", tbl.Schema)) {
		t.Fatalf("Handle on a missing table = %v; want an error naming the table", err)
	}
}
