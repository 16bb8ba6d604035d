package testenv

import (
	"context"
	"database/sql"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
)

// PoolMax is Pool with room for maxConns connections, for tests that hold
// many at once.
func PoolMax(t testing.TB, maxConns int) *pgxpool.Pool {
	t.Helper()
	Pool(t) // fails with how to start PostgreSQL when it is down
	url := DatabaseURL()
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, url+sep+"pool_max_conns="+strconv.Itoa(maxConns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// MySQLDatabase creates a fresh MySQL/MariaDB database through admin,
// dropped when the test ends, and returns its name.
func MySQLDatabase(t testing.TB, admin *sql.DB, prefix string) string {
	t.Helper()
	name := Name(prefix)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE `"+name+"`"); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
			t.Logf("drop database %s: %v", name, err)
		}
	})
	return name
}

// WriteSQL writes events to tb through the database/sql writer w in one
// transaction of db, and commits it or rolls it back.
func WriteSQL(ctx context.Context, db *sql.DB, w outboxdriver.Writer[*sql.Tx], tb outboxdriver.Table, commit bool, events ...outbox.Event) error {
	ob, err := outbox.New(w, &outbox.Config{Schema: tb.Schema, Table: tb.Name})
	if err != nil {
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := ob.WriteTx(ctx, tx, events...); err != nil {
		return err
	}
	if !commit {
		return tx.Rollback()
	}
	return tx.Commit()
}

// envMySQL points the tests at another MySQL or MariaDB (a go-sql-driver
// DSN naming a database the tests may create databases next to).
const envMySQL = "OUTBOX_TEST_MYSQL_DSN"

// mysqlDSN is the test MySQL/MariaDB's DSN.
func mysqlDSN() string {
	if dsn := os.Getenv(envMySQL); dsn != "" {
		return dsn
	}
	return "root@tcp(127.0.0.1:3306)/test"
}

// MySQLConfig is the configuration MySQL connects with: the test
// MySQL/MariaDB, interpolateParams and parseTime on, on database name (""
// keeps the DSN's). A test that connects through a proxy changes its Addr.
func MySQLConfig(t testing.TB, name string) *mysql.Config {
	t.Helper()
	cfg, err := mysql.ParseDSN(mysqlDSN())
	if err != nil {
		t.Fatalf("%s: %v", envMySQL, err)
	}
	cfg.InterpolateParams, cfg.ParseTime = true, true
	if name != "" {
		cfg.DBName = name
	}
	return cfg
}

// MySQL opens the test MySQL/MariaDB (interpolateParams and parseTime
// on) on database name ("" keeps the DSN's), closed when the test ends.
// It fails, saying how to start MariaDB, when the server does not answer.
func MySQL(t testing.TB, name string) *sql.DB {
	t.Helper()
	cfg := MySQLConfig(t, name)
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(20)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		t.Fatalf("cannot reach MySQL/MariaDB at %s (set %s to use another): %v; start it with: start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd", cfg.Addr, envMySQL, err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// NullStrings runs query, which selects a key and a nullable text, and
// returns its rows by key.
func NullStrings(t testing.TB, ctx context.Context, db *sql.DB, query string) map[string]sql.NullString {
	t.Helper()
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]sql.NullString{}
	for rows.Next() {
		var k string
		var v sql.NullString
		if err := rows.Scan(&k, &v); err != nil {
			t.Fatal(err)
		}
		got[k] = v
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// MySQLAs creates an account (any host, no password) named after prefix,
// runs grants (each a statement with %s where the quoted account goes)
// through admin, and returns the account's user name and a pool that
// connects as it to database name. The account goes when the test ends.
func MySQLAs(t testing.TB, admin *sql.DB, prefix, name string, grants ...string) (string, *sql.DB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	user := Name(prefix)
	account := "'" + user + "'@'%'"
	if _, err := admin.ExecContext(ctx, `CREATE USER `+account); err != nil {
		t.Fatalf("create account %s: %v", account, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, `DROP USER IF EXISTS `+account); err != nil {
			t.Logf("drop account %s: %v", account, err)
		}
	})
	for _, g := range grants {
		if _, err := admin.ExecContext(ctx, strings.ReplaceAll(g, "%s", account)); err != nil {
			t.Fatalf("%s: %v", g, err)
		}
	}
	cfg, err := mysql.ParseDSN(mysqlDSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Passwd, cfg.DBName = user, "", name
	cfg.InterpolateParams, cfg.ParseTime = true, true
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	as := sql.OpenDB(conn)
	as.SetMaxOpenConns(20)
	t.Cleanup(func() { as.Close() })
	return user, as
}
