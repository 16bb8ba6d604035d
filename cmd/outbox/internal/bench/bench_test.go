package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxkit/outbox/cmd/outbox/internal/bench"
)

func TestLookup(t *testing.T) {
	s, err := bench.Lookup("write")
	if err != nil || s.Name != "write" || s.Run == nil {
		t.Fatalf("Lookup(write) = %+v, %v", s, err)
	}
	if s, err := bench.Lookup("retention"); err != nil || s.Name != "retention" || s.Run == nil {
		t.Fatalf("Lookup(retention) = %+v, %v", s, err)
	}
	_, err = bench.Lookup("nosuch")
	if err == nil || !strings.Contains(err.Error(), `unknown scenario "nosuch"`) || !strings.Contains(err.Error(), "available: write, drain, latency, retention") {
		t.Fatalf("Lookup(nosuch): %v", err)
	}
}

func TestRecorderPercentiles(t *testing.T) {
	var a, b bench.Recorder
	for i := 100; i >= 1; i-- { // out of order, split over two recorders
		r := &a
		if i%2 == 0 {
			r = &b
		}
		r.Record(time.Duration(i) * time.Millisecond)
	}
	a.Merge(&b)
	got := a.Summary()
	want := bench.Latency{Count: 100, Mean: 50500 * time.Microsecond, P50: 50 * time.Millisecond, P90: 90 * time.Millisecond, P99: 99 * time.Millisecond, Max: 100 * time.Millisecond}
	if got != want {
		t.Fatalf("Summary() = %+v, want %+v", got, want)
	}
	var one bench.Recorder
	one.Record(time.Second)
	if s := one.Summary(); s.P50 != time.Second || s.P99 != time.Second || s.Max != time.Second {
		t.Fatalf("one sample: %+v", s)
	}
	var none bench.Recorder
	if s := none.Summary(); s != (bench.Latency{}) {
		t.Fatalf("no samples: %+v", s)
	}
}

func TestResultJSON(t *testing.T) {
	r := bench.Result{
		Scenario: "write", Case: "outbox", Workers: 8, Unit: "tx", Ops: 1000, Seconds: 5, PerSecond: 200,
		RoundsPerSecond: []float64{190, 200},
		Latency:         bench.Latency{Count: 1000, Mean: 1500 * time.Microsecond, P50: 1250 * time.Microsecond, P90: 2 * time.Millisecond, P99: 3 * time.Millisecond, Max: 9 * time.Millisecond},
		VsBaseline:      &bench.Comparison{Case: "baseline", Ratio: 0.8, AddedP50: 250 * time.Microsecond, AddedP99: -time.Millisecond, RoundRatios: []float64{0.75, 0.85}},
		Counters:        map[string]int64{"committed": 1100},
		Env:             &bench.Env{ServerVersion: "15.1", Settings: map[string]string{"fsync": "on"}, Rounds: 2},
	}
	var buf bytes.Buffer
	if err := bench.WriteJSON(&buf, []bench.Result{r, r}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want one per result:\n%s", len(lines), buf.String())
	}
	for _, want := range []string{`"p50_ms":1.25`, `"added_p99_ms":-1`, `"per_second":200`, `"fsync":"on"`, `"workers":8`, `"round_ratios":[0.75,0.85]`} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("JSON lacks %s: %s", want, lines[0])
		}
	}
	var back bench.Result
	if err := json.Unmarshal([]byte(lines[0]), &back); err != nil {
		t.Fatal(err)
	}
	if back.Latency != r.Latency || !reflect.DeepEqual(back.VsBaseline, r.VsBaseline) || back.Counters["committed"] != 1100 {
		t.Fatalf("round trip: %+v", back)
	}
}

