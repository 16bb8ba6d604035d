package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxpgx/cdc"
	"github.com/outboxkit/outbox/relay"
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
	return makeSlot(ctx, s.pool, s.table)
}

// makeSlot makes table t's publication and replication slot, and returns
// the func that drops them again (migrating t down to version 3 and up
// again, which keeps the table).
func makeSlot(ctx context.Context, pool *pgxpool.Pool, t outboxdriver.Table) (drop func() error, err error) {
	drv := outboxpgx.New(pool)
	src, err := cdc.NewSource(pool, t, &cdc.Config{SourceConfig: outboxdriver.SourceConfig{Logger: slog.New(slog.DiscardHandler)}})
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
		if _, err := drv.MigrateDown(ctx, t, 3); err != nil {
			return fmt.Errorf("bench: drop the replication slot: %w", err)
		}
		if _, err := drv.Migrate(ctx, t, nil); err != nil {
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
