package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/metrics"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxpgx/cdc"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/route"
)

// DeliveryFigures are the figures of the delivery scenarios (drain and
// latency) beyond a Result's throughput and latency.
type DeliveryFigures struct {
	// Broker describes the broker.
	Broker string `json:"broker"`
	// Events is how many events the cell moved (drained, or delivered).
	Events int64 `json:"events"`
	// VsLimit is, for the relay's drain, its events/s over the lower of
	// the two raw limits measured in the same run.
	VsLimit float64 `json:"vs_limit,omitempty"`
	// VsPollRelay is, for CaseDrainRelayCDC, its events/s over the
	// polling relay's (CaseDrainRelay) in the same run.
	VsPollRelay float64 `json:"vs_poll_relay,omitempty"`
	// CPUMicrosPerEvent is the machine's busy CPU time (every process:
	// PostgreSQL, the broker, this one) per event moved, in microseconds.
	CPUMicrosPerEvent float64 `json:"cpu_us_per_event,omitempty"`
	// CPULimit is, for the relay's drain, the events/s the machine's CPUs
	// could sustain if the two raw paths' CPU per event had to be paid
	// together (the SQL path's plus the broker's), with nothing else to
	// do; VsCPULimit is the relay's events/s over it.
	CPULimit   float64 `json:"cpu_limit,omitempty"`
	VsCPULimit float64 `json:"vs_cpu_limit,omitempty"`
	// ProcessCores is the CPU time of this process (relay, writers and
	// consumer alike) over the measured time, in cores.
	ProcessCores float64 `json:"process_cores"`
	// RelayPeakRSSMiB is the relay process's peak resident set size
	// (VmHWM), when the drain's relay ran as a process of its own.
	RelayPeakRSSMiB float64 `json:"relay_peak_rss_mib,omitempty"`
	// RelayCores is the CPU time of the relay process over the measured
	// time, in cores, when the relay ran as a process of its own
	// (Config.RelayBinary); 0 otherwise.
	RelayCores float64 `json:"relay_cores,omitempty"`
	// RelayCPUMicrosPerEvent is, for the drain's relay cases, the relay's
	// own CPU time per event (the median drain's): less sensitive to other
	// load on the machine than the throughput.
	RelayCPUMicrosPerEvent float64 `json:"relay_cpu_us_per_event,omitempty"`
	// RelayCPURatios are, for relay_traced, its relay CPU per event over
	// the untraced relay's, pair by pair.
	RelayCPURatios []float64 `json:"relay_cpu_ratios,omitempty"`
	// PeakHeapMiB is the largest live Go heap (measured at each garbage
	// collection) seen while the cell ran.
	PeakHeapMiB float64 `json:"peak_heap_mib"`
	// OfferedPerSecond is the latency cell's target rate; PerSecond of the
	// result is what the writers achieved.
	OfferedPerSecond int `json:"offered_per_second,omitempty"`
	// Wakeup is the latency cell's wake-up strategy.
	Wakeup string `json:"wakeup,omitempty"`
	// LongTx says an unrelated transaction stayed open for the whole cell.
	LongTx bool `json:"long_tx,omitempty"`
}

// DrainAggregates is the number of aggregates the drain's backlog spreads
// over.
const DrainAggregates = 1000

// deliverSetup is what both delivery scenarios share: a fresh schema with
// a migrated outbox table and the broker.
type deliverSetup struct {
	pool   *pgxpool.Pool
	table  outboxdriver.Table
	names  driverkit.Names
	broker broker
	router *route.Router
	env    *Env
	lanes  int
	linger time.Duration
}

func newDeliverSetup(ctx context.Context, cfg Config) (_ *deliverSetup, cleanup func() error, err error) {
	env, err := ReadEnv(ctx, cfg.Pool)
	if err != nil {
		return nil, nil, err
	}
	schema, drop, err := freshSchema(ctx, cfg.Pool, cfg.Schema)
	if err != nil {
		return nil, nil, err
	}
	t := outboxdriver.Table{Schema: schema, Name: "outbox"}
	fail := func(err error) (*deliverSetup, func() error, error) {
		return nil, nil, errors.Join(err, drop())
	}
	// The latency cells switch the notify trigger on and off: the table
	// has it unless the writers' wake-ups were asked for.
	wakeups := cfg.Wakeups
	if wakeups == "" {
		wakeups = outboxdriver.WakeupsTrigger
	}
	versions, err := outboxpgx.New(cfg.Pool).Migrate(ctx, t, &outboxdriver.MigrateOptions{Wakeups: wakeups})
	if err != nil {
		return fail(err)
	}
	if len(versions) > 0 {
		env.SchemaVersion = versions[len(versions)-1]
	}
	tag := make([]byte, 4)
	_, _ = rand.Read(tag)
	b, err := openBroker(ctx, cfg.Sink, "outboxbench_"+hex.EncodeToString(tag))
	if err != nil {
		return fail(err)
	}
	router, err := route.New(&route.Config{Replacement: b.Destination()})
	if err != nil {
		b.Close()
		return fail(err)
	}
	s := &deliverSetup{pool: cfg.Pool, table: t, names: pgschema.NamesOf(t), broker: b, router: router, env: env, lanes: cfg.Lanes, linger: cfg.Linger}
	return s, func() error { return errors.Join(b.Close(), drop()) }, nil
}

