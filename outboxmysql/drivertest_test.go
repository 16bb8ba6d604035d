package outboxmysql_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxdrivertest"
	"github.com/outboxkit/outbox/outboxmysql"
)

// TestConformance runs the driver conformance suite against MariaDB (or
// the MySQL that OUTBOX_TEST_MYSQL_DSN names), each case in a fresh
// database.
func TestConformance(t *testing.T) {
	db := openDB(t, "")
	outboxdrivertest.Run(t, outboxdrivertest.Harness{
		Name:  "mysql",
		Store: outboxmysql.New(db),
		NewTable: func(t testing.TB) outboxdriver.Table {
			return outboxdriver.Table{Schema: newDatabase(t, db), Name: "outbox"}
		},
		Write: func(ctx context.Context, tb outboxdriver.Table, commit bool, events ...outbox.Event) error {
			return write(ctx, db, tb, commit, events...)
		},
		ExecInsert: func(ctx context.Context, tb outboxdriver.Table, id, aggregateType, aggregateID, typ, payloadJSON string) error {
			return execInsert(ctx, db, tb, id, aggregateType, aggregateID, typ, payloadJSON)
		},
		DeliverAtVersion: 4,
		ExecDelay: func(ctx context.Context, tb outboxdriver.Table, id, column string, d time.Duration) error {
			_, err := db.ExecContext(ctx, "UPDATE `"+tb.Schema+"`.`"+tb.Name+"` SET `"+column+"` = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE id = ?",
				d.Microseconds(), id)
			return err
		},
		// MariaDB keeps a JSON column's text as written; MySQL stores
		// binary JSON and gives back its own encoding.
		NormalizesJSON: !isMariaDB(t, db),
		Parallel:       true,
	})
}

func isMariaDB(t *testing.T, db *sql.DB) bool {
	t.Helper()
	var v string
	if err := db.QueryRowContext(context.Background(), `SELECT VERSION()`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return strings.Contains(strings.ToLower(v), "mariadb")
}
