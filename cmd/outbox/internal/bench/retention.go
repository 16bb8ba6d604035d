package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

// The modes of the retention scenario, its cases.
const (
	// ModeDelete drains with outboxdriver.RetentionDelete: Finish deletes the
	// published rows in the claim's transaction.
	ModeDelete = "delete"
	// ModeKeep drains with outboxdriver.RetentionKeep: Finish sets
	// published_at, and Source.Cleanup deletes the rows afterwards.
	ModeKeep = "keep"
	// ModePartitions drains a table partitioned by hour
	// (MigrateOptions.TimePartitions) with RetentionKeep, the backlog
	// spread over the last 24 hours (a day of partitions), and drops the
	// partitions afterwards (MaintainTimePartitions) instead of deleting
	// rows.
	ModePartitions = "partitions"
	// ModeKeepLongTx and ModePartitionsLongTx are keep and partitions with
	// a transaction holding a snapshot open from before the fill until
	// after the VACUUM that follows the cleanup: what a long transaction
	// elsewhere in the database does to either.
	ModeKeepLongTx       = "keep-longtx"
	ModePartitionsLongTx = "partitions-longtx"
)

// Defaults of the retention scenario.
const (
	DefaultEvents          = 100000
	DefaultBatch           = 500
	DefaultRetentionRounds = 2
	// MaxEvents and MaxBatch bound Config.Events and Config.Batch.
	MaxEvents = 10000000
	MaxBatch  = 10000
	// CleanupLimit is the limit of every Source.Cleanup call of the
	// retention scenario: it calls Cleanup until a call deletes fewer.
	CleanupLimit = 1000
	// RetentionAggregates is how many aggregates the backlog's events are
	// spread over (round robin), and so over the partitions.
	RetentionAggregates = 1000
)

// Counters reported by the retention scenario, summed over the rounds.
const (
	// CounterDrained counts the events claimed and finished as published.
	CounterDrained = "drained"
	// CounterBatches counts the non-empty claims.
	CounterBatches = "batches"
	// CounterRowsAfterDrain counts the rows left in the outbox table after
	// each drain: 0 in delete mode, the backlog in keep mode.
	CounterRowsAfterDrain = "rows_after_drain"
	// CounterUnpublishedAfterDrain counts the rows left with published_at
	// unset after each drain: 0 in both modes.
	CounterUnpublishedAfterDrain = "unpublished_after_drain"
	// CounterCleaned counts the rows Cleanup deleted (keep mode only).
	CounterCleaned = "cleaned"
	// CounterRowsAfterCleanup counts the rows left after the cleanup: 0
	// (keep mode only).
	CounterRowsAfterCleanup = "rows_after_cleanup"
)

// RetentionFigures are what the retention scenario measured of one mode
// besides the drain's throughput (Result.PerSecond, RoundsPerSecond). The
// embedded RetentionRound holds the median of every figure over Rounds
// (with two rounds, their mean).
type RetentionFigures struct {
	// Mode is ModeDelete or ModeKeep.
	Mode string `json:"mode"`
	// Partitions is how many partitions the outbox table has; the relay
	// leased them all.
	Partitions int `json:"partitions"`
	RetentionRound
	// Rounds holds every round's figures, in the order run.
	Rounds []RetentionRound `json:"rounds"`
}

