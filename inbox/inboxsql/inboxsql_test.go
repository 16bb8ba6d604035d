package inboxsql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "modernc.org/sqlite"             // database/sql driver "sqlite"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/inboxsql"
	"github.com/outboxkit/outbox/inbox/internal/inboxtest"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxsql"
)

// openSQLite opens a new SQLite file the way the inbox wants it: WAL, a
// busy timeout, immediate transactions.
func openSQLite(t *testing.T) *sql.DB {
	t.Helper()
	path := filepath.Join(t.TempDir(), "inbox.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(60000)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// openPostgres opens the test PostgreSQL through database/sql and returns
// a fresh schema, dropped when the test ends.
func openPostgres(t *testing.T) (*sql.DB, string) {
	t.Helper()
	pool := testenv.Pool(t) // fails with a hint when PostgreSQL is down
	tbl := testenv.Table(t, pool)
	db, err := sql.Open("pgx", testenv.DatabaseURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, tbl.Schema
}

func env(dialect inboxsql.Dialect) func(t *testing.T) inboxtest.Env[*sql.Tx] {
	return func(t *testing.T) inboxtest.Env[*sql.Tx] {
		ctx := testenv.Context(t, 30*time.Second)
		var db *sql.DB
		tbl := outboxdriver.Table{Name: "inbox"}
		if dialect == inboxsql.SQLite {
			db, tbl.Schema = openSQLite(t), "main"
		} else {
			db, tbl.Schema = openPostgres(t)
		}
		if _, err := inboxsql.Migrate(ctx, db, dialect, tbl); err != nil {
			t.Fatal(err)
		}
		effects := outboxdriver.QuoteIdent(tbl.Schema) + ".effects"
		if _, err := db.ExecContext(ctx, `CREATE TABLE `+effects+` (key text NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		drv, err := inboxsql.New(db, dialect)
		if err != nil {
			t.Fatal(err)
		}
		p := func(i int) string {
			if dialect == inboxsql.SQLite {
				return "?"
			}
			return fmt.Sprintf("$%d", i)
		}
		age := `UPDATE ` + tbl.Qualified("") + ` SET processed_at = now() - make_interval(secs => $1) WHERE consumer = $2 AND event_id = $3`
		if dialect == inboxsql.SQLite {
			age = `UPDATE ` + tbl.Qualified("") + ` SET processed_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-' || ? || ' seconds') WHERE consumer = ? AND event_id = ?`
		}
		e := inboxtest.Env[*sql.Tx]{
			Driver:   drv,
			Table:    tbl,
			Begin:    func(ctx context.Context) (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
			Commit:   func(_ context.Context, tx *sql.Tx) error { return tx.Commit() },
			Rollback: func(_ context.Context, tx *sql.Tx) error { return tx.Rollback() },
			Effect: func(ctx context.Context, tx *sql.Tx, key string) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO `+effects+` (key) VALUES (`+p(1)+`)`, key)
				return err
			},
			Effects: func(ctx context.Context, key string) (n int, err error) {
				err = db.QueryRowContext(ctx, `SELECT count(*) FROM `+effects+` WHERE key = `+p(1), key).Scan(&n)
				return n, err
			},
			Age: func(ctx context.Context, consumer, id string, d time.Duration) error {
				_, err := db.ExecContext(ctx, age, d.Seconds(), consumer, id)
				return err
			},
			Records: func(ctx context.Context, consumer string) (n int, err error) {
				err = db.QueryRowContext(ctx, `SELECT count(*) FROM `+tbl.Qualified("")+` WHERE consumer = `+p(1), consumer).Scan(&n)
				return n, err
			},
		}
		if dialect == inboxsql.Postgres {
			e.WaitBlocked = func(ctx context.Context) error { return waitBlocked(ctx, db, tbl) }
		}
		return e
	}
}

// waitBlocked polls, until ctx's deadline, for a session to wait for a
// lock while writing tbl.
func waitBlocked(ctx context.Context, db *sql.DB, tbl outboxdriver.Table) error {
	deadline, _ := ctx.Deadline()
	return await.Poll(time.Until(deadline), func() error {
		var n int
		err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1`,
			"%"+tbl.Qualified("")+"%").Scan(&n)
		if err != nil {
			return err
		}
		if n == 0 {
			return errors.New("no session waits for a lock while writing " + tbl.Qualified(""))
		}
		return nil
	})
}

func TestConformancePostgres(t *testing.T) { inboxtest.Run(t, env(inboxsql.Postgres)) }

func TestConformanceSQLite(t *testing.T) { inboxtest.Run(t, env(inboxsql.SQLite)) }

func TestChainToOutboxPostgres(t *testing.T) {
	db, schema := openPostgres(t)
	ctx := testenv.Context(t, 30*time.Second)
	if _, err := inboxsql.Migrate(ctx, db, inboxsql.Postgres, outboxdriver.Table{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	obt := outboxdriver.Table{Schema: schema, Name: "outbox"}
	if _, err := outboxsql.New(db).Migrate(ctx, obt, nil); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(outboxsql.New(db), &outbox.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	drv, err := inboxsql.New(db, inboxsql.Postgres)
	if err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(drv, &inbox.Config{Consumer: "billing", Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	m := inbox.Message{EventID: "0190a5c8-3a1e-7c3e-9a2b-000000000002", AggregateType: "order", AggregateID: "7"}
	for i, want := range []bool{true, false} {
		r, err := ib.Handle(ctx, m, func(ctx context.Context, tx *sql.Tx) error {
			return ob.WriteTx(ctx, tx, outbox.Event{AggregateType: "invoice", AggregateID: "7", Type: "InvoiceCreated", Payload: []byte(`{}`)})
		})
		if err != nil || r.Applied() != want {
			t.Fatalf("delivery %d: %+v, %v; want applied=%v", i, r, err, want)
		}
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM `+obt.Qualified("")).Scan(&n); err != nil || n != 1 {
		t.Fatalf("outbox rows = %d, %v; want 1", n, err)
	}
}

func TestMigrateSQLite(t *testing.T) {
	db := openSQLite(t)
	ctx := testenv.Context(t, 30*time.Second)
	tbl := outboxdriver.Table{Name: "events_in"} // schema defaults to main
	if vs, err := inboxsql.Migrate(ctx, db, inboxsql.SQLite, tbl); err != nil || len(vs) != inboxsql.LatestVersion(inboxsql.SQLite) {
		t.Fatalf("first Migrate = %v, %v", vs, err)
	}
	if vs, err := inboxsql.Migrate(ctx, db, inboxsql.SQLite, tbl); err != nil || len(vs) != 0 {
		t.Fatalf("second Migrate = %v, %v; want nothing applied", vs, err)
	}
	tables := func() string {
		rows, err := db.QueryContext(ctx, `SELECT name FROM sqlite_master WHERE name LIKE 'events_in%' ORDER BY name`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var names []string
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			names = append(names, s)
		}
		return strings.Join(names, ",")
	}
	if got, want := tables(), "events_in,events_in_dead_letter,events_in_dl_consumer,events_in_migrations,events_in_processed,events_in_versions"; got != want {
		t.Fatalf("objects %s, want %s", got, want)
	}
	if _, err := inboxsql.MigrateDown(ctx, db, inboxsql.SQLite, tbl, 0); err != nil {
		t.Fatal(err)
	}
	if got := tables(); got != "" {
		t.Fatalf("objects after MigrateDown 0: %s", got)
	}
	if _, err := inboxsql.Migrate(ctx, db, inboxsql.SQLite, tbl); err != nil {
		t.Fatalf("Migrate after MigrateDown: %v", err)
	}
	if inboxsql.LatestVersion(inboxsql.SQLite) != inboxsql.LatestVersion(inboxsql.Postgres) {
		t.Fatal("SQLite and PostgreSQL schema versions differ")
	}
	for _, bad := range []outboxdriver.Table{{Name: `x"; DROP TABLE y; --`}, {Schema: "main;", Name: "inbox"}} {
		if _, err := inboxsql.Migrate(ctx, db, inboxsql.SQLite, bad); err == nil {
			t.Errorf("Migrate(%q) succeeded", bad)
		}
	}
}

func TestNewRefusesBadInput(t *testing.T) {
	db := openSQLite(t)
	if _, err := inboxsql.New(nil, inboxsql.SQLite); err == nil {
		t.Error("New(nil db) succeeded")
	}
	if _, err := inboxsql.New(db, 0); err == nil {
		t.Error("New with no dialect succeeded")
	}
	if _, err := inboxsql.ParseDialect("oracle"); err == nil {
		t.Error("ParseDialect(oracle) succeeded")
	}
	if d, err := inboxsql.ParseDialect("sqlite"); err != nil || d != inboxsql.SQLite {
		t.Errorf("ParseDialect(sqlite) = %v, %v", d, err)
	}
}
