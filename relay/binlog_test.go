package relay_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/workload"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxmysql"
	mycdc "github.com/outboxkit/outbox/outboxmysql/cdc"
)

// The shared correctness tests against the binary log source of MySQL
// and MariaDB (source "binlog", testenv.ForEverySource): the table is in
// a database of its own on the test MariaDB, which needs a row-based
// binary log (docs/binlog.md; `bash .ci/test --setup-only` turns it on).

// newBinlogEnv is a migrated MariaDB table whose relays tail the binary
// log. The table is empty, so a first relay's snapshot relays nothing and
// it streams from the snapshot's position.
func newBinlogEnv(t *testing.T) *env {
	t.Helper()
	admin := testenv.MySQL(t, "")
	name := testenv.MySQLDatabase(t, admin, "rl")
	db := testenv.MySQL(t, name)
	tb := outboxdriver.Table{Schema: name, Name: "outbox"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := outboxmysql.New(db).Migrate(ctx, tb, nil); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(outboxmysql.New(db), &outbox.Config{Schema: tb.Schema, Table: tb.Name})
	if err != nil {
		t.Fatal(err)
	}
	_, js := testenv.JetStream(t)
	st, prefix := testenv.Stream(t, js)
	return &env{my: db, myOb: ob, dsn: testenv.MySQLConfig(t, name).FormatDSN(), table: tb, stream: st, prefix: prefix, js: js, source: "binlog"}
}

// binlogSource is a binary log source over db, its replication
// connection opened with dsn.
func (e *env) binlogSource(t *testing.T, db *sql.DB, dsn string) outboxdriver.Source {
	t.Helper()
	src, err := mycdc.NewSource(db, e.table, &mycdc.Config{DSN: dsn, SaveInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// qualified is the quoted name of e's table with suffix, in the SQL of
// e's database.
func (e *env) qualified(suffix string) string {
	if e.my != nil {
		return "`" + e.table.Schema + "`.`" + e.table.Name + suffix + "`"
	}
	return e.table.Qualified(suffix)
}

// exec runs a statement without arguments on e's database.
func (e *env) exec(t *testing.T, query string) {
	t.Helper()
	var err error
	if e.my != nil {
		_, err = e.my.ExecContext(context.Background(), query)
	} else {
		_, err = e.pool.Exec(context.Background(), query)
	}
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// queryRow runs a query without arguments on e's database and scans its
// one row into dest.
func (e *env) queryRow(t *testing.T, query string, dest ...any) {
	t.Helper()
	var err error
	if e.my != nil {
		err = e.my.QueryRowContext(context.Background(), query).Scan(dest...)
	} else {
		err = e.pool.QueryRow(context.Background(), query).Scan(dest...)
	}
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// begin opens a transaction that writes events; the returned func commits
// it. It is rolled back when the test ends without committing.
func (e *env) begin(t *testing.T, events ...outbox.Event) (commit func()) {
	t.Helper()
	ctx := context.Background()
	if e.my != nil {
		tx, err := e.my.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tx.Rollback() })
		if err := e.myOb.WriteTx(ctx, tx, events...); err != nil {
			t.Fatal(err)
		}
		return func() {
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		}
	}
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(ctx) })
	if err := e.ob.WriteTx(ctx, tx, events...); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// workload runs the workload of internal/workload on e's table.
func (e *env) workload(t *testing.T, cfg workload.Config) *workload.Result {
	t.Helper()
	var res *workload.Result
	var err error
	if e.my != nil {
		res, err = workload.RunMySQL(context.Background(), e.my, e.table, cfg)
	} else {
		res, err = workload.Run(context.Background(), e.pool, e.table, cfg)
	}
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// binlogRelayAccount is an account of its own for a binlog relay (its
// table rights, and the replication privileges on the server), so that a
// test can kill its connections alone; it returns the account's user, a
// pool connecting as it and its DSN.
func (e *env) binlogRelayAccount(t *testing.T) (string, *sql.DB, string) {
	t.Helper()
	admin := testenv.MySQL(t, "")
	user, db := testenv.MySQLAs(t, admin, "relay", e.table.Schema,
		"GRANT ALL PRIVILEGES ON `"+e.table.Schema+"`.* TO %s",
		"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO %s")
	cfg := testenv.MySQLConfig(t, e.table.Schema)
	cfg.User, cfg.Passwd = user, ""
	return user, db, cfg.FormatDSN()
}

// killConnections kills every connection of user on e's server (the
// replication connection among them) and returns how many.
func (e *env) killConnections(t *testing.T, user string) int {
	t.Helper()
	ctx := context.Background()
	rows, err := e.my.QueryContext(ctx, `SELECT id FROM information_schema.processlist WHERE user = ?`, user)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	rows.Close()
	n := 0
	for _, id := range ids {
		var my *mysql.MySQLError
		if _, err := e.my.ExecContext(ctx, `KILL CONNECTION ?`, id); err != nil {
			if errors.As(err, &my) && my.Number == 1094 { // gone meanwhile
				continue
			}
			t.Fatal(err)
		}
		n++
	}
	return n
}
