package bench

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxpgx/cdc"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/route"
	"github.com/outboxkit/outbox/sink"
)

// Cases of the drain scenario.
const (
	// CaseDrainSQL is the relay's SQL path alone: Claim + Finish as
	// published (delete), no broker.
	CaseDrainSQL = "raw_sql"
	// CaseDrainBroker is the broker alone: the same messages published
	// straight through its client with asynchronous acknowledgements, no
	// database.
	CaseDrainBroker = "raw_broker"
	// CaseDrainRelay is the relay draining the backlog to the broker.
	CaseDrainRelay = "relay"
	// CaseDrainRelayCDC is the relay draining the same backlog from the
	// WAL, by log tailing (Config.Source SourceCDC), written as rows
	// (table mode): it deletes each row after its event was published.
	CaseDrainRelayCDC = "relay_cdc"
	// CaseDrainRelayCDCMessages is the relay draining the same backlog
	// from the WAL, written as logical decoding messages (message mode):
	// no row to delete afterwards.
	CaseDrainRelayCDCMessages = "relay_cdc_messages"
	// CaseDrainRelayTraced is CaseDrainRelay with tracing on and a
	// sampler that samples nothing (Config.TraceNeverSample).
	CaseDrainRelayTraced = "relay_traced"
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
	versions, err := outboxpgx.New(cfg.Pool).Migrate(ctx, t, &outboxdriver.MigrateOptions{Wakeups: cfg.Wakeups})
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

// Drain measures how fast one relay drains a committed backlog of
// cfg.Events events to the broker of cfg.Sink, against the two limits it
// cannot beat, measured in the same run: the relay's SQL path alone
// (CaseDrainSQL) and the broker alone (CaseDrainBroker). The relay's
// result carries its events/s over the lower of the two (VsLimit), the
// process's CPU and its peak Go heap. After the drain, a consumer on the
// broker side must find every event, or the scenario fails.
func Drain(ctx context.Context, cfg Config) (results []Result, err error) {
	if cfg, err = cfg.deliverDefaults(); err != nil {
		return nil, err
	}
	s, cleanup, err := newDeliverSetup(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, cleanup()) }()
	s.env.Rounds = 1
	n := cfg.Events
	fig := func() *DeliveryFigures { return &DeliveryFigures{Broker: s.broker.Describe(), Events: int64(n)} }
	result := func(c, desc string, d time.Duration, f *DeliveryFigures) Result {
		return Result{Scenario: "drain", Case: c, Description: desc, Workers: 1, Unit: "event", Ops: int64(n),
			Seconds: d.Seconds(), PerSecond: float64(n) / d.Seconds(), Delivery: f, Env: s.env}
	}

	// (a) The SQL path alone.
	fmt.Fprintf(cfg.Progress, "drain: filling %d events\n", n)
	if err := s.fill(ctx, n); err != nil {
		return nil, err
	}
	m0, _ := readCPU()
	sqlRes, err := s.drainSQL(ctx, n, cfg.Batch)
	if err != nil {
		return nil, err
	}
	sqlRes.Delivery = fig()
	sqlRes.Delivery.CPUMicrosPerEvent = cpuPerEvent(m0, n)
	sqlRes.Description = fmt.Sprintf("Claim(%d) + Finish as published (delete) with every partition leased, no broker", cfg.Batch)
	results = append(results, sqlRes)
	fmt.Fprintf(cfg.Progress, "drain: %s %.0f events/s\n", CaseDrainSQL, sqlRes.PerSecond)

	// (b) The broker alone.
	msgs := make([]sink.Message, n)
	for i := range msgs {
		rec := outboxdriver.Record{ID: uuid.NewString(), AggregateType: "order", AggregateID: "order-" + strconv.Itoa(i%DrainAggregates), Type: "OrderPlaced",
			Payload: []byte(`{"sku": "sku-1234", "total": 42.5, "customer": "customer-` + strconv.Itoa(i%DrainAggregates) + `", "order_id": ` + strconv.Itoa(i) + `, "quantity": 1}`)}
		if msgs[i], err = s.router.Message(&rec); err != nil {
			return nil, err
		}
		msgs[i].Destination = s.broker.RawDestination(msgs[i].Destination)
	}
	m0, _ = readCPU()
	t0 := time.Now()
	if err := s.broker.Raw(ctx, msgs); err != nil {
		return nil, err
	}
	bf := fig()
	bf.CPUMicrosPerEvent = cpuPerEvent(m0, n)
	rawDesc := "the same messages through the broker's client, asynchronous acks, no database"
	if d, ok := s.broker.(rawDescriber); ok {
		rawDesc = d.RawDescription()
	}
	results = append(results, result(CaseDrainBroker, rawDesc, time.Since(t0), bf))
	fmt.Fprintf(cfg.Progress, "drain: %s %.0f events/s\n", CaseDrainBroker, results[1].PerSecond)
	msgs = nil

	// (c) The relay; with TraceNeverSample also traced, and with
	// Source SourceCDC also from the WAL (a slot made on the empty table,
	// then the same backlog as rows, and again as logical decoding
	// messages), in Rounds pairs of drains that alternate which goes
	// first.
	pairs := 1
	if cfg.TraceNeverSample || cfg.Source == SourceCDC {
		pairs = cmp.Or(cfg.Rounds, DefaultDrainPairs)
	}
	var plain, traced, wal, walMsgs []*drainRun
	var pairRatios, cpuRatios, walRatios, msgRatios []float64
	for i := range pairs {
		order := []bool{false}
		if cfg.TraceNeverSample {
			order = []bool{i%2 == 1, i%2 == 0} // untraced first in even pairs
		}
		walFirst := cfg.Source == SourceCDC && i%2 == 1 // polling first in even pairs
		drainFromWAL := func() error {
			// Messages first when the WAL goes first, so that the
			// polling relay's drain sits between the two in one pair
			// and around them in the next.
			for _, messages := range []bool{walFirst, !walFirst} {
				d, err := s.drainWAL(ctx, cfg, n, messages)
				if err != nil {
					return err
				}
				if messages {
					walMsgs = append(walMsgs, d)
				} else {
					wal = append(wal, d)
				}
			}
			return nil
		}
		if walFirst {
			if err := drainFromWAL(); err != nil {
				return nil, err
			}
		}
		for _, tr := range order {
			if err := s.fill(ctx, n); err != nil {
				return nil, err
			}
			d, err := s.drainRelay(ctx, cfg, SourcePoll, n, tr, s.noneUnpublished)
			if err != nil {
				return nil, err
			}
			if tr {
				traced = append(traced, d)
			} else {
				plain = append(plain, d)
			}
			if cfg.TraceNeverSample {
				fmt.Fprintf(cfg.Progress, "drain: pair %d, traced %v: %.0f events/s\n", i+1, tr, float64(n)/d.elapsed.Seconds())
			}
		}
		if cfg.Source == SourceCDC && !walFirst {
			if err := drainFromWAL(); err != nil {
				return nil, err
			}
		}
		if cfg.TraceNeverSample {
			pairRatios = append(pairRatios, plain[i].elapsed.Seconds()/traced[i].elapsed.Seconds())
			cpuRatios = append(cpuRatios, traced[i].cpuPerEvent(n)/plain[i].cpuPerEvent(n))
		}
		if cfg.Source == SourceCDC {
			walRatios = append(walRatios, plain[i].elapsed.Seconds()/wal[i].elapsed.Seconds())
			msgRatios = append(msgRatios, plain[i].elapsed.Seconds()/walMsgs[i].elapsed.Seconds())
			fmt.Fprintf(cfg.Progress, "drain: pair %d: relay_cdc %.0f events/s, %.3f of relay's %.0f; relay_cdc_messages %.0f events/s, %.3f\n", i+1,
				float64(n)/wal[i].elapsed.Seconds(), walRatios[i], float64(n)/plain[i].elapsed.Seconds(),
				float64(n)/walMsgs[i].elapsed.Seconds(), msgRatios[i])
		}
	}
	runs := []*drainRun{medianRun(plain)}
	if cfg.Source == SourceCDC {
		runs = append(runs, medianRun(wal), medianRun(walMsgs))
	}
	var seen sync.Map
	var delivered atomic.Int64
	stopConsume, err := s.broker.Consume(ctx, func(id string) {
		if _, dup := seen.LoadOrStore(id, struct{}{}); !dup {
			delivered.Add(1)
		}
	})
	if err != nil && !errors.Is(err, errNoConsumer) {
		return nil, err
	}
	if stopConsume != nil {
		want := int64(n * (len(plain) + len(traced) + len(wal) + len(walMsgs)))
		err := waitFor(ctx, 2*time.Minute, func() bool { return delivered.Load() >= want })
		stopConsume()
		if err != nil || delivered.Load() != want {
			return nil, fmt.Errorf("check: the consumer saw %d distinct events of %d drained", delivered.Load(), want)
		}
	}
	var left int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM `+s.names.Table).Scan(&left); err != nil {
		return nil, err
	}
	if left != 0 {
		return nil, fmt.Errorf("check: %d rows left after the relay's drain", left)
	}
	limit := min(results[0].PerSecond, results[1].PerSecond)
	if _, isNull := s.broker.(nullBroker); isNull {
		limit = results[0].PerSecond
	}
	for _, run := range runs {
		f := fig()
		f.ProcessCores, f.PeakHeapMiB, f.RelayPeakRSSMiB, f.CPUMicrosPerEvent = run.cores, run.peak, run.rss, run.relayCPU
		f.RelayCPUMicrosPerEvent = run.cpuPerEvent(n)
		c, desc := CaseDrainRelay, fmt.Sprintf("one relay (batch %d, %d lanes) draining the backlog to the broker, counted by a consumer afterwards", cfg.Batch, cmp.Or(cfg.Lanes, relay.DefaultLanes))
		switch {
		case run.source == SourceCDC && run.messages:
			c, desc = CaseDrainRelayCDCMessages, fmt.Sprintf("one relay with --source cdc (batch %d) draining the same backlog written as logical decoding messages (message mode, 1000 a transaction), counted by a consumer afterwards", cfg.Batch)
		case run.source == SourceCDC:
			c, desc = CaseDrainRelayCDC, fmt.Sprintf("one relay with --source cdc (batch %d) draining the same backlog from the WAL (table mode, 1000 rows a transaction, each deleted once published), counted by a consumer afterwards", cfg.Batch)
		}
		rr := result(c, desc, run.elapsed, f)
		f.VsLimit = rr.PerSecond / limit
		if both := results[0].Delivery.CPUMicrosPerEvent + results[1].Delivery.CPUMicrosPerEvent; both > 0 {
			f.CPULimit = float64(runtime.NumCPU()) * 1e6 / both
			f.VsCPULimit = rr.PerSecond / f.CPULimit
		}
		if run.source == SourceCDC {
			f.VsPollRelay = rr.PerSecond / results[2].PerSecond
			drains, ratios := wal, walRatios
			if run.messages {
				drains, ratios = walMsgs, msgRatios
			}
			rr.RoundsPerSecond = perSecond(drains, n)
			if pairs > 1 {
				rr.VsBaseline = &Comparison{Case: CaseDrainRelay, Ratio: median(ratios), RoundRatios: ratios}
			}
		} else {
			rr.RoundsPerSecond = perSecond(plain, n)
		}
		results = append(results, rr)
		fmt.Fprintf(cfg.Progress, "drain: %s %.0f events/s (%.2f of the lower limit)\n", c, rr.PerSecond, f.VsLimit)
	}
	if cfg.TraceNeverSample {
		mt := medianRun(traced)
		ft := fig()
		ft.ProcessCores, ft.PeakHeapMiB, ft.RelayPeakRSSMiB, ft.CPUMicrosPerEvent = mt.cores, mt.peak, mt.rss, mt.relayCPU
		ft.RelayCPUMicrosPerEvent = mt.cpuPerEvent(n)
		ft.RelayCPURatios = cpuRatios
		rt := result(CaseDrainRelayTraced, fmt.Sprintf("the relay with tracing on and a sampler that samples nothing (OpenTelemetry SDK, NeverSample), in %d pairs of drains with relay, alternating which goes first", pairs), mt.elapsed, ft)
		rt.RoundsPerSecond = perSecond(traced, n)
		rt.VsBaseline = &Comparison{Case: CaseDrainRelay, Ratio: median(pairRatios), RoundRatios: pairRatios}
		results = append(results, rt)
		fmt.Fprintf(cfg.Progress, "drain: %s %.0f events/s (median pair ratio %.3f of relay; relay CPU per event %.3f of relay's)\n",
			CaseDrainRelayTraced, rt.PerSecond, rt.VsBaseline.Ratio, median(cpuRatios))
	}
	return results, nil
}

// geoMean returns the geometric mean of the ratios rs (all positive), or
// 0 when there are none. Over pairs of drains that alternate which goes
// first, it cancels an advantage of going first or second, which the
// median of an even count of pairs does not.
func geoMean(rs []float64) float64 {
	if len(rs) == 0 {
		return 0
	}
	var sum float64
	for _, r := range rs {
		sum += math.Log(r)
	}
	return math.Exp(sum / float64(len(rs)))
}

// drainRun is one relay's drain of the backlog.
type drainRun struct {
	source          string
	messages        bool // from the WAL, written in message mode
	elapsed         time.Duration
	cores, relayCPU float64
	peak, rss       float64
}

// cpuPerEvent is the relay's own CPU time per event of the n drained, in µs.
func (d *drainRun) cpuPerEvent(n int) float64 {
	return d.cores * d.elapsed.Seconds() * 1e6 / float64(n)
}

// medianRun is the run of median elapsed time among runs.
func medianRun(runs []*drainRun) *drainRun {
	rs := slices.Clone(runs)
	slices.SortFunc(rs, func(a, b *drainRun) int { return cmp.Compare(a.elapsed, b.elapsed) })
	return rs[len(rs)/2]
}

// perSecond is each run's events per second, n events a run.
func perSecond(runs []*drainRun, n int) []float64 {
	out := make([]float64, len(runs))
	for i, d := range runs {
		out[i] = float64(n) / d.elapsed.Seconds()
	}
	return out
}

// drainRelay runs one relay with source until it has published the n
// events of the backlog; traced turns tracing on with a sampler that
// samples nothing. A relay run as its own process (Config.RelayBinary) is
// done when drained reports so (for rows: the table holds no unpublished
// one); one in this process when it has recorded n events as published.
func (s *deliverSetup) drainRelay(ctx context.Context, cfg Config, source string, n int, traced bool, drained func(context.Context) bool) (*drainRun, error) {
	run := &drainRun{source: source}
	if cfg.RelayBinary != "" {
		var env []string
		if traced {
			// Tracing on, sampling nothing: the endpoint is never called.
			env = []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:1", "OTEL_TRACES_SAMPLER=always_off"}
		}
		m0, _ := readCPU()
		t0 := time.Now()
		child, err := s.startRelayProcess(ctx, cfg, source, 500*time.Millisecond, env...)
		if err != nil {
			return nil, err
		}
		err = waitEvery(ctx, 10*time.Minute, 50*time.Millisecond, func() bool { return drained(ctx) })
		run.elapsed = time.Since(t0)
		run.cores = child.cpu().Seconds() / run.elapsed.Seconds()
		run.relayCPU = cpuPerEvent(m0, n)
		run.rss = child.peakRSS()
		child.stop()
		if err != nil {
			return nil, fmt.Errorf("bench: the relay process (source %s) did not drain the backlog: %w", source, err)
		}
		return run, nil
	}
	var tp trace.TracerProvider
	if traced {
		sdk := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
		defer sdk.Shutdown(context.WithoutCancel(ctx))
		tp = sdk
	}
	r, recorded, closeRelay, err := s.newTracedRelay(ctx, cfg.Batch, 500*time.Millisecond, source, tp)
	if err != nil {
		return nil, err
	}
	runtime.GC() // the raw publishes' garbage must not count as the relay's heap
	heap := startHeapSampler()
	cpu0 := processCPU()
	m0, _ := readCPU()
	t0 := time.Now()
	if err := r.Start(ctx); err != nil {
		closeRelay()
		return nil, err
	}
	err = waitFor(ctx, 10*time.Minute, func() bool { return recorded.Load() >= int64(n) })
	run.elapsed = time.Since(t0)
	run.cores = (processCPU() - cpu0).Seconds() / run.elapsed.Seconds()
	run.relayCPU = cpuPerEvent(m0, n)
	run.peak = heap.stop()
	closeRelay()
	if err != nil {
		return nil, fmt.Errorf("bench: relay (source %s) drained %d of %d events: %w", source, recorded.Load(), n, err)
	}
	return run, nil
}

// DefaultDrainPairs is the drain scenario's pairs of drains (polling
// relay and log tailing, or untraced and traced) when Config.Rounds is 0.
const DefaultDrainPairs = 3

// drainWAL makes the table's replication slot on the empty table, fills
// the backlog in transactions of 1000 events, as rows or (messages) as
// logical decoding messages, drains it by log tailing and drops the slot
// again (the table stays).
func (s *deliverSetup) drainWAL(ctx context.Context, cfg Config, n int, messages bool) (_ *drainRun, err error) {
	dropSlot, err := s.makeSlot(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, dropSlot()) }()
	var last string // the LSN of the last message written
	for done := 0; done < n; done += 1000 {
		if messages {
			last, err = s.fillMessages(ctx, done, min(1000, n-done))
		} else {
			err = s.fillRange(ctx, done, min(1000, n-done))
		}
		if err != nil {
			return nil, err
		}
	}
	if !messages {
		return s.drainRelay(ctx, cfg, SourceCDC, n, false, s.noneUnpublished)
	}
	run, err := s.drainRelay(ctx, cfg, SourceCDC, n, false, func(ctx context.Context) bool {
		// The relay confirms a transaction's end to the server only once
		// every event of it was published (what it records with its
		// batches may lag that: batches finishing together each see the
		// other's events as not done yet).
		var done bool
		err := s.pool.QueryRow(ctx, `SELECT coalesce(confirmed_flush_lsn >= $2::pg_lsn, false) FROM pg_replication_slots WHERE slot_name = $1`,
			cdc.DefaultSlot(s.table), last).Scan(&done)
		return err == nil && done
	})
	if run != nil {
		run.messages = true
	}
	return run, err
}

// fillMessages writes the events from+1 .. from+n of the backlog as
// logical decoding messages (message mode, the format of
// outboxpgx.MessageVersion) in one transaction, and returns the LSN of
// the last.
func (s *deliverSetup) fillMessages(ctx context.Context, from, n int) (last string, err error) {
	err = s.pool.QueryRow(ctx, `SELECT max(pg_logical_emit_message(true, $4, json_build_object(
  'v', $5::int, 'id', gen_random_uuid(), 'aggregatetype', 'order', 'aggregateid', 'order-' || (g % $3), 'type', 'OrderPlaced',
  'payload', jsonb_build_object('order_id', g, 'customer', 'customer-' || (g % $3), 'total', 42.5, 'sku', 'sku-1234', 'quantity', 1))::text))::text
FROM generate_series($1::bigint + 1, $1::bigint + $2::bigint) AS g`,
		int64(from), int64(n), int64(DrainAggregates), outboxpgx.MessagePrefix(s.table), outboxpgx.MessageVersion).Scan(&last)
	if err != nil {
		return "", fmt.Errorf("bench: fill the backlog with logical decoding messages: %w", err)
	}
	return last, nil
}

// noneUnpublished reports whether the table holds no unpublished row.
func (s *deliverSetup) noneUnpublished(ctx context.Context) bool {
	var done bool
	err := s.pool.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM `+s.names.Table+` WHERE published_at IS NULL)`).Scan(&done)
	return err == nil && done
}

