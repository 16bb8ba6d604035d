package outboxsqlite

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// TestClaimPlanUsesTheWaitingIndex: the claim looks for an aggregate's
// earlier rows that are not due through the partial index <table>_waiting.
// SQLite uses a partial index only when the query's WHERE repeats the
// index's condition, so a claim and a migration that drift apart would
// make every claim search the table for every row it reads.
func TestClaimPlanUsesTheWaitingIndex(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := Open(ctx, filepath.Join(t.TempDir(), "plan.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tb := outboxdriver.Table{Schema: Schema, Name: "outbox"}
	if _, err := New(db).Migrate(ctx, tb, nil); err != nil {
		t.Fatal(err)
	}
	rows, err := db.QueryContext(ctx, `EXPLAIN QUERY PLAN `+newQueries(tb, outboxdriver.RetentionDelete).claim, "{}", "relay", 10, "[]")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(plan, "\n"), "SEARCH w USING INDEX outbox_waiting (aggregatetype=? AND aggregateid=? AND seq<?)") {
		t.Fatalf("the claim's plan does not search outbox_waiting for the earlier rows that wait:\n%s", strings.Join(plan, "\n"))
	}
}
