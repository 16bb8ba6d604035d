package outboxsqlite_test

import (
	"context"
	"errors"
	"testing"

	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxsqlite"
)

// A replication slot is PostgreSQL's: asked for one, Migrate refuses with
// ErrNoCDC and creates nothing.
func TestMigrateRefusesCDC(t *testing.T) {
	db := openDB(t)
	tb := outboxdriver.Table{Name: newTableName()}
	_, err := outboxsqlite.New(db).Migrate(context.Background(), tb, &outboxdriver.MigrateOptions{CDC: true})
	if !errors.Is(err, outboxdriver.ErrNoCDC) {
		t.Fatalf("Migrate with CDC: %v, want ErrNoCDC", err)
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM sqlite_master WHERE name = ?`, tb.Name).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d table(s) %s after the refusal (%v), want none", n, tb.Name, err)
	}
}