// makeSlot makes the table's publication and replication slot (as
// `outbox migrate --cdc`); the stream holds what commits after it. The
// returned func drops them again, so that no slot keeps WAL.
func (s *deliverSetup) makeSlot(ctx context.Context) (drop func() error, err error) {
	drv := outboxpgx.New(s.pool)
	src, err := cdc.NewSource(s.pool, s.table, &cdc.Config{SourceConfig: outboxdriver.SourceConfig{Logger: slog.New(slog.DiscardHandler)}})
	if err != nil {
		return nil, err
	}
	err = src.Setup(ctx)
	src.Close()
	if err != nil {
		return nil, fmt.Errorf("bench: --source cdc: %w", err)
	}
	return func() error {
		// Version 3 is the last without log tailing: reverting to it
		// drops the slot and the publication; the table stays, and is
		// migrated up again for the drains that follow.
		ctx := context.WithoutCancel(ctx)
		if _, err := drv.MigrateDown(ctx, s.table, 3); err != nil {
			return fmt.Errorf("bench: drop the replication slot: %w", err)
		}
		if _, err := drv.Migrate(ctx, s.table, nil); err != nil {
			return fmt.Errorf("bench: migrate the table again after dropping the replication slot: %w", err)
		}
		return nil
	}, nil
}

