package outboxpgx

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/driverkit"
)

// Counting without reading every row, for the console (EstimateStatus,
// Backlog, RecordSample): a count is exact up to a bound (a LIMIT under
// the count, so it stops there) and an estimate above it.

// count is a count and whether it is an estimate.
type count struct {
	n         int64
	estimated bool
}

// counts are the numbers of the overview and of a sample.
type counts struct {
	backlog, published, dead count
	// oldestAge is the age, in seconds, of the first unpublished event by
	// position (0 when there is none).
	oldestAge float64
	// lastSeq is the highest position handed out.
	lastSeq int64
}

// sampleBlocks is about how many blocks of the table a sample reads.
const sampleBlocks = 256

// countTable counts the backlog, the published rows kept and the dead
// letters of the tables n, each exact up to bound and estimated above.
// The backlog's estimate is the planner's, at most the span of the
// unpublished positions.
func countTable(ctx context.Context, db *pgxpool.Pool, n driverkit.Names, bound int64) (counts, error) {
	var c counts
	var first, last *int64
	err := db.QueryRow(ctx, `SELECT
    (SELECT count(*) FROM (SELECT 1 FROM `+n.Table+` WHERE published_at IS NULL LIMIT $1) b),
    (SELECT count(*) FROM (SELECT 1 FROM `+n.Table+` WHERE published_at IS NOT NULL LIMIT $1) p),
    (SELECT count(*) FROM (SELECT 1 FROM `+n.DeadLetter+` LIMIT $1) d),
    coalesce((SELECT greatest(extract(epoch FROM now() - created_at), 0) FROM `+n.Table+` WHERE published_at IS NULL ORDER BY seq LIMIT 1), 0)::float8,
    (SELECT seq FROM `+n.Table+` WHERE published_at IS NULL ORDER BY seq LIMIT 1),
    (SELECT seq FROM `+n.Table+` WHERE published_at IS NULL ORDER BY seq DESC LIMIT 1),
    coalesce(pg_sequence_last_value(pg_get_serial_sequence($2, 'seq')::regclass), 0)`, bound+1, n.Table).
		Scan(&c.backlog.n, &c.published.n, &c.dead.n, &c.oldestAge, &first, &last, &c.lastSeq)
	if err != nil {
		return c, err
	}
	for _, x := range []struct {
		c   *count
		sql string
	}{
		{&c.backlog, `SELECT 1 FROM ` + n.Table + ` WHERE published_at IS NULL`},
		{&c.published, `SELECT 1 FROM ` + n.Table + ` WHERE published_at IS NOT NULL`},
		{&c.dead, `SELECT 1 FROM ` + n.DeadLetter},
	} {
		if x.c.n <= bound {
			continue
		}
		est, err := plannerRows(ctx, db, x.sql)
		if err != nil {
			return c, err
		}
		if x.c == &c.backlog && first != nil && last != nil {
			est = min(est, *last-*first+1)
		}
		*x.c = count{max(est, bound+1), true}
	}
	return c, nil
}

// plannerRows is the planner's estimate of the rows query returns: from
// the statistics of the last ANALYZE, scaled to the table's size now.
func plannerRows(ctx context.Context, db *pgxpool.Pool, query string) (int64, error) {
	var plan []byte
	if err := db.QueryRow(ctx, `EXPLAIN (FORMAT JSON) `+query).Scan(&plan); err != nil {
		return 0, fmt.Errorf("estimate rows: %w", err)
	}
	var p []struct {
		Plan struct {
			Rows float64 `json:"Plan Rows"`
		} `json:"Plan"`
	}
	if err := json.Unmarshal(plan, &p); err != nil || len(p) == 0 {
		return 0, fmt.Errorf("estimate rows: cannot read the plan %.100s", plan)
	}
	return int64(p[0].Plan.Rows), nil
}

// sampleFraction is the percentage of table's blocks that makes a
// TABLESAMPLE SYSTEM of about sampleBlocks blocks.
func sampleFraction(ctx context.Context, db *pgxpool.Pool, table string) (float64, error) {
	var blocks int64
	if err := db.QueryRow(ctx, `SELECT pg_relation_size($1::regclass) / current_setting('block_size')::bigint`, table).Scan(&blocks); err != nil {
		return 0, fmt.Errorf("size of %s: %w", table, err)
	}
	if blocks <= sampleBlocks {
		return 100, nil
	}
	return 100 * float64(sampleBlocks) / float64(blocks), nil
}