// RetentionRound is one drain of a fresh backlog, and for keep mode the
// cleanup after it. Sizes are pg_total_relation_size of the outbox table
// (heap, indexes and TOAST); tuple counts are pg_stat_user_tables'. No
// VACUUM runs in between (autovacuum is off for the scenario's tables).
type RetentionRound struct {
	// Events were drained in Batches claims over DrainSeconds: PerSecond.
	Events       int64   `json:"events"`
	Batches      int64   `json:"batches"`
	DrainSeconds float64 `json:"drain_seconds"`
	PerSecond    float64 `json:"per_second"`
	// FillSeconds inserted the backlog (one INSERT ... SELECT), which left
	// the table at FilledBytes.
	FillSeconds float64 `json:"fill_seconds"`
	FilledBytes int64   `json:"filled_bytes"`
	// BytesAfterDrain, DeadTuplesAfterDrain and LiveTuplesAfterDrain
	// describe the table once drained.
	BytesAfterDrain      int64 `json:"bytes_after_drain"`
	DeadTuplesAfterDrain int64 `json:"dead_tuples_after_drain"`
	LiveTuplesAfterDrain int64 `json:"live_tuples_after_drain"`
	// The cleanup of keep mode deleted CleanupRows in CleanupCalls calls of
	// Source.Cleanup over CleanupSeconds: CleanupPerSecond. Zero in delete
	// mode.
	CleanupRows      int64   `json:"cleanup_rows,omitempty"`
	CleanupCalls     int64   `json:"cleanup_calls,omitempty"`
	CleanupSeconds   float64 `json:"cleanup_seconds,omitempty"`
	CleanupPerSecond float64 `json:"cleanup_per_second,omitempty"`
	// BytesAfterCleanup and DeadTuplesAfterCleanup describe the table once
	// cleaned up (keep mode only).
	BytesAfterCleanup      int64 `json:"bytes_after_cleanup,omitempty"`
	DeadTuplesAfterCleanup int64 `json:"dead_tuples_after_cleanup,omitempty"`
	// BytesAfterVacuum and DeadTuplesAfterVacuum describe it after a VACUUM
	// that follows the cleanup (cleanup modes only).
	BytesAfterVacuum      int64 `json:"bytes_after_vacuum,omitempty"`
	DeadTuplesAfterVacuum int64 `json:"dead_tuples_after_vacuum,omitempty"`
	// PartitionsDropped counts the partitions the cleanup dropped
	// (partitions modes only).
	PartitionsDropped int64 `json:"partitions_dropped,omitempty"`
}

type retentionMode struct {
	name, desc string
	retention  outboxdriver.Retention
	byTime     bool // a table partitioned by hour, cleaned up by dropping partitions
	longTx     bool // a snapshot held open from before the fill to after the VACUUM
}

// PartitionHours is how many hourly partitions the partitions modes'
// backlog is spread over: a day.
const PartitionHours = 24

var retentionModes = []retentionMode{
	{name: ModeDelete, desc: "RetentionDelete: Finish deletes the published rows in the claim's transaction", retention: outboxdriver.RetentionDelete},
	{name: ModeKeep, desc: fmt.Sprintf("RetentionKeep: Finish sets published_at; then Cleanup(leases, 0, %d) until a call deletes fewer", CleanupLimit), retention: outboxdriver.RetentionKeep},
	{name: ModePartitions, desc: fmt.Sprintf("RetentionKeep on a table partitioned by hour, the backlog's created_at spread over the last %d hours; then one MaintainTimePartitions drops the %d partitions", PartitionHours, PartitionHours),
		retention: outboxdriver.RetentionKeep, byTime: true},
	{name: ModeKeepLongTx, desc: "keep, with a REPEATABLE READ transaction holding its snapshot from before the fill to after the VACUUM", retention: outboxdriver.RetentionKeep, longTx: true},
	{name: ModePartitionsLongTx, desc: "partitions, with the same long transaction", retention: outboxdriver.RetentionKeep, byTime: true, longTx: true},
}

