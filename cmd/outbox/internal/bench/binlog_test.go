package bench_test

import (
	"testing"
	"time"

	"github.com/outboxkit/outbox/cmd/outbox/internal/bench"
	"github.com/outboxkit/outbox/internal/testenv"
)

// The binlog scenario drains a backlog and measures latency by polling
// and by the binary log on the test MariaDB (row-based binary log,
// docs/binlog.md), and reports the binary log's figures over polling's.
func TestBinlogScenario(t *testing.T) {
	t.Parallel()
	admin := testenv.MySQL(t, "")
	name := testenv.MySQLDatabase(t, admin, "bb")
	db := testenv.MySQL(t, name)
	ctx := testenv.Context(t, 5*time.Minute)
	res, err := bench.Binlog(ctx, bench.Config{MySQL: db, MySQLDSN: testenv.MySQLConfig(t, name).FormatDSN(), Events: 2000, Duration: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"drain_poll", "drain_binlog", "latency_poll", "latency_binlog"}
	if len(res) != len(want) {
		t.Fatalf("%d results, want %v", len(res), want)
	}
	for i, r := range res {
		if r.Case != want[i] || r.PerSecond <= 0 {
			t.Fatalf("result %d: %+v, want case %s with a rate", i, r, want[i])
		}
		if (i%2 == 1) != (r.VsBaseline != nil) || r.VsBaseline != nil && (r.VsBaseline.Case != want[i-1] || r.VsBaseline.Ratio <= 0) {
			t.Fatalf("%s compares with %+v", r.Case, r.VsBaseline)
		}
		if i >= 2 && (r.Latency.P50 <= 0 || r.Ops != 200) {
			t.Fatalf("%s: %d events, latency %+v", r.Case, r.Ops, r.Latency)
		}
	}
	var left int
	if err := admin.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = ? AND table_name LIKE 'outbox_bench_%'", name).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d tables left behind (%v)", left, err)
	}
}