// drainSQL drains the table with the relay's SQL path alone.
func (s *deliverSetup) drainSQL(ctx context.Context, n, batch int) (Result, error) {
	src, err := outboxpgx.New(s.pool).NewSource(s.table, &outboxdriver.SourceConfig{RelayName: "bench-raw-sql", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return Result{}, err
	}
	defer src.Close()
	_, parts, err := src.Heartbeat(ctx, leaseTTL)
	if err != nil {
		return Result{}, err
	}
	leases, err := src.Acquire(ctx, parts, leaseTTL)
	if err != nil {
		return Result{}, err
	}
	defer src.Release(context.WithoutCancel(ctx), leases, true)
	rec := &Recorder{}
	t0 := time.Now()
	events, _, err := drain(ctx, src, leases, batch, rec)
	elapsed := time.Since(t0)
	if err != nil {
		return Result{}, err
	}
	if events != int64(n) {
		return Result{}, fmt.Errorf("check: the SQL path drained %d of %d events", events, n)
	}
	return Result{Scenario: "drain", Case: CaseDrainSQL, Workers: 1, Unit: "event", Ops: events, Seconds: elapsed.Seconds(),
		PerSecond: float64(events) / elapsed.Seconds(), Latency: rec.Summary(), Env: s.env}, nil
}

// latencyCell is one cell of the latency scenario.
type latencyCell struct {
	name   string
	rate   int           // events/s offered; 0: idle
	wakeup string        // "notify" or "poll"
	poll   time.Duration // the relay's poll interval
	longTx bool
	writer string // WriterPipelined unless Config.PlainWrites added the cell
}

// Wake-up strategies of the latency scenario.
const (
	// WakeupNotify is the default: LISTEN/NOTIFY while the relay is idle,
	// the poll interval as a safety net.
	WakeupNotify = "notify"
	// WakeupPoll disables the notify trigger: the relay finds new events
	// by polling alone.
	WakeupPoll = "poll"
)

// LatencyCases returns the names of the latency scenario's cells.
func LatencyCases() []string {
	return []string{"idle", "idle_poll_10ms", "poll_500ms", "poll_10ms", "notify", "notify_long_tx",
		"notify_pgx", "notify_sql", "notify_long_tx_pgx", "notify_long_tx_sql",
		WriterOrderOnly, WriterWatermill, WriterOrderOnly + "_long_tx", WriterWatermill + "_long_tx"}
}

// latencyCells lists the latency scenario's cells at rates, with the
// writers of plain (Config.PlainWrites) beside each notify cell; with
// only, those of these names.
func latencyCells(rates []int, only []string, plain bool) []latencyCell {
	cells := []latencyCell{
		{"idle", 0, WakeupNotify, 500 * time.Millisecond, false, WriterPipelined},
		{"idle_poll_10ms", 0, WakeupPoll, 10 * time.Millisecond, false, WriterPipelined},
		{"poll_500ms", 100, WakeupPoll, 500 * time.Millisecond, false, WriterPipelined},
		{"poll_10ms", 100, WakeupPoll, 10 * time.Millisecond, false, WriterPipelined},
	}
	for _, r := range rates {
		c := latencyCell{"notify", r, WakeupNotify, 500 * time.Millisecond, false, WriterPipelined}
		cells = append(cells, c)
		if plain {
			cells = append(cells, plainCells(c)...)
		}
		if r == 2000 {
			c.name, c.longTx = "notify_long_tx", true
			cells = append(cells, c)
			if plain {
				cells = append(cells, plainCells(c)...)
			}
		}
	}
	if len(only) > 0 {
		cells = slices.DeleteFunc(cells, func(c latencyCell) bool { return !slices.Contains(only, c.name) })
	}
	return cells
}

// DefaultRates returns the offered loads of the latency scenario, events/s.
func DefaultRates() []int { return []int{100, 1000, 2000, 5000} }

// LatencyWriters is the number of writers that share the offered load.
const LatencyWriters = 8

// CommitToConsumer measures commit-to-consumer latency: writers commit one event
// per transaction at a steady offered rate (open loop: a transaction is
// due at its time whether or not the earlier ones finished) while one
// relay publishes to the broker of cfg.Sink, and a consumer on the broker
// side takes the time each event arrives. The latency of an event is from
// the return of its transaction's Commit to its arrival. Cells: the relay
// idle (its CPU), the wake-up strategies side by side at 100 events/s, and
// every rate of cfg.Rates with LISTEN/NOTIFY, 2000 events/s once more with
// an unrelated transaction held open throughout. Every committed event
// must arrive, or the scenario fails.
func CommitToConsumer(ctx context.Context, cfg Config) (results []Result, err error) {
	if cfg, err = cfg.deliverDefaults(); err != nil {
		return nil, err
	}
	if int(cfg.Pool.Config().MaxConns) < LatencyWriters+4 {
		return nil, fmt.Errorf("bench: the latency scenario needs a pool of at least %d connections", LatencyWriters+4)
	}
	s, cleanup, err := newDeliverSetup(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, cleanup()) }()
	s.env.DurationSeconds, s.env.Rounds, s.env.WarmupSeconds = cfg.Duration.Seconds(), 1, cfg.Warmup.Seconds()
	s.env.RelayProcess = cfg.RelayBinary != ""

	if cfg.Source == SourceCDC {
		dropSlot, serr := s.makeSlot(ctx) // before the first event
		if serr != nil {
			return nil, serr
		}
		defer func() { err = errors.Join(err, dropSlot()) }()
	}
	lt := &latencyRun{s: s, cfg: cfg}
	stop, err := s.broker.Consume(ctx, lt.arrived)
	if err != nil {
		return nil, err
	}
	defer stop()
	lt.drv = outboxpgx.New(s.pool)
	lt.ob, err = outbox.New(lt.drv, &outbox.Config{Schema: s.table.Schema, Table: s.table.Name})
	if err != nil {
		return nil, err
	}
	if cfg.PlainWrites {
		if lt.plain, err = s.newPlainWriters(ctx); err != nil {
			return nil, err
		}
		defer lt.plain.close()
	}
	for _, c := range latencyCells(cfg.Rates, cfg.Cases, cfg.PlainWrites) {
		res, err := lt.cell(ctx, c)
		if err != nil {
			return nil, fmt.Errorf("%s at %d events/s: %w", c.name, c.rate, err)
		}
		fmt.Fprintf(cfg.Progress, "latency: %s at %d events/s: p50 %s p99 %s, %.3f cores\n", c.name, c.rate,
			fmtMs(res.Latency.P50), fmtMs(res.Latency.P99), res.Delivery.ProcessCores)
		results = append(results, res)
	}
	return results, nil
}

