package outboxpgx_test

import (
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxpgx"
)

// Migration 26 stops, with the count and one of the ids, on a table where
// rows share an id, and applies nothing; once each id is held once it
// makes the key, from a unique index built beforehand (concurrently) when
// there is one.
func TestEventKeyMigrationRefusesSharedIDs(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, 2*time.Minute)
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	drv := outboxpgx.New(pool)
	if _, err := drv.Migrate(ctx, tb, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := drv.MigrateDown(ctx, tb, eventKeyVersion-1); err != nil {
		t.Fatal(err)
	}
	table := tb.Qualified("")
	const id = "01900000-0000-7000-8000-000000000026"
	for _, agg := range []string{"a", "b"} {
		if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', $2, 'Placed', '{}')`, id, agg); err != nil {
			t.Fatal(err)
		}
	}
	_, err := drv.Migrate(ctx, tb, nil)
	if err == nil || !strings.Contains(err.Error(), "1 event id(s) are held by more than one row") || !strings.Contains(err.Error(), id) {
		t.Fatalf("Migrate over two rows with one id: %v; want a refusal naming the count and the id", err)
	}
	if hasEventKey(t, ctx, pool, table) {
		t.Fatal("the key was made over two rows with one id")
	}
	var version int
	if err := pool.QueryRow(ctx, `SELECT max(version) FROM `+tb.Qualified("_migrations")).Scan(&version); err != nil || version != eventKeyVersion-1 {
		t.Fatalf("schema version %d (err %v) after the refusal, want %d", version, err, eventKeyVersion-1)
	}

	// The operator deletes the copy and builds the index without a lock.
	if _, err := pool.Exec(ctx, `DELETE FROM `+table+` WHERE id = $1 AND aggregateid = 'b'`, id); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE UNIQUE INDEX CONCURRENTLY `+tb.Name+`_id ON `+table+` (id)`); err != nil {
		t.Fatal(err)
	}
	var made uint32
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1)::oid`, tb.Qualified("_id")).Scan(&made); err != nil {
		t.Fatal(err)
	}
	if _, err := drv.Migrate(ctx, tb, nil); err != nil {
		t.Fatalf("Migrate once each id is held once: %v", err)
	}
	var keyIndex uint32
	if err := pool.QueryRow(ctx, `SELECT conindid FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'p'`, table).Scan(&keyIndex); err != nil {
		t.Fatalf("no primary key after the migration: %v", err)
	}
	if keyIndex != made {
		t.Fatalf("the key's index is %d, want the index built beforehand (%d)", keyIndex, made)
	}
}