// retentionDefaults fills in the retention scenario's defaults and
// validates c.
func (c Config) retentionDefaults() (Config, error) {
	if c.Pool == nil {
		return c, errors.New("bench: Config.Pool is nil")
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
	if c.Batch < 1 || c.Batch > MaxBatch {
		return c, fmt.Errorf("bench: batch %d: use 1 to %d", c.Batch, MaxBatch)
	}
	if c.Rounds == 0 {
		c.Rounds = DefaultRetentionRounds
	}
	if c.Rounds < 0 {
		return c, fmt.Errorf("bench: rounds %d must be positive", c.Rounds)
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	return c, nil
}

// RetentionModes measures the trade-off between the relay's two retention
// modes on its SQL path alone, with no broker: one polling Source of outboxpgx, having
// leased every partition, claims cfg.Batch events at a time and finishes
// each batch as published, until a claim comes back empty.
//
// For each mode, in each of cfg.Rounds rounds (odd rounds delete first,
// even rounds keep first), it migrates a fresh outbox table in the
// scenario's schema, fills it with cfg.Events events in one INSERT ...
// SELECT of the Debezium columns (RetentionAggregates aggregates, round
// robin), runs ANALYZE and a CHECKPOINT when the role may, and drains it.
// Autovacuum is off for the table, so what the drain leaves for VACUUM
// shows: after the drain it reads the table's total size and, once every
// backend's statistics are flushed, its dead and live tuples. In keep mode
// it then checkpoints again and calls Source.Cleanup(leases, 0,
// CleanupLimit) until a call deletes fewer than CleanupLimit rows, and
// reads size and dead tuples again. It checks that every event was
// drained once, that the delete drain left the table empty and the keep
// drain every row published, and that the cleanup deleted them all. Each
// table is dropped after its round.
//
// It returns one Result per mode, delete first, compared with delete: the
// median drain throughput of the rounds (events/s), the latency of a batch
// (one Claim and Finish), the machine's CPU use while draining, and
// RetentionFigures.
func RetentionModes(ctx context.Context, cfg Config) (results []Result, err error) {
	cfg, err = cfg.retentionDefaults()
	if err != nil {
		return nil, err
	}
	pool := cfg.Pool
	env, err := ReadEnv(ctx, pool, "autovacuum")
	if err != nil {
		return nil, err
	}
	env.Rounds, env.Events, env.Batch, env.CleanupLimit = cfg.Rounds, cfg.Events, cfg.Batch, CleanupLimit

	schema, drop, err := freshSchema(ctx, pool, cfg.Schema)
	if err != nil {
		return nil, err
	}
	defer func() {
		if derr := drop(); derr != nil && err == nil {
			err = derr
		}
	}()
	rb := &retentionBench{pool: pool, schema: schema, events: cfg.Events, batch: cfg.Batch}
	if env.Checkpoint, err = checkpoint(ctx, pool); err != nil {
		return nil, err
	}
	rb.checkpoint = env.Checkpoint
	if err := pool.QueryRow(ctx, `SELECT coalesce(has_function_privilege(to_regprocedure('pg_stat_force_next_flush()'), 'EXECUTE'), false)`).Scan(&rb.forceFlush); err != nil {
		return nil, fmt.Errorf("bench: look for pg_stat_force_next_flush: %w", err)
	}

	n := len(retentionModes)
	rounds := make([][]RetentionRound, n)
	batches := make([]Recorder, n)
	cpu := make([]CPUTime, n)
	step, total := 0, cfg.Rounds*n
	for r := range cfg.Rounds {
		for k := range n {
			i := k
			if r%2 == 1 {
				i = n - 1 - k
			}
			m := retentionModes[i]
			step++
			rr, err := rb.run(ctx, m, r+1, &batches[i], &cpu[i])
			if err != nil {
				return nil, fmt.Errorf("retention %s, round %d: %w", m.name, r+1, err)
			}
			rounds[i] = append(rounds[i], rr)
			fmt.Fprintf(cfg.Progress, "[%d/%d] round %d  %-6s drained %d events in %.2fs: %.0f events/s; %s, %d dead tuples",
				step, total, r+1, m.name, rr.Events, rr.DrainSeconds, rr.PerSecond, mib(rr.BytesAfterDrain), rr.DeadTuplesAfterDrain)
			if m.retention == outboxdriver.RetentionKeep {
				fmt.Fprintf(cfg.Progress, "; cleanup %d rows in %.2fs: %.0f rows/s; %s, %d dead tuples; after VACUUM %s, %d dead tuples",
					rr.CleanupRows, rr.CleanupSeconds, rr.CleanupPerSecond, mib(rr.BytesAfterCleanup), rr.DeadTuplesAfterCleanup,
					mib(rr.BytesAfterVacuum), rr.DeadTuplesAfterVacuum)
			}
			fmt.Fprintln(cfg.Progress)
		}
	}
	env.SchemaVersion = rb.schemaVersion

	results = make([]Result, n)
	cells := make([]Cell, n)
	for i, m := range retentionModes {
		rs := rounds[i]
		res := Result{
			Scenario: "retention", Case: m.name, Description: m.desc, Workers: 1, Unit: "event",
			Latency: batches[i].Summary(), CPUBusy: cpu[i].Fraction(), Env: env,
			Counters:  map[string]int64{},
			Retention: &RetentionFigures{Mode: m.name, Partitions: rb.partitions, Rounds: rs},
		}
		for _, rr := range rs {
			res.Ops += rr.Events
			res.Seconds += rr.DrainSeconds
			res.RoundsPerSecond = append(res.RoundsPerSecond, rr.PerSecond)
			res.Counters[CounterDrained] += rr.Events
			res.Counters[CounterBatches] += rr.Batches
		}
		for k, v := range rb.counters[m.name] {
			res.Counters[k] += v
		}
		res.PerSecond = median(res.RoundsPerSecond)
		res.Retention.RetentionRound = medianRound(rs)
		results[i] = res
		cells[i] = Cell{Case: m.name, Workers: 1, Baseline: m.retention == outboxdriver.RetentionDelete}
	}
	compare(cells, results)
	return results, nil
}

// retentionBench holds what the rounds of the retention scenario share.
type retentionBench struct {
	pool            *pgxpool.Pool
	schema          string
	events, batch   int
	checkpoint      bool
	forceFlush      bool // pg_stat_force_next_flush() may be called
	schemaVersion   int
	partitions      int
	counters        map[string]map[string]int64 // by mode
	relayNameSerial int
}

// leaseTTL is the lease the relay takes on every partition: longer than
// any drain, so that no lease expires during one.
const leaseTTL = time.Hour

// run fills a fresh table, drains it in mode m and, in keep mode, cleans
// it up; it drops the table at the end. It records the latency of every
// batch in batches and adds the machine's CPU time while draining to cpu.
func (rb *retentionBench) run(ctx context.Context, m retentionMode, round int, batches *Recorder, cpu *CPUTime) (rr RetentionRound, err error) {
	t := outboxdriver.Table{Schema: rb.schema, Name: "outbox_" + strings.ReplaceAll(m.name, "-", "_") + "_" + strconv.Itoa(round)}
	names := pgschema.NamesOf(t)
	var opts *outboxdriver.MigrateOptions
	if m.byTime {
		opts = &outboxdriver.MigrateOptions{TimePartitions: outboxdriver.TimePartitionsHour, TimePartitionsAhead: 2}
	}
	versions, err := outboxpgx.New(rb.pool).Migrate(ctx, t, opts)
	if err != nil {
		return rr, err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if _, derr := outboxpgx.New(rb.pool).MigrateDown(dctx, t, 0); derr != nil && err == nil {
			err = fmt.Errorf("bench: drop table %s: %w", t, derr)
		}
	}()
	if len(versions) > 0 {
		rb.schemaVersion = slices.Max(versions)
	}
	// Autovacuum would reclaim dead tuples at a moment of its choosing and
	// blur what each mode leaves behind; ANALYZE below stands in for its
	// analyze, so that the claim is planned on a table of known size.
	created := ""
	if m.byTime {
		// A day of past hours, each its own partition (relays make them
		// ahead of time; these are made here for a backlog dated back).
		created = `date_trunc('hour', now()) - interval '` + strconv.Itoa(PartitionHours) + ` hours' + (g - 1) * (interval '` + strconv.Itoa(PartitionHours) + ` hours' / $1::bigint)`
		if _, err := rb.pool.Exec(ctx, `DO $do$
DECLARE
    lo timestamp := date_trunc('hour', now() AT TIME ZONE 'UTC');
BEGIN
    FOR h IN 1..`+strconv.Itoa(PartitionHours)+` LOOP
        EXECUTE format('CREATE TABLE IF NOT EXISTS %I.%I PARTITION OF `+names.Table+` FOR VALUES FROM (%L) TO (%L)',
            `+pgschema.QuoteLiteral(t.Schema)+`, `+pgschema.QuoteLiteral(t.Name)+` || '_p' || to_char(lo - h * interval '1 hour', 'YYYYMMDDHH24'),
            (lo - h * interval '1 hour') AT TIME ZONE 'UTC', (lo - (h - 1) * interval '1 hour') AT TIME ZONE 'UTC');
    END LOOP;
END
$do$`); err != nil {
			return rr, fmt.Errorf("bench: make the past partitions: %w", err)
		}
	}
	// Autovacuum off on the table and, for a partitioned one, on every
	// partition (a partitioned table has no storage of its own).
	if _, err := rb.pool.Exec(ctx, `DO $do$
DECLARE
    r regclass;
BEGIN
    FOR r IN SELECT t.relid FROM `+leavesOf(pgschema.QuoteLiteral(names.Table))+` t LOOP
        EXECUTE format('ALTER TABLE %s SET (autovacuum_enabled = false, toast.autovacuum_enabled = false)', r);
    END LOOP;
END
$do$`); err != nil {
		return rr, fmt.Errorf("bench: turn autovacuum off: %w", err)
	}
	if m.longTx {
		conn, aerr := rb.pool.Acquire(ctx)
		if aerr != nil {
			return rr, aerr
		}
		_, berr := conn.Exec(ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ`)
		if berr == nil {
			_, berr = conn.Exec(ctx, `SELECT count(*) FROM pg_class`) // takes the snapshot
		}
		if berr != nil {
			conn.Release()
			return rr, fmt.Errorf("bench: open the long transaction: %w", berr)
		}
		defer func() {
			if _, rerr := conn.Exec(context.WithoutCancel(ctx), `ROLLBACK`); rerr != nil && err == nil {
				err = fmt.Errorf("bench: end the long transaction: %w", rerr)
			}
			conn.Release()
		}()
	}

	// The backlog: plain SQL with the Debezium columns, every other column
	// left to its default (seq, partition, created_at...).
	t0 := time.Now()
	cols, vals := "", ""
	if created != "" {
		cols, vals = ", created_at", ", "+created
	}
	tag, err := rb.pool.Exec(ctx, `INSERT INTO `+names.Table+` (id, aggregatetype, aggregateid, type, payload`+cols+`)
SELECT gen_random_uuid(), 'order', 'order-' || (g % $2), 'OrderPlaced',
       jsonb_build_object('order_id', g, 'customer', 'customer-' || (g % $2), 'total', 42.5, 'sku', 'sku-1234', 'quantity', 1)`+vals+`
FROM generate_series(1, $1::bigint) AS g
ORDER BY g`, rb.events, int64(RetentionAggregates))
	if err != nil {
		return rr, fmt.Errorf("bench: fill the backlog: %w", err)
	}
	if tag.RowsAffected() != int64(rb.events) {
		return rr, fmt.Errorf("bench: fill the backlog: %d rows inserted, want %d", tag.RowsAffected(), rb.events)
	}
	rr.FillSeconds = time.Since(t0).Seconds()
	// ANALYZE sets the live tuple count: let the statistics count the
	// inserts first, or they would be added to its count afterwards.
	want := tupleCounts{inserted: int64(rb.events)}
	if _, err := rb.stats(ctx, names.Table, want); err != nil {
		return rr, err
	}
	if _, err := rb.pool.Exec(ctx, `ANALYZE `+names.Table); err != nil {
		return rr, fmt.Errorf("bench: analyze: %w", err)
	}
	if rr.FilledBytes, err = rb.size(ctx, names.Table); err != nil {
		return rr, err
	}

	// One relay, every partition leased.
	rb.relayNameSerial++
	src, err := outboxpgx.New(rb.pool).NewSource(t, &outboxdriver.SourceConfig{
		Retention: m.retention,
		RelayName: "bench-retention-" + strconv.Itoa(rb.relayNameSerial),
		Logger:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return rr, err
	}
	defer src.Close()
	_, partitions, err := src.Heartbeat(ctx, leaseTTL)
	if err != nil {
		return rr, err
	}
	leases, err := src.Acquire(ctx, partitions, leaseTTL)
	if err != nil {
		return rr, err
	}
	if len(leases) != partitions || partitions == 0 {
		return rr, fmt.Errorf("bench: leased %d of %d partitions", len(leases), partitions)
	}
	rb.partitions = partitions
	defer func() {
		if rerr := src.Release(context.WithoutCancel(ctx), leases, true); rerr != nil && err == nil {
			err = rerr
		}
	}()

	if rb.checkpoint {
		if _, err := checkpoint(ctx, rb.pool); err != nil {
			return rr, err
		}
	}
	c0, ok0 := readCPU()
	t0 = time.Now()
	rr.Events, rr.Batches, err = drain(ctx, src, leases, rb.batch, batches)
	elapsed := time.Since(t0)
	if err != nil {
		return rr, err
	}
	if c1, ok1 := readCPU(); ok0 && ok1 {
		*cpu = cpu.Add(c1.Sub(c0))
	}
	rr.DrainSeconds = elapsed.Seconds()
	rr.PerSecond = float64(rr.Events) / rr.DrainSeconds

	var rows, unpublished int64
	if err := rb.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE published_at IS NULL) FROM `+names.Table).Scan(&rows, &unpublished); err != nil {
		return rr, fmt.Errorf("bench: count rows: %w", err)
	}
	wantRows := int64(0)
	if m.retention == outboxdriver.RetentionKeep {
		wantRows = int64(rb.events)
	}
	switch {
	case rr.Events != int64(rb.events):
		return rr, fmt.Errorf("check: drained %d events of a backlog of %d", rr.Events, rb.events)
	case rows != wantRows || unpublished != 0:
		return rr, fmt.Errorf("check: %d rows, %d unpublished, left after the drain; want %d, 0", rows, unpublished, wantRows)
	}
	rb.count(m.name, CounterRowsAfterDrain, rows)
	rb.count(m.name, CounterUnpublishedAfterDrain, unpublished)

	// The drain deleted every row (delete) or updated every row (keep):
	// wait for the statistics to say so.
	if m.retention == outboxdriver.RetentionKeep {
		want.updated = int64(rb.events)
	} else {
		want.deleted = int64(rb.events)
	}
	st, err := rb.stats(ctx, names.Table, want)
	if err != nil {
		return rr, err
	}
	rr.BytesAfterDrain, rr.DeadTuplesAfterDrain, rr.LiveTuplesAfterDrain = st.bytes, st.dead, st.live
	if m.retention != outboxdriver.RetentionKeep {
		return rr, nil
	}

	if rb.checkpoint {
		if _, err := checkpoint(ctx, rb.pool); err != nil {
			return rr, err
		}
	}
	t0 = time.Now()
	if m.byTime {
		changes, err := src.MaintainTimePartitions(ctx, outboxdriver.TimePartitionMaintenance{KeepFor: time.Millisecond})
		if err != nil {
			return rr, err
		}
		rr.CleanupCalls = 1
		for _, c := range changes {
			if c.Action == outboxdriver.PartitionDropped {
				rr.PartitionsDropped++
			}
		}
		rr.CleanupRows = rows // every row was in a past hour's partition
		// One more when the hour turned since the migration.
		if rr.PartitionsDropped < PartitionHours {
			return rr, fmt.Errorf("check: the cleanup dropped %d partitions, want at least %d: %v", rr.PartitionsDropped, PartitionHours, changes)
		}
	} else {
		for {
			n, err := src.Cleanup(ctx, leases, 0, CleanupLimit)
			if err != nil {
				return rr, err
			}
			rr.CleanupRows += int64(n)
			rr.CleanupCalls++
			if n < CleanupLimit {
				break
			}
		}
	}
	rr.CleanupSeconds = time.Since(t0).Seconds()
	rr.CleanupPerSecond = float64(rr.CleanupRows) / rr.CleanupSeconds
	if err := rb.pool.QueryRow(ctx, `SELECT count(*) FROM `+names.Table).Scan(&rows); err != nil {
		return rr, fmt.Errorf("bench: count rows: %w", err)
	}
	if rr.CleanupRows != int64(rb.events) || rows != 0 {
		return rr, fmt.Errorf("check: cleanup deleted %d rows and left %d; want %d and 0", rr.CleanupRows, rows, rb.events)
	}
	rb.count(m.name, CounterCleaned, rr.CleanupRows)
	rb.count(m.name, CounterRowsAfterCleanup, rows)
	if m.byTime {
		want = tupleCounts{} // the dropped partitions' counts went with them
	} else {
		want.deleted = rr.CleanupRows
	}
	if st, err = rb.stats(ctx, names.Table, want); err != nil {
		return rr, err
	}
	rr.BytesAfterCleanup, rr.DeadTuplesAfterCleanup = st.bytes, st.dead
	if _, err := rb.pool.Exec(ctx, `VACUUM `+names.Table); err != nil {
		return rr, fmt.Errorf("bench: vacuum: %w", err)
	}
	if st, err = rb.stats(ctx, names.Table, tupleCounts{}); err != nil {
		return rr, err
	}
	rr.BytesAfterVacuum, rr.DeadTuplesAfterVacuum = st.bytes, st.dead
	return rr, nil
}

func (rb *retentionBench) count(mode, counter string, v int64) {
	if rb.counters == nil {
		rb.counters = map[string]map[string]int64{}
	}
	if rb.counters[mode] == nil {
		rb.counters[mode] = map[string]int64{}
	}
	rb.counters[mode][counter] += v
}

// drain claims up to limit events at a time and finishes them all as
// published, until a claim comes back empty. It records the latency of
// every non-empty batch (Claim to the return of Finish).
func drain(ctx context.Context, src outboxdriver.Source, leases []outboxdriver.Lease, limit int, rec *Recorder) (events, batches int64, err error) {
	ids := make([]string, 0, limit)
	for {
		t0 := time.Now()
		b, err := src.Claim(ctx, leases, limit)
		if err != nil {
			return events, batches, err
		}
		records := b.Records()
		if len(records) == 0 {
			b.Release(ctx)
			return events, batches, nil
		}
		ids = ids[:0]
		for _, r := range records {
			ids = append(ids, r.ID)
		}
		if err := b.Finish(ctx, outboxdriver.Outcome{Published: ids}); err != nil {
			b.Release(ctx)
			return events, batches, err
		}
		rec.Record(time.Since(t0))
		events += int64(len(ids))
		batches++
	}
}

// tupleCounts are a table's cumulative row counts in pg_stat_user_tables.
type tupleCounts struct{ inserted, updated, deleted int64 }

type tableStats struct{ bytes, live, dead int64 }

// statsTimeout bounds the wait for the statistics of the scenario's own
// statements. Without pg_stat_force_next_flush (before PostgreSQL 15), a
// backend that flushed less than a second before flushes again only after
// ten idle seconds.
const statsTimeout = 30 * time.Second

// stats reads the table's total size and, once the statistics count at
// least want's inserted, updated and deleted rows (so that every pooled backend has
// reported what it did to the table), its live and dead tuples. It asks
// every idle pooled backend to flush its statistics first, when the
// server has pg_stat_force_next_flush.
func (rb *retentionBench) stats(ctx context.Context, table string, want tupleCounts) (tableStats, error) {
	if rb.forceFlush {
		// The flush happens as the backend goes idle after the statement,
		// before it answers: once Exec returns, it is done.
		for _, c := range rb.pool.AcquireAllIdle(ctx) {
			_, err := c.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
			c.Release()
			if err != nil {
				return tableStats{}, fmt.Errorf("bench: flush statistics: %w", err)
			}
		}
	}
	deadline := time.Now().Add(statsTimeout)
	for {
		var (
			st  tableStats
			got tupleCounts
		)
		// Summed over the partitions of a partitioned table; a plain table
		// is its own only leaf.
		err := rb.pool.QueryRow(ctx, `SELECT coalesce(sum(pg_total_relation_size(t.relid)), 0)::bigint, coalesce(sum(s.n_live_tup), 0)::bigint,
       coalesce(sum(s.n_dead_tup), 0)::bigint, coalesce(sum(s.n_tup_ins), 0)::bigint, coalesce(sum(s.n_tup_upd), 0)::bigint, coalesce(sum(s.n_tup_del), 0)::bigint
FROM `+leavesOf("$1")+` t LEFT JOIN pg_stat_user_tables s ON s.relid = t.relid`, table).Scan(&st.bytes, &st.live, &st.dead, &got.inserted, &got.updated, &got.deleted)
		if err != nil {
			return st, fmt.Errorf("bench: read table statistics: %w", err)
		}
		if got.inserted >= want.inserted && got.updated >= want.updated && got.deleted >= want.deleted {
			return st, nil
		}
		if time.Now().After(deadline) {
			return st, fmt.Errorf("bench: table statistics count %d inserted, %d updated and %d deleted rows after %s, want at least %d, %d and %d",
				got.inserted, got.updated, got.deleted, statsTimeout, want.inserted, want.updated, want.deleted)
		}
		if !sleepUntil(ctx, time.Now().Add(100*time.Millisecond)) {
			return st, ctx.Err()
		}
	}
}

// size is pg_total_relation_size of table (of each partition of a
// partitioned one): heap, indexes and TOAST.
func (rb *retentionBench) size(ctx context.Context, table string) (int64, error) {
	var n int64
	if err := rb.pool.QueryRow(ctx, `SELECT coalesce(sum(pg_total_relation_size(t.relid)), 0)::bigint FROM `+leavesOf("$1")+` t`, table).Scan(&n); err != nil {
		return 0, fmt.Errorf("bench: table size: %w", err)
	}
	return n, nil
}

// leavesOf is the relations (column relid) that hold the rows of the
// table named by the SQL text expr: the table itself, or every partition
// of a partitioned one.
func leavesOf(expr string) string {
	return `(SELECT relid FROM pg_partition_tree(` + expr + `::regclass) WHERE isleaf
UNION ALL SELECT c.oid::regclass FROM pg_class c WHERE c.oid = ` + expr + `::regclass AND c.relkind <> 'p')`
}

// median returns the median of xs (the mean of the middle two when their
// number is even), or 0 when there are none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	h := len(s) / 2
	if len(s)%2 == 1 {
		return s[h]
	}
	return (s[h-1] + s[h]) / 2
}

// medianRound returns the median of every figure of rs.
func medianRound(rs []RetentionRound) RetentionRound {
	f := func(get func(RetentionRound) float64) float64 {
		xs := make([]float64, len(rs))
		for i, r := range rs {
			xs[i] = get(r)
		}
		return median(xs)
	}
	i := func(get func(RetentionRound) int64) int64 {
		return int64(f(func(r RetentionRound) float64 { return float64(get(r)) }) + 0.5)
	}
	return RetentionRound{
		Events:                 i(func(r RetentionRound) int64 { return r.Events }),
		Batches:                i(func(r RetentionRound) int64 { return r.Batches }),
		DrainSeconds:           f(func(r RetentionRound) float64 { return r.DrainSeconds }),
		PerSecond:              f(func(r RetentionRound) float64 { return r.PerSecond }),
		FillSeconds:            f(func(r RetentionRound) float64 { return r.FillSeconds }),
		FilledBytes:            i(func(r RetentionRound) int64 { return r.FilledBytes }),
		BytesAfterDrain:        i(func(r RetentionRound) int64 { return r.BytesAfterDrain }),
		DeadTuplesAfterDrain:   i(func(r RetentionRound) int64 { return r.DeadTuplesAfterDrain }),
		LiveTuplesAfterDrain:   i(func(r RetentionRound) int64 { return r.LiveTuplesAfterDrain }),
		CleanupRows:            i(func(r RetentionRound) int64 { return r.CleanupRows }),
		CleanupCalls:           i(func(r RetentionRound) int64 { return r.CleanupCalls }),
		CleanupSeconds:         f(func(r RetentionRound) float64 { return r.CleanupSeconds }),
		CleanupPerSecond:       f(func(r RetentionRound) float64 { return r.CleanupPerSecond }),
		BytesAfterCleanup:      i(func(r RetentionRound) int64 { return r.BytesAfterCleanup }),
		DeadTuplesAfterCleanup: i(func(r RetentionRound) int64 { return r.DeadTuplesAfterCleanup }),
		BytesAfterVacuum:       i(func(r RetentionRound) int64 { return r.BytesAfterVacuum }),
		DeadTuplesAfterVacuum:  i(func(r RetentionRound) int64 { return r.DeadTuplesAfterVacuum }),
		PartitionsDropped:      i(func(r RetentionRound) int64 { return r.PartitionsDropped }),
	}
}

// mib renders a byte count in MiB.
func mib(b int64) string {
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}
