package outboxsqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxdrivertest"
	"github.com/outboxkit/outbox/outboxsqlite"
)

// TestDriverConformance runs the shared driver suite on a database file.
// SQLite serves one relay process per file, so the cases with several
// relays competing are left out, and the cases run one after another.
func TestDriverConformance(t *testing.T) {
	db := openDB(t)
	outboxdrivertest.Run(t, outboxdrivertest.Harness{
		Name:  "sqlite",
		Store: outboxsqlite.New(db),
		NewTable: func(t testing.TB) outboxdriver.Table {
			return outboxdriver.Table{Schema: outboxsqlite.Schema, Name: newTableName()}
		},
		Write: func(ctx context.Context, tb outboxdriver.Table, commit bool, events ...outbox.Event) error {
			return write(ctx, db, tb, commit, events...)
		},
		ExecInsert: func(ctx context.Context, tb outboxdriver.Table, id, aggregateType, aggregateID, typ, payload string) error {
			_, err := db.ExecContext(ctx, `INSERT INTO `+tb.Qualified("")+` (id, aggregatetype, aggregateid, type, payload)
				VALUES (?, ?, ?, ?, ?)`, id, aggregateType, aggregateID, typ, payload)
			return err
		},
		DeliverAtVersion: 3,
		ExecDelay: func(ctx context.Context, tb outboxdriver.Table, id, column string, d time.Duration) error {
			_, err := db.ExecContext(ctx, `UPDATE `+tb.Qualified("")+` SET `+column+` = strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.3f seconds', ? / 1000000.0))
				WHERE id = ?`, d.Microseconds(), id)
			return err
		},
		SingleRelay: true,
	})
}

// openDB opens a fresh database file in the test's temporary directory.
func openDB(t testing.TB) *sql.DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := outboxsqlite.Open(ctx, filepath.Join(t.TempDir(), "outbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// newTableName returns a table name no other test uses.
func newTableName() string {
	return "outbox_" + strings.ReplaceAll(uuid.NewString()[:13], "-", "")
}

// write inserts events through the Writer in one transaction of db, and
// commits it or rolls it back.
func write(ctx context.Context, db *sql.DB, tb outboxdriver.Table, commit bool, events ...outbox.Event) error {
	return testenv.WriteSQL(ctx, db, outboxsqlite.New(db), tb, commit, events...)
}
