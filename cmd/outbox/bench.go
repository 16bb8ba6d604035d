package main

import (
	"database/sql"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/spf13/cobra"

	"github.com/outboxkit/outbox/cmd/outbox/internal/bench"
	"github.com/outboxkit/outbox/outboxmysql"
	"github.com/outboxkit/outbox/relay"
)

func newBench() *cobra.Command {
	var (
		f        dbFlags
		scenario string
		duration time.Duration
		warmup   time.Duration
		writers  []int
		rounds   int
		events   int
		batch    int
		asJSON   bool
		sinkURL  string
		rates    []int
		cases    []string
		wakeups  string
		cpuProf  string
		lanes    int
		relayOut bool
		linger   time.Duration
		wmodes   []string
		source   string
		plainTx  bool

		traceNeverSample bool
	)
	var list []string
	for _, s := range bench.Scenarios() {
		list = append(list, fmt.Sprintf("  %-10s %s", s.Name, s.Summary))
	}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the outbox against a PostgreSQL database, in a fresh schema it drops afterwards",
		Long: `Run a benchmark scenario against the database and print one row per measured
cell (a case at a concurrency level), with the PostgreSQL settings that decide
what a commit costs. The scenario creates its own schema (outbox_bench_<random>)
and drops it at the end; nothing else in the database is touched, but the load
is real: do not point it at a production primary.

Each cell is measured for --duration in all, split into --rounds short rounds;
every round runs all cells, in alternating order, each after a --warmup, so
that slow drift of the machine falls on every cell alike. A cell's rounds are
pooled (all transactions over all measured time); the ratio IQR column shows
how well each comparison held from round to round.

The retention scenario instead fills a backlog of --events events and drains
it with one relay's SQL path (claims of --batch events, finished as
published; no broker), once per retention mode (delete, keep) in each of
--rounds rounds (default 2 here), in alternating order, on a fresh table each
time; for keep it then cleans the published rows up in batches. It reports
the median drain throughput, the table's size and dead tuples after the drain
and after the cleanup, and the cleanup's rows/s. --duration, --warmup and
--writers do not apply to it.

The drain scenario fills a backlog of --events events and drains it three
ways: the relay's SQL path alone (raw_sql), the same messages published
straight to the broker with asynchronous acks and no database (raw_broker),
and one relay publishing to the broker (relay), counted by a consumer. It
reports the relay's events/s over the lower of the two raw limits.
With --trace-never-sample it also drains with tracing on and a sampler that
samples nothing (relay_traced), in --rounds pairs of drains alternating which
goes first, and reports the traced relay's events/s over the untraced one's.

The latency scenario runs one relay against the broker while writers commit
one event per transaction at each offered rate of --rates (open loop), and a
consumer on the broker side times each event from its Commit's return. It
also measures the relay idle (CPU), polling against LISTEN/NOTIFY, and
2000 events/s with an unrelated transaction held open. --sink picks the
broker of both: nats://host:port (default: the local server),
kafka:// (an in-process Kafka cluster) or kafka://host:port.

The console scenario seeds 1,000,000 pending events and 100,000 dead letters
(with held aggregates, kept published events, audit rows and requests), and
10,000 dead letters of a consumer in an inbox table beside it, serves the
console in this process and times every page and GET API route; then it
drains --events events with one relay in --rounds pairs (default 4), without
and with a console refreshing the overview every 2s, and reports the ratio.

Scenarios:
` + strings.Join(list, "\n"),
		Example: `  outbox bench --db postgres://postgres@127.0.0.1:5432/test --scenario write
  outbox bench --db $DB --scenario write --writers 1,4,16 --duration 10s --json
  outbox bench --db $DB --scenario retention --events 100000 --batch 500
  outbox bench --db $DB --scenario drain --events 200000 --sink nats://127.0.0.1:4222
  outbox bench --db $DB --scenario latency --sink kafka:// --rates 100,2000,5000
  outbox bench --db $DB --scenario write --writers 8 --write-modes message,insert-delete,sql
  outbox bench --db $DB --scenario drain --events 200000 --source cdc
  outbox bench --db $DB --scenario latency --source cdc --plain-writes --rates 1000,2000
  outbox bench --db $DB --scenario console --events 200000
  outbox bench --db mysql://root@127.0.0.1:3306/test --scenario binlog --events 20000`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sc, err := bench.Lookup(scenario)
			if err != nil {
				return fmt.Errorf("--scenario: %w", err)
			}
			retention := sc.Name == "retention"
			if duration <= 0 {
				return fmt.Errorf("--duration %s: must be positive", duration)
			}
			if warmup < 0 {
				return fmt.Errorf("--warmup %s: must not be negative", warmup)
			}
			if rounds < 1 || rounds > 100 {
				return fmt.Errorf("--rounds %d: use 1 to 100", rounds)
			}
			if !retention && duration/time.Duration(rounds) < 10*time.Millisecond {
				return fmt.Errorf("--duration %s over --rounds %d: give each round at least 10ms", duration, rounds)
			}
			if events < 1 || events > bench.MaxEvents {
				return fmt.Errorf("--events %d: use 1 to %d", events, bench.MaxEvents)
			}
			if batch < 1 || batch > bench.MaxBatch {
				return fmt.Errorf("--batch %d: use 1 to %d", batch, bench.MaxBatch)
			}
			// The relay's own check of the settings the bench gives it.
			rcfg := relay.Config{}.WithDefaults()
			rcfg.Lanes, rcfg.Linger = lanes, linger
			if err := (relayFlags{"Lanes": {name: "lanes"}, "Linger": {name: "linger"}}).check(rcfg); err != nil {
				return err
			}
			if len(writers) == 0 {
				return fmt.Errorf("--writers: give at least one writer count")
			}
			for _, w := range writers {
				if w < 1 || w > bench.MaxWriters {
					return fmt.Errorf("--writers %d: use 1 to %d", w, bench.MaxWriters)
				}
			}
			raw, err := f.dbURL()
			if err != nil {
				return err
			}
			if sc.Name == "binlog" {
				return runBinlogBench(cmd, sc, raw, bench.Config{Events: events, Duration: duration, Progress: cmd.ErrOrStderr()}, asJSON)
			}
			if err := postgresOnly(raw, "bench runs on PostgreSQL only (its scenarios measure PostgreSQL's commit, LISTEN/NOTIFY and vacuum)"); err != nil {
				return err
			}
			ctx := cmd.Context()
			pool, err := f.connect(ctx, int32(max(slices.Max(writers), bench.LatencyWriters+4)))
			if err != nil {
				return err
			}
			defer pool.Close()
			cfg := bench.Config{
				Pool:     pool,
				Duration: duration,
				Warmup:   warmup,
				Writers:  writers,
				Rounds:   rounds,
				Events:   events,
				Batch:    batch,
				Sink:     sinkURL,
				Rates:    rates,
				Cases:    cases,
				Lanes:    lanes,
				Wakeups:  wakeups,
				Linger:   linger,
				Progress: cmd.ErrOrStderr(),

				WriteModes:  wmodes,
				Source:      source,
				PlainWrites: plainTx,

				TraceNeverSample: traceNeverSample,
			}
			if (retention || sc.Name == "fleet" || sc.Name == "drain" || strings.HasPrefix(sc.Name, "console")) && !cmd.Flags().Changed("rounds") {
				cfg.Rounds = 0 // the scenario's own default
			}
			if warmup == 0 {
				cfg.Warmup = -1 // none, rather than the default
			}
			if relayOut {
				exe, err := os.Executable()
				if err != nil {
					return fmt.Errorf("--relay-process: %v", err)
				}
				cfg.RelayBinary = exe
				if cfg.DatabaseURL, err = f.dbURL(); err != nil {
					return err
				}
			}
			if cpuProf != "" {
				pf, err := os.Create(cpuProf)
				if err != nil {
					return fmt.Errorf("--cpuprofile: %v", err)
				}
				defer pf.Close()
				if err := pprof.StartCPUProfile(pf); err != nil {
					return fmt.Errorf("--cpuprofile: %v", err)
				}
				defer pprof.StopCPUProfile()
			}
			results, err := sc.Run(ctx, cfg)
			if err != nil {
				return err
			}
			if asJSON {
				return bench.WriteJSON(cmd.OutOrStdout(), results)
			}
			return bench.WriteTable(cmd.OutOrStdout(), results)
		},
	}
	cmd.Flags().StringVar(&f.db, "db", "", pgDBHelp)
	cmd.Flags().StringVar(&scenario, "scenario", "write", "scenario to run: "+strings.Join(scenarioNames(), ", "))
	cmd.Flags().DurationVar(&duration, "duration", bench.DefaultDuration, "measured time per cell, split over the rounds")
	cmd.Flags().DurationVar(&warmup, "warmup", bench.DefaultWarmup, "unmeasured load before each round of a cell")
	cmd.Flags().IntSliceVar(&writers, "writers", bench.DefaultWriters(), "concurrent writers to measure at, as a list: 1,8")
	cmd.Flags().IntVar(&rounds, "rounds", bench.DefaultRounds, fmt.Sprintf("interleaved rounds the measured time of each cell is split into (retention: drains of each mode, default %d; fleet: rounds of each case, default %d; drain: alternating pairs of drains with --source cdc or --trace-never-sample, default %d)", bench.DefaultRetentionRounds, bench.DefaultFleetRounds, bench.DefaultDrainPairs))
	cmd.Flags().IntVar(&events, "events", bench.DefaultEvents, "retention, drain: events in the backlog; fleet: events of the flood")
	cmd.Flags().IntVar(&batch, "batch", bench.DefaultBatch, "retention, drain, latency, fleet: the relay's claim limit (events per batch; fleet: of every source)")
	cmd.Flags().StringVar(&sinkURL, "sink", bench.DefaultSink, "drain, latency, fleet: the broker: nats://host:port (fleet: only), kafka:// (an in-process Kafka cluster), kafka://host:port, pubsub:// (an in-process Pub/Sub server), pubsub://PROJECT (PUBSUB_EMULATOR_HOST honoured), kinesis://?region=REGION[&endpoint=URL], or stdout: (drain only; a null writer)")
	cmd.Flags().IntSliceVar(&rates, "rates", bench.DefaultRates(), "latency: offered loads in events/s, as a list")
	cmd.Flags().StringSliceVar(&cases, "cases", nil, "latency: run only the cells of these names ("+strings.Join(bench.LatencyCases(), ", ")+"); fleet: only these cases ("+strings.Join(bench.FleetCases(), ", ")+")")
	cmd.Flags().IntVar(&lanes, "lanes", relay.DefaultLanes, "drain, latency, fleet: the relay's lanes (batches in flight under a backlog; fleet: of every source)")
	cmd.Flags().StringVar(&wakeups, "wakeups", "", "drain, latency: who wakes an idle relay on the scenario's table, trigger or writers (as outbox migrate --wakeups; default the trigger)")
	cmd.Flags().DurationVar(&linger, "linger", 0, "latency: the relay's --linger")
	cmd.Flags().BoolVar(&traceNeverSample, "trace-never-sample", false, "drain: also drain with tracing on and a sampler that samples nothing (case relay_traced), in --rounds pairs with the untraced relay, and report the ratio")
	cmd.Flags().BoolVar(&relayOut, "relay-process", true, "drain, latency: run the relay as a child process (this binary's `relay`), to measure its CPU and memory apart")
	cmd.Flags().StringSliceVar(&wmodes, "write-modes", nil, "write: add the cases of other write paths, as a list: "+strings.Join(bench.WriteModes(), ", "))
	cmd.Flags().StringVar(&source, "source", bench.SourcePoll, "drain, latency: the relay's source, poll or cdc (drain: the same backlog is drained from the WAL too, written as rows and as logical decoding messages, in pairs with the polling relay)")
	cmd.Flags().BoolVar(&plainTx, "plain-writes", false, "latency: beside each notify cell, writers that use WriteTx in an ordinary transaction (BEGIN, INSERT, COMMIT) on a pgx.Tx (_pgx) and a *sql.Tx (_sql), and the baselines order_only and watermill_row (the writers alone)")
	cmd.Flags().StringVar(&cpuProf, "cpuprofile", "", "write a CPU profile of the whole run (go tool pprof) to this file")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object per result line instead of a table")
	return cmd
}

