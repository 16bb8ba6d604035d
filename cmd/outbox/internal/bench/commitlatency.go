package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

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
