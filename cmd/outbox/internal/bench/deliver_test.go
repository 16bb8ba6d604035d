package bench_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/cmd/outbox/internal/bench"
	"github.com/outboxkit/outbox/internal/testenv"
)

// TestDrainCountsEveryEvent runs the drain scenario on a small backlog
// against NATS and an in-process Kafka: each case must have moved the
// whole backlog (the scenario itself fails when the consumer misses an
// event or rows are left), and the relay is compared with the lower limit.
func TestDrainCountsEveryEvent(t *testing.T) {
	for _, sinkURL := range []string{testenv.NATSURL(), bench.KafkaInProcess} {
		t.Run(strings.Split(sinkURL, ":")[0], func(t *testing.T) {
			pool := bigPool(t)
			ctx := testenv.Context(t, 3*time.Minute)
			res, err := bench.Drain(ctx, bench.Config{Pool: pool, Schema: testenv.Name("bench"), Events: 3000, Batch: 200, Sink: sinkURL})
			if err != nil {
				t.Fatal(err)
			}
			if len(res) != 3 {
				t.Fatalf("%d results, want raw_sql, raw_broker, relay", len(res))
			}
			for i, c := range []string{bench.CaseDrainSQL, bench.CaseDrainBroker, bench.CaseDrainRelay} {
				r := res[i]
				if r.Case != c || r.Ops != 3000 || r.PerSecond <= 0 || r.Delivery == nil || r.Delivery.Events != 3000 {
					t.Fatalf("result %d: %+v", i, r)
				}
			}
			relay := res[2].Delivery
			want := res[2].PerSecond / min(res[0].PerSecond, res[1].PerSecond)
			if relay.VsLimit != want || relay.PeakHeapMiB <= 0 {
				t.Fatalf("relay figures %+v, want vs limit %.3f", relay, want)
			}
			var out bytes.Buffer
			if err := bench.WriteTable(&out, res); err != nil || !strings.Contains(out.String(), "vs limit") {
				t.Fatalf("table: %v\n%s", err, out.String())
			}
		})
	}
}

// TestLatencyMeasuresEveryCell runs the latency scenario briefly at one
// offered rate: every cell must report, the loaded ones with a latency per
// event committed in the window (the scenario fails when one never
// arrives), the idle ones without.
func TestLatencyMeasuresEveryCell(t *testing.T) {
	pool := bigPool(t)
	ctx := testenv.Context(t, 3*time.Minute)
	res, err := bench.CommitToConsumer(ctx, bench.Config{Pool: pool, Schema: testenv.Name("bench"), Sink: testenv.NATSURL(),
		Duration: 600 * time.Millisecond, Warmup: 100 * time.Millisecond, Rates: []int{2000}})
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]bool{}
	for _, r := range res {
		cases[r.Case] = true
		d := r.Delivery
		if d.OfferedPerSecond == 0 {
			if r.Latency.Count != 0 {
				t.Errorf("%s: idle cell with latencies %+v", r.Case, r.Latency)
			}
			continue
		}
		if r.Latency.Count == 0 || r.Latency.Count != r.Ops || r.Latency.P50 > r.Latency.Max || d.Events < r.Ops {
			t.Errorf("%s at %d/s: latency %+v for %d ops, %d events", r.Case, d.OfferedPerSecond, r.Latency, r.Ops, d.Events)
		}
	}
	for _, c := range []string{"idle", "idle_poll_10ms", "poll_500ms", "poll_10ms", "notify", "notify_long_tx"} {
		if !cases[c] {
			t.Errorf("no %s cell in %v", c, cases)
		}
	}
	if _, err := bench.CommitToConsumer(ctx, bench.Config{Pool: pool, Sink: "stdout:"}); err == nil || !strings.Contains(err.Error(), "latency needs nats://") {
		t.Fatalf("latency with the stdout sink: %v", err)
	}
}

// bigPool is a pool with room for the latency scenario's writers.
func bigPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	testenv.Pool(t) // fails clearly when PostgreSQL is down
	pool, err := pgxpool.New(context.Background(), testenv.DatabaseURL()+"&pool_max_conns=16")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
