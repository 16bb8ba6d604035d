package bench_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/cmd/outbox/internal/bench"
	"github.com/outboxkit/outbox/internal/testenv"
)

// cdcPool is a pool on testenv.CDCDatabase with room for the latency
// scenario's writers. The scenarios make tables (and slots) there: run
// them inside testenv.CDCTurn.
func cdcPool(t *testing.T) (*pgxpool.Pool, *pgxpool.Pool) {
	t.Helper()
	small := testenv.CDCPool(t)
	pool, err := pgxpool.New(context.Background(), testenv.CDCDatabaseURL(t)+"&pool_max_conns=16")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, small
}

// The write modes add their cases, and each checks what it wrote: no
// row for a message or an insert+delete, a row per commit through
// database/sql, a plain row per commit for the plain INSERT in the
// order's batch.
func TestWriteModes(t *testing.T) {
	pool, turn := cdcPool(t)
	var results []bench.Result
	testenv.CDCTurn(t, turn, func() {
		var err error
		results, err = bench.WritePath(context.Background(), bench.Config{Pool: pool, Schema: testenv.Name("bench"),
			Duration: 300 * time.Millisecond, Warmup: 50 * time.Millisecond, Writers: []int{2}, Rounds: 1,
			WriteModes: bench.WriteModes()})
		if err != nil {
			t.Fatal(err)
		}
	})
	got := map[string]bench.Result{}
	for _, r := range results {
		got[r.Case] = r
	}
	for c, perCommit := range map[string]int64{bench.CaseOutboxMessage: 0, bench.CaseOutboxMessageQueue: 0, bench.CaseOutboxMessageCommit: 0,
		bench.CaseOutboxInsertDelete: 0, bench.CaseOutboxInsertDeleteQueue: 0, bench.CaseOutboxInsertDeleteCommit: 0, bench.CasePlainInsertQueue: 0,
		bench.CaseBaselineSQL: 0, bench.CaseOutboxSQL: 1} {
		r, ok := got[c]
		if !ok {
			t.Fatalf("no %s case in %d results", c, len(results))
		}
		committed := r.Counters[bench.CounterCommitted]
		if committed == 0 || r.Counters[bench.CounterOutboxRows] != perCommit*committed {
			t.Fatalf("%s: counters %v, want %d outbox row(s) per commit", c, r.Counters, perCommit)
		}
		wantPlain := int64(0)
		if c == bench.CasePlainInsertQueue {
			wantPlain = committed
		}
		if r.Counters[bench.CounterPlainRows] != wantPlain {
			t.Fatalf("%s: counters %v, want %d plain rows", c, r.Counters, wantPlain)
		}
	}
	if _, err := bench.WritePath(context.Background(), bench.Config{Pool: pool, WriteModes: []string{"binlog"}}); err == nil {
		t.Fatal("an unknown write mode was accepted")
	}
}

// --source cdc drains the same backlog once more from the WAL, compared
// with the polling relay of the same run, and the latency scenario's
// relay tails the WAL; both fail when an event does not arrive.
func TestLogTailingScenarios(t *testing.T) {
	pool, turn := cdcPool(t)
	ctx := testenv.Context(t, 4*time.Minute)
	testenv.CDCTurn(t, turn, func() {
		res, err := bench.Drain(ctx, bench.Config{Pool: pool, Schema: testenv.Name("bench"), Events: 3000, Batch: 200,
			Sink: testenv.NATSURL(), Source: bench.SourceCDC, Rounds: 2})
		if err != nil {
			t.Fatal(err)
		}
		if len(res) != 5 || res[3].Case != bench.CaseDrainRelayCDC || res[4].Case != bench.CaseDrainRelayCDCMessages {
			t.Fatalf("drain results %+v, want raw_sql, raw_broker, relay, relay_cdc, relay_cdc_messages", res)
		}
		// Two pairs of drains, in alternating order: each drain of each
		// source and write mode counted (the consumer saw every event,
		// or Drain failed), and the pairs' ratios reported.
		if len(res[2].RoundsPerSecond) != 2 {
			t.Fatalf("drains of the polling relay %v, want 2", res[2].RoundsPerSecond)
		}
		for _, r := range res[3:] {
			if r.Ops != 3000 || r.PerSecond <= 0 {
				t.Fatalf("%s: %d events at %v/s, want 3000", r.Case, r.Ops, r.PerSecond)
			}
			if d := r.Delivery; d.VsPollRelay != r.PerSecond/res[2].PerSecond {
				t.Fatalf("%s vs the polling relay %v, want %v", r.Case, d.VsPollRelay, r.PerSecond/res[2].PerSecond)
			}
			if len(r.RoundsPerSecond) != 2 {
				t.Fatalf("drains of %s %v, want 2", r.Case, r.RoundsPerSecond)
			}
			vb := r.VsBaseline
			if vb == nil || vb.Case != bench.CaseDrainRelay || len(vb.RoundRatios) != 2 || vb.Ratio != (vb.RoundRatios[0]+vb.RoundRatios[1])/2 {
				t.Fatalf("%s's pair ratios %+v, want two and their median", r.Case, vb)
			}
			for i, x := range vb.RoundRatios {
				if x <= 0 {
					t.Fatalf("%s: pair %d's ratio %v", r.Case, i+1, x)
				}
			}
		}
		res, err = bench.CommitToConsumer(ctx, bench.Config{Pool: pool, Schema: testenv.Name("bench"), Sink: testenv.NATSURL(),
			Duration: 500 * time.Millisecond, Warmup: 100 * time.Millisecond, Rates: []int{500}, Cases: []string{"notify_pgx"},
			Source: bench.SourceCDC, PlainWrites: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(res) != 1 || res[0].Latency.Count == 0 || res[0].Latency.Count != res[0].Ops {
			t.Fatalf("latency results %+v", res)
		}
	})
	var slots int
	if err := turn.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'outbox_outbox_bench_%'`).Scan(&slots); err != nil || slots != 0 {
		t.Fatalf("%d replication slots left behind (%v)", slots, err)
	}
}