func TestWriteTable(t *testing.T) {
	env := &bench.Env{ServerVersion: "15.1", Host: "db", Settings: map[string]string{"synchronous_commit": "on", "fsync": "off", "wal_level": "replica"}, Rounds: 5, DurationSeconds: 5, WarmupSeconds: 0.2, CPUs: 2}
	rs := []bench.Result{
		{Scenario: "write", Case: "baseline", Description: "the business transaction", Workers: 1, Unit: "tx", PerSecond: 1000, RoundsPerSecond: []float64{1000, 900},
			Latency: bench.Latency{P50: time.Millisecond, P99: 2 * time.Millisecond, Max: 5 * time.Millisecond}, VsBaseline: &bench.Comparison{Case: "baseline", Ratio: 1}, Env: env},
		{Scenario: "write", Case: "outbox_notify", Description: "every commit notifies", Workers: 1, Unit: "tx", PerSecond: 500, RoundsPerSecond: []float64{500, 500},
			Latency:    bench.Latency{P50: 2 * time.Millisecond, P99: 12 * time.Millisecond, Max: 150 * time.Millisecond},
			VsBaseline: &bench.Comparison{Case: "baseline", Ratio: 0.5, AddedP50: time.Millisecond, AddedP99: 10 * time.Millisecond, RoundRatios: []float64{0.6, 0.45, 0.5, 0.55}},
			Counters:   map[string]int64{"notifications": 42}, Env: env},
	}
	var buf bytes.Buffer
	if err := bench.WriteTable(&buf, rs); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"5s measured per cell in 5 interleaved rounds of 1s (alternating order), pooled; 200ms warm-up before each round",
		"synchronous_commit=on fsync=off wal_level=replica",
		"tx/s", "notifications",
		"baseline       ", "outbox_notify  ", // the case column reads left
		"0.50", "+1.00", "+10.0", "150", "0.45-0.55", "42",
		"every commit notifies",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestLoad(t *testing.T) {
	var calls atomic.Int64
	op := func(ctx context.Context, worker int) error {
		if worker < 0 || worker > 2 {
			return errors.New("bad worker number")
		}
		calls.Add(1)
		time.Sleep(time.Millisecond)
		return nil
	}
	probed := make(chan bool, 1)
	during := func(ctx context.Context) {
		<-ctx.Done() // ends with the window
		probed <- true
	}
	m, err := bench.Load(context.Background(), 3, 20*time.Millisecond, 100*time.Millisecond, op, during)
	if err != nil {
		t.Fatal(err)
	}
	if m.Ops <= 0 || m.Completed < m.Ops || m.Completed != calls.Load() || m.Latency.Count != m.Ops || m.Latency.P50 < time.Millisecond || m.PerSecond() <= 0 {
		t.Fatalf("measurement %+v after %d calls", m, calls.Load())
	}
	select {
	case <-probed:
	default:
		t.Error("during did not run, or did not end with the window")
	}

	boom := errors.New("boom")
	_, err = bench.Load(context.Background(), 2, 0, time.Second, func(context.Context, int) error { return boom }, nil)
	if !errors.Is(err, boom) {
		t.Fatalf("Load with a failing op: %v", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = bench.Load(ctx, 2, 0, time.Second, op, nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Load on an ended context: %v", err)
	}
}

func TestPlanAlternatesAndPools(t *testing.T) {
	var order []string
	round := map[string]int{}
	cell := func(name string, baseline bool, sleep time.Duration) bench.Cell {
		return bench.Cell{
			Case: name, Workers: 1, Baseline: baseline,
			Prepare: func(context.Context) error { order = append(order, name); round[name]++; return nil },
			Op: func(context.Context, int) error {
				time.Sleep(sleep)
				return nil
			},
			Collect: func(_ context.Context, m bench.Measurement) (map[string]int64, error) {
				return map[string]int64{"rounds": 1, "ops": m.Ops}, nil
			},
		}
	}
	// b's op takes fifty times a's, so that b is the slower in every round
	// even when the machine stalls a for most of one (a 4× gap in 30 ms
	// rounds once came out the other way under a loaded CI run).
	p := bench.Plan{Scenario: "test", Unit: "op", Duration: 300 * time.Millisecond, Rounds: 3}
	rs, err := p.Run(context.Background(), []bench.Cell{cell("a", true, 100*time.Microsecond), cell("b", false, 5*time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(order, ","); got != "a,b,b,a,a,b" {
		t.Errorf("order %s, want a,b,b,a,a,b", got)
	}
	if rs[0].Case != "a" || rs[1].Case != "b" {
		t.Fatalf("results out of order: %s, %s", rs[0].Case, rs[1].Case)
	}
	for _, r := range rs {
		if r.Counters["rounds"] != 3 || r.Counters["ops"] != r.Ops || len(r.RoundsPerSecond) != 3 || r.Latency.Count != r.Ops {
			t.Errorf("%s: not pooled over 3 rounds: %+v", r.Case, r)
		}
		if r.Seconds < 0.299 || r.Seconds > 0.301 || r.PerSecond != float64(r.Ops)/r.Seconds {
			t.Errorf("%s: %d ops in %vs at %v/s", r.Case, r.Ops, r.Seconds, r.PerSecond)
		}
	}
	if rs[0].VsBaseline == nil || rs[0].VsBaseline.Ratio != 1 || rs[1].VsBaseline == nil || rs[1].VsBaseline.Case != "a" ||
		rs[1].VsBaseline.Ratio >= 1 || rs[1].VsBaseline.AddedP50 <= 0 || len(rs[1].VsBaseline.RoundRatios) != 3 {
		t.Errorf("comparisons %+v, %+v", rs[0].VsBaseline, rs[1].VsBaseline)
	}
	if lo, hi, ok := rs[1].VsBaseline.RatioQuartiles(); !ok || lo > hi || hi >= 1 {
		t.Errorf("ratio quartiles %v-%v %v of %v", lo, hi, ok, rs[1].VsBaseline.RoundRatios)
	}
}

func TestTopWait(t *testing.T) {
	ev, share := bench.TopWait(map[string]int64{"IO:WALSync": 2, "Lock:object": 6, "CPU": 2})
	if ev != "Lock:object" || share != 0.6 {
		t.Fatalf("TopWait = %s %v", ev, share)
	}
	if ev, _ := bench.TopWait(nil); ev != "" {
		t.Fatalf("TopWait(nil) = %s", ev)
	}
}