// fill inserts n events over DrainAggregates aggregates with plain SQL,
// every column but the Debezium ones left to its default.
func (s *deliverSetup) fill(ctx context.Context, n int) error {
	if err := s.fillRange(ctx, 0, n); err != nil {
		return err
	}
	// VACUUM too: the previous drain's deleted rows would slow every drain
	// after it on a server with autovacuum off (or not yet round), and a
	// drift from drain to drain blurs the pairs' ratios.
	if _, err := s.pool.Exec(ctx, `VACUUM ANALYZE `+s.names.Table); err != nil {
		return fmt.Errorf("bench: vacuum analyze: %w", err)
	}
	return nil
}

// fillRange inserts the events from+1 .. from+n of the backlog in one
// transaction.
func (s *deliverSetup) fillRange(ctx context.Context, from, n int) error {
	tag, err := s.pool.Exec(ctx, `INSERT INTO `+s.names.Table+` (id, aggregatetype, aggregateid, type, payload)
SELECT gen_random_uuid(), 'order', 'order-' || (g % $3), 'OrderPlaced',
       jsonb_build_object('order_id', g, 'customer', 'customer-' || (g % $3), 'total', 42.5, 'sku', 'sku-1234', 'quantity', 1)
FROM generate_series($1::bigint + 1, $1::bigint + $2::bigint) AS g ORDER BY g`, int64(from), int64(n), int64(DrainAggregates))
	if err != nil {
		return fmt.Errorf("bench: fill the backlog: %w", err)
	}
	if tag.RowsAffected() != int64(n) {
		return fmt.Errorf("bench: fill the backlog: %d rows, want %d", tag.RowsAffected(), n)
	}
	return nil
}

// newRelay returns a relay over the table with the given poll interval,
// publishing to a fresh sink, and a counter of the events it recorded as
// published.
func (s *deliverSetup) newRelay(ctx context.Context, batch int, poll time.Duration, source string) (*relay.Relay, *atomic.Int64, func(), error) {
	return s.newTracedRelay(ctx, batch, poll, source, nil)
}

// newTracedRelay is newRelay with the tracer provider tp (nil: none).
func (s *deliverSetup) newTracedRelay(ctx context.Context, batch int, poll time.Duration, source string, tp trace.TracerProvider) (*relay.Relay, *atomic.Int64, func(), error) {
	srcCfg := outboxdriver.SourceConfig{Logger: slog.New(slog.DiscardHandler)}
	var src outboxdriver.Source
	var err error
	if source == SourceCDC {
		src, err = cdc.NewSource(s.pool, s.table, &cdc.Config{SourceConfig: srcCfg})
	} else {
		src, err = outboxpgx.New(s.pool).NewSource(s.table, &srcCfg)
	}
	if err != nil {
		return nil, nil, nil, err
	}
	snk, err := s.broker.Sink(ctx)
	if err != nil {
		src.Close()
		return nil, nil, nil, err
	}
	var recorded atomic.Int64
	r, err := relay.New(src, snk, &relay.Config{
		BatchSize: batch, PollInterval: poll, Lanes: s.lanes, Linger: s.linger, Router: s.router, Logger: slog.New(slog.DiscardHandler),
		TracerProvider: tp,
		OnStage: func(st relay.Stage, n int) {
			if st == relay.StageRecorded {
				recorded.Add(int64(n))
			}
		},
	})
	if err != nil {
		snk.Close()
		src.Close()
		return nil, nil, nil, err
	}
	closeAll := func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = r.Stop(sctx)
		snk.Close()
		src.Close()
	}
	return r, &recorded, closeAll, nil
}

// waitFor polls cond every 5ms until it holds, timeout passes or ctx ends.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) error {
	return waitEvery(ctx, timeout, 5*time.Millisecond, cond)
}

// waitEvery polls cond every interval until it holds, timeout passes or
// ctx ends.
func waitEvery(ctx context.Context, timeout, interval time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
	return nil
}

