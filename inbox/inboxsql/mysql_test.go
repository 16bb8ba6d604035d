package inboxsql_test

// The inbox on MySQL and MariaDB: the conformance suite, and what is
// particular to them (migrations without transactions, the current
// database as the default schema, the found-rows check, the version guard
// under concurrency).

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/inboxsql"
	"github.com/outboxkit/outbox/inbox/internal/inboxtest"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
)

// envMySQL points the tests at another MySQL or MariaDB: a go-sql-driver
// DSN of a user that may create databases.
const envMySQL = "OUTBOX_TEST_MYSQL_DSN"

const startMariaDB = "start it with: start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd"

// openMySQL opens a fresh database, dropped when the test ends, through
// the DSN as given (no parseTime, server-side prepared statements) with
// edit applied, and returns it and its name. It fails, saying how to start
// MariaDB, when the server does not answer.
func openMySQL(t testing.TB, edit func(*mysql.Config)) (*sql.DB, string) {
	t.Helper()
	dsn := os.Getenv(envMySQL)
	if dsn == "" {
		dsn = "root@tcp(127.0.0.1:3306)/test"
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatalf("%s: %v", envMySQL, err)
	}
	open := func(cfg *mysql.Config) *sql.DB {
		t.Helper()
		conn, err := mysql.NewConnector(cfg)
		if err != nil {
			t.Fatal(err)
		}
		db := sql.OpenDB(conn)
		db.SetMaxOpenConns(16)
		t.Cleanup(func() { db.Close() })
		return db
	}
	admin := open(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := admin.PingContext(ctx); err != nil {
		t.Fatalf("cannot reach MySQL/MariaDB at %s (set %s to use another): %v; %s", cfg.Addr, envMySQL, err, startMariaDB)
	}
	name := testenv.MySQLDatabase(t, admin, "inbox")
	cfg = cfg.Clone()
	cfg.DBName = name
	if edit != nil {
		edit(cfg)
	}
	return open(cfg), name
}

// mysqlEnv is a migrated inbox in a fresh database, named explicitly.
func mysqlEnv(t *testing.T) inboxtest.Env[*sql.Tx] {
	ctx := testenv.Context(t, 30*time.Second)
	db, name := openMySQL(t, nil)
	tbl := outboxdriver.Table{Schema: name, Name: "inbox"}
	if _, err := inboxsql.Migrate(ctx, db, inboxsql.MySQL, tbl); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE effects (`key` VARCHAR(255) NOT NULL) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	drv, err := inboxsql.New(db, inboxsql.MySQL)
	if err != nil {
		t.Fatal(err)
	}
	inboxTable := "`" + name + "`.`inbox`"
	return inboxtest.Env[*sql.Tx]{
		Driver:   drv,
		Table:    tbl,
		Begin:    func(ctx context.Context) (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
		Commit:   func(_ context.Context, tx *sql.Tx) error { return tx.Commit() },
		Rollback: func(_ context.Context, tx *sql.Tx) error { return tx.Rollback() },
		Effect: func(ctx context.Context, tx *sql.Tx, key string) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO effects (`key`) VALUES (?)", key)
			return err
		},
		Effects: func(ctx context.Context, key string) (n int, err error) {
			err = db.QueryRowContext(ctx, "SELECT count(*) FROM effects WHERE `key` = ?", key).Scan(&n)
			return n, err
		},
		Age: func(ctx context.Context, consumer, id string, d time.Duration) error {
			_, err := db.ExecContext(ctx, `UPDATE `+inboxTable+` SET processed_at = UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND WHERE consumer = ? AND event_id = ?`,
				d.Microseconds(), consumer, id)
			return err
		},
		Records: func(ctx context.Context, consumer string) (n int, err error) {
			err = db.QueryRowContext(ctx, `SELECT count(*) FROM `+inboxTable+` WHERE consumer = ?`, consumer).Scan(&n)
			return n, err
		},
		WaitBlocked: func(ctx context.Context) error { return waitLockWait(ctx, db, name) },
	}
}

// waitLockWait polls, until ctx's deadline, for a connection to database
// to run the claim's INSERT: while the other transaction holds the
// record, InnoDB keeps it waiting. (information_schema.INNODB_TRX would
// say so directly, but it is a cache that concurrent pollers can keep
// from ever refreshing.)
func waitLockWait(ctx context.Context, db *sql.DB, database string) error {
	deadline, _ := ctx.Deadline()
	return await.Poll(time.Until(deadline), func() error {
		var n int
		err := db.QueryRowContext(ctx, `SELECT count(*) FROM information_schema.PROCESSLIST
			WHERE db = ? AND command IN ('Query', 'Execute') AND info LIKE 'INSERT INTO%ON DUPLICATE KEY UPDATE event_id = event_id'`,
			database).Scan(&n)
		if err != nil {
			return err
		}
		if n == 0 {
			return errors.New("no connection to " + database + " runs the claim's INSERT")
		}
		return nil
	})
}

func TestConformanceMySQL(t *testing.T) { inboxtest.Run(t, mysqlEnv) }

// tablesLike lists the tables of database name starting with prefix.
func tablesLike(t *testing.T, db *sql.DB, name, prefix string) string {
	t.Helper()
	rows, err := db.Query(`SELECT table_name FROM information_schema.tables WHERE table_schema = ? AND table_name LIKE ? ORDER BY table_name`, name, prefix+"%")
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
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(names, ",")
}

// TestMigrateMySQL: concurrent migrators apply the schema once, a second
// run applies nothing, an empty schema is the current database, down 0
// drops everything, and hostile names are refused.
func TestMigrateMySQL(t *testing.T) {
	db, name := openMySQL(t, nil)
	ctx := testenv.Context(t, 60*time.Second)
	tbl := outboxdriver.Table{Name: "events_in"} // the DSN's database
	const migrators = 4
	applied := make([][]int, migrators)
	errs := make([]error, migrators)
	var wg sync.WaitGroup
	for i := range migrators {
		wg.Go(func() { applied[i], errs[i] = inboxsql.Migrate(ctx, db, inboxsql.MySQL, tbl) })
	}
	wg.Wait()
	total := 0
	for i := range migrators {
		if errs[i] != nil {
			t.Fatalf("migrator %d: %v", i, errs[i])
		}
		total += len(applied[i])
	}
	if total != inboxsql.LatestVersion(inboxsql.MySQL) {
		t.Fatalf("concurrent migrators applied %v in all, want each version once", applied)
	}
	if vs, err := inboxsql.Migrate(ctx, db, inboxsql.MySQL, outboxdriver.Table{Schema: name, Name: "events_in"}); err != nil || len(vs) != 0 {
		t.Fatalf("second Migrate (schema named) = %v, %v; want nothing applied", vs, err)
	}
	if got, want := tablesLike(t, db, name, "events_in"), "events_in,events_in_dead_letter,events_in_migrations,events_in_versions"; got != want {
		t.Fatalf("tables %s, want %s", got, want)
	}
	var charset string
	if err := db.QueryRowContext(ctx, `SELECT character_set_name FROM information_schema.columns WHERE table_schema = ? AND table_name = 'events_in_dead_letter' AND column_name = 'error'`,
		name).Scan(&charset); err != nil || charset != "utf8mb4" {
		t.Fatalf("dead letter text is %q (%v), want utf8mb4", charset, err)
	}
	if vs, err := inboxsql.MigrateDown(ctx, db, inboxsql.MySQL, tbl, 0); err != nil || len(vs) != inboxsql.LatestVersion(inboxsql.MySQL) {
		t.Fatalf("MigrateDown 0 = %v, %v", vs, err)
	}
	if got := tablesLike(t, db, name, "events_in"); got != "" {
		t.Fatalf("tables after MigrateDown 0: %s", got)
	}
	if vs, err := inboxsql.MigrateDown(ctx, db, inboxsql.MySQL, tbl, 0); err != nil || len(vs) != 0 {
		t.Fatalf("MigrateDown 0 again = %v, %v; want nothing to revert", vs, err)
	}
	if _, err := inboxsql.Migrate(ctx, db, inboxsql.MySQL, tbl); err != nil {
		t.Fatalf("Migrate after MigrateDown: %v", err)
	}
	if inboxsql.LatestVersion(inboxsql.MySQL) != inboxsql.LatestVersion(inboxsql.Postgres) {
		t.Fatal("MySQL and PostgreSQL schema versions differ")
	}
	for _, bad := range []outboxdriver.Table{{Name: "x`; DROP TABLE y; --"}, {Schema: name + "`;", Name: "inbox"}, {Schema: name, Name: "a.b"}} {
		if _, err := inboxsql.Migrate(ctx, db, inboxsql.MySQL, bad); err == nil {
			t.Errorf("Migrate(%q) succeeded", bad)
		}
	}
	if _, err := inboxsql.MigrateDown(ctx, db, inboxsql.MySQL, tbl, inboxsql.LatestVersion(inboxsql.MySQL)+1); err == nil {
		t.Error("MigrateDown to a version past the latest succeeded")
	}
}

// TestMySQLMigrationCutShortIsCompleted: a migration interrupted after
// some of its tables (MySQL commits DDL at once) is finished by the next
// run.
func TestMySQLMigrationCutShortIsCompleted(t *testing.T) {
	db, name := openMySQL(t, nil)
	ctx := testenv.Context(t, 30*time.Second)
	tbl := outboxdriver.Table{Schema: name, Name: "inbox"}
	if _, err := inboxsql.Migrate(ctx, db, inboxsql.MySQL, tbl); err != nil {
		t.Fatal(err)
	}
	// As if the first run had died after two tables, before recording.
	for _, st := range []string{"DROP TABLE inbox_dead_letter", "DELETE FROM inbox_migrations"} {
		if _, err := db.ExecContext(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	if vs, err := inboxsql.Migrate(ctx, db, inboxsql.MySQL, tbl); err != nil || len(vs) != inboxsql.LatestVersion(inboxsql.MySQL) {
		t.Fatalf("Migrate after a cut-short run = %v, %v; want every version applied", vs, err)
	}
	if got, want := tablesLike(t, db, name, "inbox"), "inbox,inbox_dead_letter,inbox_migrations,inbox_versions"; got != want {
		t.Fatalf("tables %s, want %s", got, want)
	}
}

func mysqlMsg(aggregate string, version int64) inbox.Message {
	m := inbox.Message{EventID: uuid.Must(uuid.NewV7()).String(), AggregateType: "order", AggregateID: aggregate, Type: "Changed"}
	if version > 0 {
		m.Version, m.HasVersion = version, true
	}
	return m
}

// TestMySQLDefaultSchemaIsCurrentDatabase: with no schema, the inbox uses
// the connection's database, unqualified, with parseTime and interpolated
// parameters too.
func TestMySQLDefaultSchemaIsCurrentDatabase(t *testing.T) {
	db, name := openMySQL(t, func(c *mysql.Config) { c.ParseTime, c.InterpolateParams = true, true })
	ctx := testenv.Context(t, 30*time.Second)
	if _, err := inboxsql.Migrate(ctx, db, inboxsql.MySQL, outboxdriver.Table{}); err != nil {
		t.Fatal(err)
	}
	drv, err := inboxsql.New(db, inboxsql.MySQL)
	if err != nil {
		t.Fatal(err)
	}
	if drv.DefaultSchema() != "" {
		t.Fatalf("DefaultSchema = %q, want the current database (empty)", drv.DefaultSchema())
	}
	ib, err := inbox.New(drv, &inbox.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	m := mysqlMsg("1", 0)
	for i, want := range []bool{true, false} {
		r, err := ib.Handle(ctx, m, func(context.Context, *sql.Tx) error { return nil })
		if err != nil || r.Applied() != want {
			t.Fatalf("delivery %d: %+v, %v; want applied=%v", i, r, err, want)
		}
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM `"+name+"`.inbox WHERE consumer = 'billing'").Scan(&n); err != nil || n != 1 {
		t.Fatalf("records in %s.inbox = %d, %v; want 1", name, n, err)
	}
	if err := ib.DeadLetter(ctx, mysqlMsg("1", 0), errors.New("poison")); err != nil {
		t.Fatal(err)
	}
	dls, err := ib.DeadLetters(ctx, 10)
	if err != nil || len(dls) != 1 || time.Since(dls[0].DeadLetteredAt).Abs() > time.Hour {
		t.Fatalf("DeadLetters = %+v, %v; want one, dead-lettered about now", dls, err)
	}
	if _, err := inbox.New(drv, &inbox.Config{Consumer: "billing", Table: "x`y"}); err == nil {
		t.Fatal("inbox.New accepted a hostile table name")
	}
}

// TestMySQLRefusesFoundRows: with clientFoundRows a duplicate would look
// new; the driver finds out on its first new event and refuses, recording
// nothing.
func TestMySQLRefusesFoundRows(t *testing.T) {
	db, name := openMySQL(t, func(c *mysql.Config) { c.ClientFoundRows = true })
	ctx := testenv.Context(t, 30*time.Second)
	tbl := outboxdriver.Table{Schema: name, Name: "inbox"}
	if _, err := inboxsql.Migrate(ctx, db, inboxsql.MySQL, tbl); err != nil {
		t.Fatal(err)
	}
	drv, err := inboxsql.New(db, inboxsql.MySQL)
	if err != nil {
		t.Fatal(err)
	}
	ib, err := inbox.New(drv, &inbox.Config{Consumer: "billing", Schema: name})
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	_, err = ib.Handle(ctx, mysqlMsg("1", 0), func(context.Context, *sql.Tx) error { ran = true; return nil })
	if err == nil || !strings.Contains(err.Error(), "clientFoundRows") {
		t.Fatalf("Handle = %v, want an error naming clientFoundRows", err)
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM inbox").Scan(&n); err != nil || n != 0 || ran {
		t.Fatalf("records = %d (%v), handler ran = %v; want nothing", n, err, ran)
	}
}

// TestMySQLVersionGuardUnderConcurrency delivers versions 1..N of one
// aggregate from several goroutines at once, in shuffled order: the
// applied ones, in the order they took the aggregate's row, must rise
// strictly, and N must be among them.
func TestMySQLVersionGuardUnderConcurrency(t *testing.T) {
	db, name := openMySQL(t, nil)
	ctx := testenv.Context(t, 60*time.Second)
	tbl := outboxdriver.Table{Schema: name, Name: "inbox"}
	if _, err := inboxsql.Migrate(ctx, db, inboxsql.MySQL, tbl); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE applied (seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, version BIGINT NOT NULL) ENGINE=InnoDB`); err != nil {
		t.Fatal(err)
	}
	drv, err := inboxsql.New(db, inboxsql.MySQL)
	if err != nil {
		t.Fatal(err)
	}
	const versions, workers = 40, 4
	order := make([]int64, versions)
	for i := range order {
		order[i] = int64((i*17)%versions + 1) // a permutation of 1..40
	}
	var next sync.Mutex
	pos := 0
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		ib, err := inbox.New(drv, &inbox.Config{Consumer: "projection", Schema: name})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for {
				next.Lock()
				if pos == len(order) {
					next.Unlock()
					return
				}
				v := order[pos]
				pos++
				next.Unlock()
				_, err := ib.Handle(ctx, mysqlMsg("7", v), func(ctx context.Context, tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, `INSERT INTO applied (version) VALUES (?)`, v)
					return err
				})
				if err != nil {
					errs <- fmt.Errorf("version %d: %w", v, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	rows, err := db.QueryContext(ctx, `SELECT version FROM applied ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []int64
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		got = append(got, v)
	}
	if len(got) == 0 || got[len(got)-1] != versions || !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
		t.Fatalf("applied versions in lock order %v: want strictly rising, ending at %d", got, versions)
	}
	var stored int64
	if err := db.QueryRowContext(ctx, `SELECT version FROM inbox_versions WHERE consumer = 'projection' AND aggregatetype = 'order' AND aggregateid = '7'`).Scan(&stored); err != nil || stored != versions {
		t.Fatalf("stored version %d, %v; want %d", stored, err, versions)
	}
	// An aggregate id longer than the MySQL key is refused, not truncated
	// into another aggregate's key.
	ib, err := inbox.New(drv, &inbox.Config{Consumer: "projection", Schema: name})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ib.Handle(ctx, mysqlMsg(strings.Repeat("x", 256), 1), func(context.Context, *sql.Tx) error { return nil }); err == nil || !strings.Contains(err.Error(), "at most 255") {
		t.Fatalf("a 256-character aggregate id: %v, want refused", err)
	}
}

func TestParseDialectMySQL(t *testing.T) {
	for _, s := range []string{"mysql", "mariadb"} {
		if d, err := inboxsql.ParseDialect(s); err != nil || d != inboxsql.MySQL {
			t.Errorf("ParseDialect(%s) = %v, %v", s, d, err)
		}
	}
	if inboxsql.MySQL.String() != "mysql" {
		t.Errorf("MySQL.String() = %q", inboxsql.MySQL.String())
	}
}
