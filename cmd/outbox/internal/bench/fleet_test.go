package bench_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/cmd/outbox/internal/bench"
	"github.com/outboxkit/outbox/internal/testenv"
)

// TestFleetFairnessReportsEveryCase runs the fleet scenario once with a
// small flood against NATS: each case reports a quiet and a flooded cell,
// every trickle event is timed (the scenario itself fails when one never
// arrives, or when the flood does not arrive whole), the flooded cells
// carry the flood's rate and the growth over the quiet figure, and the
// scenario's schema is gone afterwards.
func TestFleetFairnessReportsEveryCase(t *testing.T) {
	pool := bigPool(t)
	ctx := testenv.Context(t, 3*time.Minute)
	schema := testenv.Name("bench")
	res, err := bench.FleetFairness(ctx, bench.Config{Pool: pool, Schema: schema, Sink: testenv.NATSURL(), Events: 2000, Rounds: 1})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"budget_quiet", "budget_flooded", "unpaced_quiet", "unpaced_flooded", "no_budget_quiet", "no_budget_flooded"}
	if len(res) != len(want) {
		t.Fatalf("%d results, want %v", len(res), want)
	}
	for i, r := range res {
		if r.Case != want[i] || r.Scenario != "fleet" || r.Workers != bench.FleetSources {
			t.Fatalf("result %d: %s/%s with %d sources, want fleet/%s with %d", i, r.Scenario, r.Case, r.Workers, want[i], bench.FleetSources)
		}
		l := r.Latency
		if l.Count == 0 || l.Count != r.Counters["trickle_events"] || l.P50 <= 0 || l.P50 > l.P99 || l.P99 > l.Max {
			t.Errorf("%s: trickle latency %+v, %d trickle events", r.Case, l, r.Counters["trickle_events"])
		}
		if r.Counters["publish_p99_us"] <= 0 {
			t.Errorf("%s: no commit-to-publish p99 (%v)", r.Case, r.Counters)
		}
		flooded := strings.HasSuffix(r.Case, "_flooded")
		if flooded != (r.PerSecond > 0) || flooded != (r.Ops == 2000) {
			t.Errorf("%s: %.0f events/s over %d events", r.Case, r.PerSecond, r.Ops)
		}
		if _, ok := r.Counters["trickle_p99_vs_quiet_permille"]; flooded != ok {
			t.Errorf("%s: growth over the quiet figure reported: %v", r.Case, ok)
		}
	}
	var gone bool
	if err := pool.QueryRow(ctx, `SELECT to_regnamespace($1) IS NULL`, schema).Scan(&gone); err != nil || !gone {
		t.Errorf("schema %s left behind (%v)", schema, err)
	}
	var out bytes.Buffer
	if err := bench.WriteTable(&out, res); err != nil || !strings.Contains(out.String(), "budget_flooded") {
		t.Fatalf("table: %v\n%s", err, out.String())
	}
}

// TestFleetFairnessRunsOnlyTheNamedCases runs the fleet scenario with
// --cases unpaced: only that case's two cells are reported; an unknown
// name is refused before anything is created, naming the cases there are.
func TestFleetFairnessRunsOnlyTheNamedCases(t *testing.T) {
	pool := bigPool(t)
	ctx := testenv.Context(t, 3*time.Minute)
	schema := testenv.Name("bench")
	_, err := bench.FleetFairness(ctx, bench.Config{Pool: pool, Schema: schema, Sink: testenv.NATSURL(), Cases: []string{"unpaced", "nope"}})
	if err == nil || !strings.Contains(err.Error(), `unknown fleet case "nope": use budget, unpaced, no_budget`) {
		t.Fatalf("unknown case: %v", err)
	}
	var gone bool
	if err := pool.QueryRow(ctx, `SELECT to_regnamespace($1) IS NULL`, schema).Scan(&gone); err != nil || !gone {
		t.Fatalf("schema %s created for a refused run (%v)", schema, err)
	}
	res, err := bench.FleetFairness(ctx, bench.Config{Pool: pool, Schema: schema, Sink: testenv.NATSURL(), Events: 1000, Rounds: 1, Cases: []string{"unpaced"}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range res {
		got = append(got, r.Case)
	}
	if strings.Join(got, ",") != "unpaced_quiet,unpaced_flooded" {
		t.Fatalf("cells %v, want unpaced_quiet and unpaced_flooded only", got)
	}
}