// cpuPerEvent is the machine's busy CPU time since m0, in microseconds
// per event for n events; 0 where it cannot be read.
func cpuPerEvent(m0 CPUTime, n int) float64 {
	m1, ok := readCPU()
	if !ok || m0.Total == 0 {
		return 0
	}
	// /proc/stat counts in USER_HZ ticks, 100 a second on Linux, summed
	// over the CPUs.
	return float64(m1.Sub(m0).Busy) / 100 * 1e6 / float64(n)
}

// processCPU is the CPU time this process used so far, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// heapSampler samples the live Go heap (as of the last collection) every
// 20ms and keeps the peak.
type heapSampler struct {
	stopc chan struct{}
	done  chan float64
}

func startHeapSampler() *heapSampler {
	h := &heapSampler{stopc: make(chan struct{}), done: make(chan float64, 1)}
	go func() {
		sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		var peak uint64
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			metrics.Read(sample)
			peak = max(peak, sample[0].Value.Uint64())
			select {
			case <-h.stopc:
				h.done <- float64(peak) / (1 << 20)
				return
			case <-tick.C:
			}
		}
	}()
	return h
}

func (h *heapSampler) stop() float64 { close(h.stopc); return <-h.done }

// deliverDefaults fills in the defaults of the delivery scenarios.
func (c Config) deliverDefaults() (Config, error) {
	c, err := c.withDefaults()
	if err != nil {
		return c, err
	}
	if c.Sink == "" {
		c.Sink = DefaultSink
	}
	if c.Events == 0 {
		c.Events = DefaultEvents
	}
	if c.Events < 1 || c.Events > MaxEvents {
		return c, fmt.Errorf("bench: events %d: use 1 to %d", c.Events, MaxEvents)
	}
	if c.Batch == 0 {
		c.Batch = DefaultBatch
	}
	if len(c.Rates) == 0 {
		c.Rates = DefaultRates()
	}
	for _, name := range c.Cases {
		if !slices.Contains(LatencyCases(), name) {
			return c, fmt.Errorf("bench: unknown latency case %q: use %s", name, strings.Join(LatencyCases(), ", "))
		}
	}
	if len(c.Cases) > 0 && len(latencyCells(c.Rates, c.Cases, c.PlainWrites)) == 0 {
		return c, fmt.Errorf("bench: no latency cell is named %s at rates %v (notify_long_tx runs at 2000 events/s only)", strings.Join(c.Cases, ", "), c.Rates)
	}
	for _, r := range c.Rates {
		if r < 1 || r > 100_000 {
			return c, fmt.Errorf("bench: rate %d events/s: use 1 to 100000", r)
		}
	}
	return c, nil
}