type latencyRun struct {
	s   *deliverSetup
	cfg Config
	ob  *outbox.Outbox[pgx.Tx]
	drv *outboxpgx.Driver
	// plain writes in ordinary transactions (Config.PlainWrites).
	plain *plainWriters

	mu        sync.Mutex
	committed map[string]time.Time // the cell's events, by id: when Commit returned
	arrivals  map[string]time.Time // when the consumer saw them

	errMu sync.Mutex
	err   error // the first failed write
}

func (lt *latencyRun) arrived(id string) {
	now := time.Now()
	lt.mu.Lock()
	if lt.arrivals != nil {
		if _, dup := lt.arrivals[id]; !dup {
			lt.arrivals[id] = now
		}
	}
	lt.mu.Unlock()
}

func (lt *latencyRun) cell(ctx context.Context, c latencyCell) (Result, error) {
	s := lt.s
	trigger := "ENABLE"
	if c.wakeup == WakeupPoll {
		trigger = "DISABLE"
	}
	switch {
	case lt.cfg.Wakeups != outboxdriver.WakeupsWriters:
		if _, err := s.pool.Exec(ctx, `ALTER TABLE `+s.names.Table+` `+trigger+` TRIGGER `+outboxdriver.QuoteIdent(s.table.Name+"_notify")); err != nil {
			return Result{}, err
		}
	case c.wakeup == WakeupPoll:
		// The writers wake relays themselves: no cell without wake-ups.
		return Result{}, fmt.Errorf("bench: latency cell %s polls without wake-ups, which the writers send with --wakeups writers: pick the notify cells with --cases", c.name)
	}
	lt.mu.Lock()
	lt.committed, lt.arrivals = map[string]time.Time{}, map[string]time.Time{}
	lt.mu.Unlock()

	relayCPU := func() time.Duration { return 0 }
	if lt.cfg.RelayBinary != "" {
		child, err := s.startRelayProcess(ctx, lt.cfg, lt.cfg.Source, c.poll)
		if err != nil {
			return Result{}, err
		}
		defer child.stop()
		relayCPU = child.cpu
	} else {
		r, _, closeRelay, err := s.newRelay(ctx, lt.cfg.Batch, c.poll, lt.cfg.Source)
		if err != nil {
			return Result{}, err
		}
		defer closeRelay()
		if err := r.Start(ctx); err != nil {
			return Result{}, err
		}
		if err := waitFor(ctx, time.Minute, r.Ready); err != nil {
			return Result{}, fmt.Errorf("relay not ready: %w", err)
		}
	}
	if c.longTx {
		tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		if err != nil {
			return Result{}, err
		}
		// An xid and a snapshot, held until the cell ends: the oldest
		// transaction the server must keep row versions for.
		if _, err := tx.Exec(ctx, `SELECT txid_current(), count(*) FROM `+s.names.Leases); err != nil {
			tx.Rollback(ctx)
			return Result{}, err
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
	}

	from := time.Now().Add(lt.cfg.Warmup)
	to := from.Add(lt.cfg.Duration)
	heap := startHeapSampler()
	var cpu0, relay0 time.Duration
	var m0 CPUTime
	var measuredFrom time.Time
	if c.rate == 0 {
		sleepUntil(ctx, from)
		cpu0, relay0, measuredFrom = processCPU(), relayCPU(), time.Now()
		m0, _ = readCPU()
		sleepUntil(ctx, to)
	} else {
		var ok bool
		cpu0, relay0, m0, measuredFrom, ok = lt.offer(ctx, c.writer, c.rate, from, to, relayCPU)
		if !ok {
			return Result{}, ctx.Err()
		}
	}
	window := time.Since(measuredFrom)
	cores := (processCPU() - cpu0).Seconds() / window.Seconds()
	relayCores := (relayCPU() - relay0).Seconds() / window.Seconds()
	m1, _ := readCPU()
	peak := heap.stop()
	if err := lt.writeErr(); err != nil {
		return Result{}, err
	}

	// Every committed event must arrive.
	lt.mu.Lock()
	want := len(lt.committed)
	lt.mu.Unlock()
	err := waitFor(ctx, time.Minute, func() bool {
		lt.mu.Lock()
		defer lt.mu.Unlock()
		n := 0
		for id := range lt.committed {
			if _, ok := lt.arrivals[id]; ok {
				n++
			}
		}
		return n == want
	})
	if err != nil {
		return Result{}, fmt.Errorf("check: not every committed event arrived within a minute: %w", err)
	}
	rec := &Recorder{}
	var inWindow int64
	if baselineWriter(c.writer) {
		rec, inWindow = lt.baselineRecorder(from, to)
	}
	lt.mu.Lock()
	for id, at := range lt.committed {
		if at.Before(from) || !at.Before(to) {
			continue
		}
		inWindow++
		rec.Record(max(lt.arrivals[id].Sub(at), 0))
	}
	lt.committed, lt.arrivals = nil, nil
	lt.mu.Unlock()

	desc := fmt.Sprintf("%s wake-up, poll interval %s", c.wakeup, c.poll)
	if c.rate == 0 {
		desc = "no load: the relay waits (" + desc + ")"
	}
	if c.longTx {
		desc += ", an unrelated transaction open throughout"
	}
	if lt.cfg.Source == SourceCDC {
		desc += "; the relay tails the WAL (--source cdc)"
	}
	switch c.writer {
	case WriterPgx:
		desc += "; writers: WriteTx in an ordinary transaction on a pgx.Tx (BEGIN, INSERT, COMMIT)"
	case WriterSQL:
		desc += "; writers: WriteTx in an ordinary transaction on a *sql.Tx (BEGIN, INSERT, COMMIT)"
	case WriterOrderOnly:
		desc = "baseline, no outbox: BEGIN, INSERT an order, COMMIT on a pgx.Tx; latency: the transaction's own time"
	case WriterWatermill:
		desc = "baseline: BEGIN, INSERT Watermill's outbox row, COMMIT on a pgx.Tx (nothing relays it); latency: the transaction's own time"
	}
	if baselineWriter(c.writer) && c.longTx {
		desc += ", an unrelated transaction open throughout"
	}
	res := Result{
		Scenario: "latency", Case: c.name, Description: desc, Workers: LatencyWriters, Unit: "event",
		Ops: inWindow, Seconds: lt.cfg.Duration.Seconds(), PerSecond: float64(inWindow) / lt.cfg.Duration.Seconds(),
		Latency: rec.Summary(), CPUBusy: m1.Sub(m0).Fraction(), Env: s.env,
		Delivery: &DeliveryFigures{Broker: s.broker.Describe(), Events: int64(want), ProcessCores: cores, RelayCores: relayCores, PeakHeapMiB: peak,
			OfferedPerSecond: c.rate, Wakeup: c.wakeup, LongTx: c.longTx},
	}
	if c.rate == 0 {
		res.Workers = 0
	}
	return res, nil
}

// offer runs LatencyWriters writers committing one event per transaction
// at rate events/s from now until to, and returns the process's and the
// machine's CPU time at from, when the measured window began.
func (lt *latencyRun) offer(ctx context.Context, writer string, rate int, from, to time.Time, relayCPU func() time.Duration) (cpu0, relay0 time.Duration, m0 CPUTime, at time.Time, ok bool) {
	due := make(chan time.Time, 1024)
	var wg sync.WaitGroup
	for range LatencyWriters {
		wg.Go(func() {
			for t := range due {
				if err := lt.write(ctx, writer, t); err != nil {
					lt.setWriteErr(err)
				}
			}
		})
	}
	start := time.Now()
	interval := time.Second / time.Duration(rate)
	measured := false
	for k := 0; ; k++ {
		t := start.Add(time.Duration(k) * interval)
		if !t.Before(to) {
			break
		}
		if !measured && !t.Before(from) {
			sleepUntil(ctx, from)
			cpu0, relay0, at, measured = processCPU(), relayCPU(), time.Now(), true
			m0, _ = readCPU()
		}
		if d := time.Until(t); d > 0 {
			if !sleepUntil(ctx, t) {
				break
			}
		}
		select {
		case due <- t:
		case <-ctx.Done():
		}
		if ctx.Err() != nil || lt.writeErr() != nil {
			break
		}
	}
	close(due)
	wg.Wait()
	return cpu0, relay0, m0, at, ctx.Err() == nil
}

// write commits one transaction with one event and notes when its COMMIT
// returned. The transaction goes as one pipeline (BEGIN, the event's
// INSERT, COMMIT: one round trip), so that the load costs the machine the
// relay shares as little as it can; what is measured starts at the
// commit either way.
func (lt *latencyRun) write(ctx context.Context, writer string, _ time.Time) error {
	id := uuid.Must(uuid.NewV7()).String()
	ev := outbox.Event{ID: id, AggregateType: "order", AggregateID: "order-" + id[len(id)-3:], Type: "OrderPlaced",
		Payload: []byte(`{"order_id": "` + id + `", "total": 42.5}`)}
	var err error
	if writer == WriterPipelined {
		err = lt.pipelined(ctx, ev)
	} else {
		// BEGIN, the INSERT, COMMIT: three round trips, as an
		// application's ordinary transaction.
		err = lt.writePlain(ctx, writer, ev)
	}
	if err != nil {
		return err
	}
	if baselineWriter(writer) {
		return nil // nothing to deliver: writePlain noted the transaction
	}
	now := time.Now()
	lt.mu.Lock()
	lt.committed[id] = now
	lt.mu.Unlock()
	return nil
}

// pipelined commits ev's transaction as one pipeline.
func (lt *latencyRun) pipelined(ctx context.Context, ev outbox.Event) error {
	var b pgx.Batch
	b.Queue(`begin`) // not Batch.BeginTx: its transaction would hold the connection until committed through pgx
	if err := lt.ob.Queue(ctx, &b, ev); err != nil {
		return err
	}
	commit := b.Queue(`commit`)
	commit.Exec(func(ct pgconn.CommandTag) error {
		if ct.String() != "COMMIT" {
			return fmt.Errorf("bench: the event's transaction ended with %s", ct)
		}
		return nil
	})
	return lt.s.pool.SendBatch(ctx, &b).Close()
}

func (lt *latencyRun) setWriteErr(err error) {
	lt.errMu.Lock()
	defer lt.errMu.Unlock()
	if lt.err == nil {
		lt.err = err
	}
}

func (lt *latencyRun) writeErr() error {
	lt.errMu.Lock()
	defer lt.errMu.Unlock()
	return lt.err
}

// errNoConsumer is returned by a broker without a consumer.
var errNoConsumer = errors.New("bench: no consumer")

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

// relayProcess is `outbox relay` running as a child process.
type relayProcess struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// startRelayProcess starts the relay as a child process and waits until it
// holds the table's partitions.
func (s *deliverSetup) startRelayProcess(ctx context.Context, cfg Config, source string, poll time.Duration, env ...string) (*relayProcess, error) {
	if cfg.DatabaseURL == "" {
		return nil, errors.New("bench: Config.RelayBinary needs Config.DatabaseURL")
	}
	args := append([]string{"relay", "--db", cfg.DatabaseURL, "--schema", s.table.Schema, "--table", s.table.Name,
		"--route-replacement", s.broker.Destination(), "--poll-interval", poll.String(),
		"--batch", strconv.Itoa(cfg.Batch), "--lanes", strconv.Itoa(cmp.Or(cfg.Lanes, relay.DefaultLanes)), "--linger", cfg.Linger.String(), "--log-level", "error"},
		s.broker.RelayArgs()...)
	leases := `SELECT count(*) FROM ` + s.names.Leases + ` WHERE owner IS NOT NULL AND expires_at > clock_timestamp()`
	if source == SourceCDC {
		args = append(args, "--source", "cdc")
		leases = `SELECT count(*) FROM ` + s.table.Qualified("_cdc") + ` WHERE owner IS NOT NULL AND expires_at > clock_timestamp()`
	}
	cmd := exec.Command(cfg.RelayBinary, args...)
	cmd.Env = append(os.Environ(), env...)
	if e, ok := s.broker.(relayEnver); ok {
		cmd.Env = append(cmd.Env, e.RelayEnv()...)
	}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: start the relay process: %w", err)
	}
	p := &relayProcess{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	err := waitFor(ctx, time.Minute, func() bool {
		select {
		case <-p.done:
			return true
		default:
		}
		var n int
		err := s.pool.QueryRow(ctx, leases).Scan(&n)
		return err == nil && n > 0
	})
	select {
	case <-p.done:
		return nil, errors.New("bench: the relay process exited at start")
	default:
	}
	if err != nil {
		p.stop()
		return nil, fmt.Errorf("bench: the relay process took no partition: %w", err)
	}
	return p, nil
}

// cpu is the relay process's CPU time so far (user and system), from
// /proc/<pid>/stat; 0 where it cannot be read.
func (p *relayProcess) cpu() time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/stat")
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses: utime and
	// stime are the 12th and 13th of them, in USER_HZ ticks (100/s).
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// peakRSS is the relay process's peak resident set size in MiB (VmHWM of
// /proc/<pid>/status); 0 where it cannot be read.
func (p *relayProcess) peakRSS() float64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

// stop stops the relay with SIGTERM, as an operator would.
func (p *relayProcess) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
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
