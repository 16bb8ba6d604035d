package outboxmysql_test

import (
	"context"
	"database/sql"
	"os"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxmysql"
)

// envMySQL points the tests at another MySQL or MariaDB (a go-sql-driver
// DSN naming a database the tests may create databases next to).
const envMySQL = "OUTBOX_TEST_MYSQL_DSN"

const startMariaDB = "start it with: start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd"

// dsn is the server the tests use.
func dsn() string {
	if d := os.Getenv(envMySQL); d != "" {
		return d
	}
	return "root@tcp(127.0.0.1:3306)/test"
}

// openDB opens dsn (with interpolateParams and parseTime) on database db
// ("" keeps the DSN's), closed when the test ends. It fails, saying how to
// start MariaDB, when the server does not answer.
func openDB(t testing.TB, db string) *sql.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn())
	if err != nil {
		t.Fatalf("%s: %v", envMySQL, err)
	}
	cfg.InterpolateParams, cfg.ParseTime = true, true
	if db != "" {
		cfg.DBName = db
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sdb := sql.OpenDB(conn)
	sdb.SetMaxOpenConns(20)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sdb.PingContext(ctx); err != nil {
		sdb.Close()
		t.Fatalf("cannot reach MySQL/MariaDB at %s (set %s to use another): %v; %s", cfg.Addr, envMySQL, err, startMariaDB)
	}
	t.Cleanup(func() { sdb.Close() })
	return sdb
}

// newDatabase creates a fresh database, dropped when the test ends, and
// returns its name.
func newDatabase(t testing.TB, admin *sql.DB) string {
	t.Helper()
	return testenv.MySQLDatabase(t, admin, "t")
}

// write inserts events through the driver in one transaction, committed
// or rolled back.
func write(ctx context.Context, db *sql.DB, tb outboxdriver.Table, commit bool, events ...outbox.Event) error {
	return testenv.WriteSQL(ctx, db, outboxmysql.New(db), tb, commit, events...)
}

// execInsert inserts one event with plain SQL, only the contract's columns.
func execInsert(ctx context.Context, db *sql.DB, tb outboxdriver.Table, id, aggregateType, aggregateID, typ, payloadJSON string) error {
	_, err := db.ExecContext(ctx, "INSERT INTO `"+tb.Schema+"`.`"+tb.Name+"` (id, aggregatetype, aggregateid, type, payload) VALUES (?, ?, ?, ?, ?)",
		id, aggregateType, aggregateID, typ, payloadJSON)
	return err
}