// writeDeliveryTable prints the results of the drain and latency
// scenarios.
func writeDeliveryTable(w io.Writer, results []Result) error {
	first := results[0]
	var b strings.Builder
	if e := first.Env; e != nil {
		switch first.Scenario {
		case "drain":
			fmt.Fprintf(&b, "scenario drain: a committed backlog of %d events over %d aggregates, drained once per case\n", first.Delivery.Events, DrainAggregates)
		default:
			fmt.Fprintf(&b, "scenario latency: each cell offers its rate for %s after a %s warm-up (open loop, %d writers, one event per transaction); latency from Commit's return to the consumer\n",
				seconds(e.DurationSeconds), seconds(e.WarmupSeconds), LatencyWriters)
		}
		fmt.Fprintf(&b, "PostgreSQL %s at %s: %s\n", e.ServerVersion, e.Host, e.SettingsLine())
		fmt.Fprintf(&b, "broker: %s\n", first.Delivery.Broker)
		clientLine(&b, e, "")
		b.WriteString("\n")
	}
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	if first.Scenario == "drain" {
		fmt.Fprintln(tw, "case\tevents/s\tseconds\tvs limit\tvs relay\tmachine CPU µs/event\tCPU limit/s\tvs CPU limit\trelay cores\trelay memory MiB\t")
		for _, r := range results {
			d := r.Delivery
			vs, vsPoll, cpuLim, vsCPU, cores, heap := "-", "-", "-", "-", "-", "-"
			if d.VsPollRelay > 0 {
				vsPoll = fmt.Sprintf("%.2f", d.VsPollRelay)
			}
			if r.Case == CaseDrainRelay || r.Case == CaseDrainRelayCDC || r.Case == CaseDrainRelayCDCMessages || r.Case == CaseDrainRelayTraced {
				vs, cores, heap = fmt.Sprintf("%.2f", d.VsLimit), fmt.Sprintf("%.2f", d.ProcessCores), fmt.Sprintf("%.1f heap", d.PeakHeapMiB)
				if d.RelayPeakRSSMiB > 0 {
					heap = fmt.Sprintf("%.1f RSS", d.RelayPeakRSSMiB)
				}
				if d.CPULimit > 0 {
					cpuLim, vsCPU = fmt.Sprintf("%.0f", d.CPULimit), fmt.Sprintf("%.2f", d.VsCPULimit)
				}
				if c := r.VsBaseline; c != nil {
					vs = fmt.Sprintf("%.3f of %s", c.Ratio, c.Case)
				}
			}
			fmt.Fprintf(tw, "%s\t%.0f\t%.2f\t%s\t%s\t%.1f\t%s\t%s\t%s\t%s\t\n", r.Case, r.PerSecond, r.Seconds, vs, vsPoll, d.CPUMicrosPerEvent, cpuLim, vsCPU, cores, heap)
		}
	} else {
		fmt.Fprintln(tw, "case\toffered/s\tachieved/s\tp50 ms\tp99 ms\tmax ms\trelay cores\tprocess cores\tmachine cpu\tpeak heap MiB\t")
		for _, r := range results {
			d := r.Delivery
			p50, p99, mx := "-", "-", "-"
			if r.Latency.Count > 0 {
				p50, p99, mx = fmtMs(r.Latency.P50), fmtMs(r.Latency.P99), fmtMs(r.Latency.Max)
			}
			rc := "-"
			if d.RelayCores > 0 || first.Env != nil && first.Env.RelayProcess {
				rc = fmt.Sprintf("%.3f", d.RelayCores)
			}
			fmt.Fprintf(tw, "%s\t%d\t%.0f\t%s\t%s\t%s\t%s\t%.3f\t%.0f%%\t%.1f\t\n", r.Case, d.OfferedPerSecond, r.PerSecond, p50, p99, mx, rc, d.ProcessCores, 100*r.CPUBusy, d.PeakHeapMiB)
		}
	}
	tw.Flush()
	b.WriteString("\n")
	writeDescriptions(&b, results)
	for _, r := range results {
		if c := r.VsBaseline; c != nil && len(c.RoundRatios) > 0 {
			rs := make([]string, len(c.RoundRatios))
			for i, v := range c.RoundRatios {
				rs[i] = fmt.Sprintf("%.3f", v)
			}
			fmt.Fprintf(&b, "  %s over %s, pair by pair: %s (the row shows the median); geometric mean %.3f\n", r.Case, c.Case, strings.Join(rs, " "), geoMean(c.RoundRatios))
			if d := r.Delivery; d != nil && len(d.RelayCPURatios) > 0 {
				cs := make([]string, len(d.RelayCPURatios))
				for i, v := range d.RelayCPURatios {
					cs[i] = fmt.Sprintf("%.3f", v)
				}
				fmt.Fprintf(&b, "  relay CPU per event: %s %.1f µs, %s %.1f µs (the median drains); %s over %s pair by pair: %s, median %.3f\n",
					c.Case, baseCPU(results, c.Case), r.Case, d.RelayCPUMicrosPerEvent, r.Case, c.Case, strings.Join(cs, " "), median(d.RelayCPURatios))
			}
		}
	}
	if first.Scenario == "drain" {
		if slices.ContainsFunc(results, func(r Result) bool { return r.Case == CaseDrainRelayCDC }) {
			b.WriteString("  vs relay: relay_cdc's and relay_cdc_messages' events/s over the polling relay's in the same run (each the median of its drains)\n")
		}
		b.WriteString("  vs limit: the relay's events/s over the lower of raw_sql and raw_broker; machine CPU µs/event: busy CPU time of the whole\n  machine (PostgreSQL, broker, this process) per event; CPU limit: what the machine's CPUs could sustain paying raw_sql's and\n  raw_broker's CPU per event together, the relay's own work free; relay cores: the relay's CPU time over the drain (its own\n  process, or this one when it runs in process); relay memory: the relay process's peak RSS, or the largest live Go heap in process\n")
	} else {
		b.WriteString("  relay cores: CPU time of the relay process (--relay-process) over the window; process cores: CPU time of the bench\n  process (writers and consumer, and the relay unless it runs apart) over the window; machine cpu: busy share of all CPUs\n  (PostgreSQL and the broker included); every committed event was seen by the consumer\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// baseCPU returns the relay CPU per event of the result of case c.
func baseCPU(results []Result, c string) float64 {
	for _, r := range results {
		if r.Case == c && r.Delivery != nil {
			return r.Delivery.RelayCPUMicrosPerEvent
		}
	}
	return 0
}