func scenarioNames() []string {
	var names []string
	for _, s := range bench.Scenarios() {
		names = append(names, s.Name)
	}
	return names
}

// runBinlogBench runs the binlog scenario, the one on MySQL/MariaDB.
func runBinlogBench(cmd *cobra.Command, sc bench.Scenario, raw string, cfg bench.Config, asJSON bool) error {
	if !strings.HasPrefix(raw, "mysql://") {
		return fmt.Errorf("--scenario binlog runs on MySQL/MariaDB: give --db mysql://user:pass@host:3306/db (a server with a row-based binary log, docs/binlog.md)")
	}
	mc, err := outboxmysql.ParseURL(raw)
	if err != nil {
		return err
	}
	conn, err := mysql.NewConnector(mc)
	if err != nil {
		return err
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	db.SetMaxOpenConns(16)
	if err := db.PingContext(cmd.Context()); err != nil {
		return fmt.Errorf("cannot connect to MySQL/MariaDB at %s: %v", mc.Addr, err)
	}
	cfg.MySQL, cfg.MySQLDSN = db, mc.FormatDSN()
	results, err := sc.Run(cmd.Context(), cfg)
	if err != nil {
		return err
	}
	if asJSON {
		return bench.WriteJSON(cmd.OutOrStdout(), results)
	}
	return bench.WriteTable(cmd.OutOrStdout(), results)
}
