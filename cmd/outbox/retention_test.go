package main

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
)

// migrate --time-partitions, outbox retention and outbox status together,
// and what they refuse.
func TestTimePartitionsFromTheCommandLine(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, 60*time.Second)
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	db := []string{"--db", dbURL(), "--schema", tb.Schema, "--table", tb.Name}

	failsWithOneLine(t, nil, "--time-partitions goes with the creation of an outbox table only", append([]string{"migrate", "--time-partitions", "day", "--cdc"}, db...)...)
	failsWithOneLine(t, nil, `time partitions "week": use "day" or "hour"`, append([]string{"migrate", "--time-partitions", "week"}, db...)...)
	failsWithOneLine(t, nil, "time partitions are made on PostgreSQL only",
		"migrate", "--time-partitions", "day", "--db", "sqlite://"+filepath.Join(t.TempDir(), "tp.db"))
	if _, stderr, code := run(t, nil, append([]string{"migrate", "--time-partitions", "day", "--time-partitions-ahead", "2"}, db...)...); code != 0 {
		t.Fatalf("migrate --time-partitions day: %s", stderr)
	}

	// A day ten days back, every event of it published two days ago.
	lo := time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, -10)
	old := tb.Name + "_p" + lo.Format("20060102")
	if _, err := pool.Exec(ctx, `CREATE TABLE `+outboxdriver.QuoteIdent(tb.Schema)+`.`+outboxdriver.QuoteIdent(old)+` PARTITION OF `+tb.Qualified("")+
		` FOR VALUES FROM ('`+lo.Format(time.RFC3339)+`') TO ('`+lo.AddDate(0, 0, 1).Format(time.RFC3339)+`')`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+tb.Qualified("")+` (id, aggregatetype, aggregateid, type, payload, created_at, published_at)
VALUES (gen_random_uuid(), 'order', '1', 'Placed', '{}', $1, now() - interval '2 days')`, lo.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	out, stderr, code := run(t, nil, append([]string{"status"}, db...)...)
	if code != 0 || !strings.Contains(out, "time partitions           4 by day (") || !strings.Contains(out, "2 ahead") {
		t.Fatalf("status: code %d\n%s%s", code, out, stderr)
	}
	// Within the window: kept; past it: dropped, and audited.
	if out, stderr, code := run(t, nil, append([]string{"retention", "--keep-for", "72h"}, db...)...); code != 0 || !strings.Contains(out, "waiting  "+old) {
		t.Fatalf("retention --keep-for 72h: code %d\n%s%s", code, out, stderr)
	}
	out, stderr, code = run(t, nil, append([]string{"retention", "--keep-for", "24h", "--actor", "ops-cron", "--json"}, db...)...)
	var changes []outboxdriver.TimePartitionChange
	if code != 0 || json.Unmarshal([]byte(out), &changes) != nil || !slices.Contains(changes, outboxdriver.TimePartitionChange{Action: "dropped", Partition: old}) {
		t.Fatalf("retention --keep-for 24h: code %d\n%s%s", code, out, stderr)
	}
	if out, _, code := run(t, nil, append([]string{"audit"}, db...)...); code != 0 || !strings.Contains(out, "ops-cron") || !strings.Contains(out, "partition-drop") {
		t.Fatalf("audit after the drop:\n%s", out)
	}
	out, stderr, code = run(t, nil, append([]string{"status", "--json"}, db...)...)
	var st ops.StatusJSON
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.TimePartitions == nil || st.TimePartitions.Unit != "day" || !st.TimePartitions.Oldest.After(lo) {
		t.Fatalf("status --json: code %d\n%s%s", code, out, stderr)
	}

	// A table made without them has nothing to maintain.
	plain := testenv.Table(t, pool)
	pdb := []string{"--db", dbURL(), "--schema", plain.Schema, "--table", plain.Name}
	if _, stderr, code := run(t, nil, append([]string{"migrate"}, pdb...)...); code != 0 {
		t.Fatal(stderr)
	}
	failsWithOneLine(t, nil, "is not partitioned by time: nothing to maintain", append([]string{"retention"}, pdb...)...)
	failsWithOneLine(t, nil, "is not converted", append([]string{"migrate", "--time-partitions", "hour"}, pdb...)...)
}
