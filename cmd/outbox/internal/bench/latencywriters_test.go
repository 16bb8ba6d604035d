package bench_test

import (
	"testing"
	"time"

	"github.com/outboxkit/outbox/cmd/outbox/internal/bench"
	"github.com/outboxkit/outbox/internal/testenv"
)

// With PlainWrites, the notify cell runs beside itself with writers in
// ordinary transactions on a pgx.Tx and a *sql.Tx (every event of theirs
// must arrive), and the baselines without an outbox and with Watermill's
// row measure the writers alone.
func TestLatencyPlainWritersBesideThePipelinedOnes(t *testing.T) {
	pool := bigPool(t)
	ctx := testenv.Context(t, 3*time.Minute)
	want := []string{"notify", "notify_pgx", "notify_sql", bench.WriterOrderOnly, bench.WriterWatermill}
	res, err := bench.CommitToConsumer(ctx, bench.Config{Pool: pool, Schema: testenv.Name("bench"), Sink: testenv.NATSURL(),
		Duration: 500 * time.Millisecond, Warmup: 100 * time.Millisecond, Rates: []int{300}, Cases: want, PlainWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(want) {
		t.Fatalf("%d results, want %d", len(res), len(want))
	}
	for i, r := range res {
		if r.Case != want[i] {
			t.Fatalf("result %d is %s, want %s", i, r.Case, want[i])
		}
		d := r.Delivery
		if r.Ops == 0 || r.Latency.Count != r.Ops || d.OfferedPerSecond != 300 {
			t.Errorf("%s: %d ops, latency %+v, offered %d", r.Case, r.Ops, r.Latency, d.OfferedPerSecond)
		}
		baseline := r.Case == bench.WriterOrderOnly || r.Case == bench.WriterWatermill
		if baseline != (d.Events == 0) {
			t.Errorf("%s: %d events delivered", r.Case, d.Events)
		}
	}
}
