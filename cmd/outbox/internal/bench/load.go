package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Op is one operation of a closed-loop worker (one business transaction,
// say); worker numbers the worker from 0. It must leave no transaction open
// when it returns.
type Op func(ctx context.Context, worker int) error

// Measurement is what Load measured.
type Measurement struct {
	// Ops is the number of operations that completed inside the window.
	Ops int64
	// Window is the measured time.
	Window time.Duration
	// Completed counts every operation that completed, in the warm-up and
	// after the window too: what the database holds afterwards.
	Completed int64
	// Latency summarises the operations counted in Ops.
	Latency Latency
	// Samples holds their latencies, to pool measurements.
	Samples *Recorder
	// CPU is the machine's CPU time during the window (zero where it
	// cannot be read).
	CPU CPUTime
}

// PerSecond is the throughput over the window.
func (m Measurement) PerSecond() float64 {
	if m.Window <= 0 {
		return 0
	}
	return float64(m.Ops) / m.Window.Seconds()
}

// Load runs workers closed-loop workers, each calling op back to back: for
// warmup, unmeasured, then for window. An operation counts, and its latency
// (from the call to the return) is recorded, when it completes inside the
// window. A worker stops after its first operation that completes past the
// window: never in the middle of one, so no connection is torn down by a
// cancelled query. The first error, or ctx ending, stops every worker and
// is returned.
//
// during, if not nil, runs in a goroutine of its own for the window, with
// a context that ends with it: a probe of what the system does meanwhile.
// The machine's CPU time over the window is measured too.
func Load(ctx context.Context, workers int, warmup, window time.Duration, op Op, during func(context.Context)) (Measurement, error) {
	if workers < 1 {
		return Measurement{}, fmt.Errorf("bench: %d workers", workers)
	}
	if window <= 0 {
		return Measurement{}, fmt.Errorf("bench: measured window %s must be positive", window)
	}
	var (
		stop      atomic.Bool
		completed atomic.Int64
		errOnce   sync.Once
		firstErr  error
		wg        sync.WaitGroup
		recs      = make([]Recorder, workers)
	)
	from := time.Now().Add(warmup)
	to := from.Add(window)

	octx, ocancel := context.WithCancel(ctx)
	defer ocancel()
	var cpu CPUTime
	observed := make(chan struct{})
	go func() {
		defer close(observed)
		if !sleepUntil(octx, from) {
			return
		}
		c0, ok0 := readCPU()
		if during != nil {
			dctx, cancel := context.WithDeadline(octx, to)
			during(dctx)
			cancel()
		}
		if !sleepUntil(octx, to) {
			return
		}
		if c1, ok1 := readCPU(); ok0 && ok1 {
			cpu = c1.Sub(c0)
		}
	}()

	for w := range workers {
		wg.Go(func() {
			rec := &recs[w]
			for !stop.Load() {
				if err := ctx.Err(); err != nil {
					errOnce.Do(func() { firstErr = err })
					stop.Store(true)
					return
				}
				t0 := time.Now()
				if err := op(ctx, w); err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("worker %d: %w", w, err) })
					stop.Store(true)
					return
				}
				t1 := time.Now()
				completed.Add(1)
				if t1.Before(from) {
					continue
				}
				if !t1.Before(to) {
					return
				}
				rec.Record(t1.Sub(t0))
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		ocancel()
		<-observed
		return Measurement{}, firstErr
	}
	<-observed
	all := &Recorder{}
	for i := range recs {
		all.Merge(&recs[i])
	}
	return Measurement{Ops: int64(all.Len()), Window: window, Completed: completed.Load(), Latency: all.Summary(), Samples: all, CPU: cpu}, nil
}

// sleepUntil sleeps until t, or reports false when ctx ends first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Cell is one thing a scenario measures: a case at a worker count.
type Cell struct {
	// Case names what is measured ("baseline", "outbox_notify").
	Case string
	// Description says it in a few words, for the table's legend.
	Description string
	// Workers is the number of concurrent workers.
	Workers int
	// Baseline marks the case the other cases at the same Workers are
	// compared with.
	Baseline bool
	// Prepare puts the database into the cell's state before each round
	// (table contents, triggers, registrations). It may be nil.
	Prepare func(ctx context.Context) error
	// Op is the operation the workers repeat.
	Op Op
	// Collect runs after each round of the cell with its measurement; it
	// checks the outcome and returns counters, which are summed over the
	// rounds. It may be nil.
	Collect func(ctx context.Context, m Measurement) (map[string]int64, error)
}

// Plan runs cells.
type Plan struct {
	// Scenario names the scenario in the results.
	Scenario string
	// Unit is what one operation is ("tx").
	Unit string
	// Duration is each cell's measured time, split evenly over Rounds.
	Duration time.Duration
	// Rounds is how many slices each cell is measured in.
	Rounds int
	// Warmup is the unmeasured load before each slice.
	Warmup time.Duration
	// Progress gets a line per measured cell and round.
	Progress io.Writer
	// Env is attached to every result.
	Env *Env
	// Waits, if not nil, samples the workers' wait events during every
	// measured window; the ops must Track their backends.
	Waits *WaitSampler
}

// Run measures every cell in Rounds rounds of Duration/Rounds each: odd
// rounds run the cells in the given order, even rounds in reverse. Slow
// drift of the machine (storage that is fast for a few seconds, then slow;
// a neighbour's load; autovacuum) then falls on every cell alike, and the
// cases at one worker count, which are listed together, are measured
// within seconds of each other in every round.
//
// A cell's rounds are pooled: its throughput is all operations over all
// measured time, its latency percentiles are over all operations, its
// counters, CPU time and wait samples are summed; RoundsPerSecond keeps
// every round's throughput. The results follow the order of cells, and
// each is compared with the baseline cell of its worker count, if there is
// one.
func (p *Plan) Run(ctx context.Context, cells []Cell) ([]Result, error) {
	rounds := max(p.Rounds, 1)
	window := p.Duration / time.Duration(rounds)
	progress := p.Progress
	if progress == nil {
		progress = io.Discard
	}
	results := make([]Result, len(cells))
	samples := make([]Recorder, len(cells))
	measured := make([]time.Duration, len(cells))
	cpu := make([]CPUTime, len(cells))
	var during func(context.Context)
	if p.Waits != nil {
		during = p.Waits.Run
	}
	for i, c := range cells {
		results[i] = Result{Scenario: p.Scenario, Case: c.Case, Description: c.Description, Workers: c.Workers, Unit: p.Unit, Env: p.Env}
	}
	n, total := 0, rounds*len(cells)
	for r := range rounds {
		for k := range cells {
			i := k
			if r%2 == 1 {
				i = len(cells) - 1 - k
			}
			c := cells[i]
			n++
			if c.Prepare != nil {
				if err := c.Prepare(ctx); err != nil {
					return nil, fmt.Errorf("%s, %d workers: prepare: %w", c.Case, c.Workers, err)
				}
			}
			m, err := Load(ctx, c.Workers, p.Warmup, window, c.Op, during)
			if err != nil {
				return nil, fmt.Errorf("%s, %d workers: %w", c.Case, c.Workers, err)
			}
			var waits map[string]int64
			if p.Waits != nil {
				if waits, err = p.Waits.Take(); err != nil {
					return nil, err
				}
			}
			var counters map[string]int64
			if c.Collect != nil {
				if counters, err = c.Collect(ctx, m); err != nil {
					return nil, fmt.Errorf("%s, %d workers: %w", c.Case, c.Workers, err)
				}
			}
			fmt.Fprintf(progress, "[%3d/%d] round %d  %-18s %3d workers  %8.0f %s/s  p50 %s ms  p99 %s ms\n",
				n, total, r+1, c.Case, c.Workers, m.PerSecond(), p.Unit, fmtMs(m.Latency.P50), fmtMs(m.Latency.P99))
			res := &results[i]
			res.RoundsPerSecond = append(res.RoundsPerSecond, m.PerSecond())
			res.Ops += m.Ops
			measured[i] += m.Window
			samples[i].Merge(m.Samples)
			cpu[i] = cpu[i].Add(m.CPU)
			for k, v := range waits {
				if res.Waits == nil {
					res.Waits = map[string]int64{}
				}
				res.Waits[k] += v
			}
			for k, v := range counters {
				if res.Counters == nil {
					res.Counters = map[string]int64{}
				}
				res.Counters[k] += v
			}
		}
	}
	for i := range results {
		res := &results[i]
		res.Seconds = measured[i].Seconds()
		if res.Seconds > 0 {
			res.PerSecond = float64(res.Ops) / res.Seconds
		}
		res.Latency = samples[i].Summary()
		res.CPUBusy = cpu[i].Fraction()
	}
	compare(cells, results)
	return results, nil
}

// compare fills VsBaseline of every result whose worker count has a
// baseline cell.
func compare(cells []Cell, results []Result) {
	base := map[int]*Result{}
	for i, c := range cells {
		if c.Baseline {
			base[c.Workers] = &results[i]
		}
	}
	for i := range results {
		r := &results[i]
		b := base[r.Workers]
		if b == nil || b.PerSecond == 0 {
			continue
		}
		c := &Comparison{
			Case:     b.Case,
			Ratio:    r.PerSecond / b.PerSecond,
			AddedP50: r.Latency.P50 - b.Latency.P50,
			AddedP99: r.Latency.P99 - b.Latency.P99,
		}
		// Both ran once a round, in the same rounds: pair them.
		if len(r.RoundsPerSecond) == len(b.RoundsPerSecond) {
			for k, v := range r.RoundsPerSecond {
				if b.RoundsPerSecond[k] > 0 {
					c.RoundRatios = append(c.RoundRatios, v/b.RoundsPerSecond[k])
				}
			}
		}
		r.VsBaseline = c
	}
}

// RatioQuartiles returns the first and third quartiles of RoundRatios
// (nearest rank), or false with fewer than two rounds. Half the rounds
// fell between them: a measure of how well the comparison held while the
// machine drifted.
func (c *Comparison) RatioQuartiles() (lo, hi float64, ok bool) {
	if len(c.RoundRatios) < 2 {
		return 0, 0, false
	}
	s := slices.Sorted(slices.Values(c.RoundRatios))
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	return q(0.25), q(0.75), true
}

// Result is the outcome of one cell.
type Result struct {
	// Scenario and Case say what was measured, Workers at what
	// concurrency.
	Scenario    string `json:"scenario"`
	Case        string `json:"case"`
	Description string `json:"description,omitempty"`
	Workers     int    `json:"workers"`
	// Unit is what one operation is ("tx").
	Unit string `json:"unit"`
	// Ops operations completed in Seconds of measured time, pooled over
	// the rounds: PerSecond. The retention scenario, whose rounds each
	// drain the same backlog, reports as PerSecond the median of
	// RoundsPerSecond instead (with two rounds, their mean).
	Ops       int64   `json:"ops"`
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"per_second"`
	// RoundsPerSecond is the throughput of every round, in the order run.
	RoundsPerSecond []float64 `json:"rounds_per_second"`
	// Latency of all measured operations.
	Latency Latency `json:"latency"`
	// VsBaseline compares with the baseline case at the same Workers.
	VsBaseline *Comparison `json:"vs_baseline,omitempty"`
	// CPUBusy is the share of the machine's CPU time that was busy during
	// the measured windows: client and server alike when they share the
	// machine. 0 where it cannot be read.
	CPUBusy float64 `json:"cpu_busy,omitempty"`
	// Waits counts the samples of the workers' backends by wait event
	// (see WaitSampler), when the scenario sampled them.
	Waits map[string]int64 `json:"waits,omitempty"`
	// Counters are the scenario's own checks, summed over the rounds,
	// such as rows written or notifications received.
	Counters map[string]int64 `json:"counters,omitempty"`
	// Retention holds the retention scenario's figures: table size, dead
	// tuples and the cleanup of kept rows.
	Retention *RetentionFigures `json:"retention,omitempty"`
	// Delivery holds the figures of the drain and latency scenarios.
	Delivery *DeliveryFigures `json:"delivery,omitempty"`
	// Console holds the console scenario's figures.
	Console *ConsoleFigures `json:"console,omitempty"`
	// Env describes the conditions of the run.
	Env *Env `json:"env,omitempty"`
}

// Comparison relates a result to the baseline case at the same worker
// count.
type Comparison struct {
	// Case is the baseline's case.
	Case string
	// Ratio is the result's throughput over the baseline's.
	Ratio float64
	// AddedP50 and AddedP99 are the latency added to the baseline's at the
	// median and the 99th percentile.
	AddedP50, AddedP99 time.Duration
	// RoundRatios pairs the rounds: in each, the result's throughput over
	// the baseline's, measured within seconds of each other.
	RoundRatios []float64
}

type comparisonJSON struct {
	Case        string    `json:"case"`
	Ratio       float64   `json:"ratio"`
	AddedP50Ms  float64   `json:"added_p50_ms"`
	AddedP99Ms  float64   `json:"added_p99_ms"`
	RoundRatios []float64 `json:"round_ratios,omitempty"`
}

// MarshalJSON writes the durations as milliseconds.
func (c Comparison) MarshalJSON() ([]byte, error) {
	return json.Marshal(comparisonJSON{c.Case, c.Ratio, ms(c.AddedP50), ms(c.AddedP99), c.RoundRatios})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (c *Comparison) UnmarshalJSON(b []byte) error {
	var j comparisonJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*c = Comparison{Case: j.Case, Ratio: j.Ratio, AddedP50: fromMs(j.AddedP50Ms), AddedP99: fromMs(j.AddedP99Ms), RoundRatios: j.RoundRatios}
	return nil
}
