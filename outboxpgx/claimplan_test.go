package outboxpgx

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// A claim must not trust the table's statistics. An outbox table is
// usually analyzed while it holds a handful of rows; when a backlog builds
// up (a broker outage), a planner trusting those statistics reads every
// pending row of the relay's partitions and sorts them for each claim.
// The claim's transaction runs without sorts, so the (seq) index hands
// over the first rows in order and the scan stops at the limit.
func TestClaimReadsTheBacklogInOrderWhateverTheStatistics(t *testing.T) {
	r := newFloorRig(t)
	ctx := context.Background()
	table := r.table.Qualified("")
	fill := func(n int) {
		t.Helper()
		_, err := r.pool.Exec(ctx, `INSERT INTO `+table+` (id, aggregatetype, aggregateid, type, payload)
SELECT gen_random_uuid(), 'order', (g % 1000)::text, 'Placed', '{}' FROM generate_series(1, $1) g`, n)
		if err != nil {
			t.Fatal(err)
		}
	}
	// Autovacuum must not refresh the statistics while the test runs.
	if _, err := r.pool.Exec(ctx, `ALTER TABLE `+table+` SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	// An index an operator may add (tables before schema version 10 had
	// one by partition, a column version 18 no longer fills): with these
	// statistics it tempts the planner into reading the rows through it and
	// sorting them.
	if _, err := r.pool.Exec(ctx, `CREATE INDEX ON `+table+` (next_attempt_at, seq) WHERE published_at IS NULL`); err != nil {
		t.Fatal(err)
	}
	fill(100)
	if _, err := r.pool.Exec(ctx, `ANALYZE `+table); err != nil {
		t.Fatal(err)
	}
	fill(20_000)
	var reltuples float64
	if err := r.pool.QueryRow(ctx, `SELECT reltuples FROM pg_class WHERE oid = $1::regclass`, table).Scan(&reltuples); err != nil {
		t.Fatal(err)
	}
	if reltuples > 1000 {
		t.Fatalf("precondition: the statistics should still describe 100 rows, reltuples = %v", reltuples)
	}

	// The plan of the claim exactly as Claim sends it, after its settings.
	parts, epochs := leaseArrays(r.leases)
	plan := func(extra string) string {
		t.Helper()
		tx, err := r.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, r.src.q.settings, strconv.Itoa(30_000)); err != nil {
			t.Fatal(err)
		}
		if extra != "" {
			if _, err := tx.Exec(ctx, extra); err != nil {
				t.Fatal(err)
			}
		}
		rows, _ := tx.Query(ctx, `EXPLAIN `+r.src.q.claim, 500, parts, epochs, r.src.Cfg.RelayName, r.src.lockKey, int64(0), int64(0), []string{})
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(lines, "\n")
	}
	if p := plan(`SET LOCAL enable_sort = on`); !strings.Contains(p, "Sort") {
		t.Fatalf("precondition: with sorts allowed, these statistics should lead the planner to sort the backlog; plan:\n%s", p)
	}
	p := plan("")
	if strings.Contains(p, "Sort") || !strings.Contains(p, "Index Scan using "+r.table.Name+"_pending") {
		t.Fatalf("the claim does not read the (seq) index in order:\n%s", p)
	}

	// And the claim itself hands over the oldest events, in order.
	b, err := r.src.Claim(ctx, r.leases, 500)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	var first int64
	if err := r.pool.QueryRow(ctx, `SELECT min(seq) FROM `+table).Scan(&first); err != nil {
		t.Fatal(err)
	}
	recs := b.Records()
	if len(recs) != 500 {
		t.Fatalf("claimed %d records, want 500", len(recs))
	}
	for i, rec := range recs {
		if rec.Seq != first+int64(i) {
			t.Fatalf("record %d has seq %d, want %d", i, rec.Seq, first+int64(i))
		}
	}
}
