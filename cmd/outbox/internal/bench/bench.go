// Package bench measures the outbox against a real PostgreSQL: what it costs
// the business transactions that write events (the write scenario), how fast
// a relay's SQL path drains a backlog under each retention mode and what
// that leaves behind (the retention scenario), and (in later scenarios) how
// long an event takes to reach the broker.
//
// A scenario is a function from a Config to Results, listed by Scenarios and
// found by name with Lookup; the `outbox bench` command runs them. Every
// scenario works in a fresh schema that it creates and drops, so it can be
// pointed at any database.
//
// The harness underneath is small and shared by the scenarios:
//
//   - Load drives n closed-loop workers for a warm-up and then a measured
//     window, counting the operations that complete in the window and
//     recording their latencies in a Recorder (exact percentiles from the
//     sorted samples). It also measures the machine's CPU time over the
//     window and can run a probe meanwhile, such as a WaitSampler, which
//     samples what the workers' PostgreSQL backends wait on.
//   - A Plan runs a list of Cells (a case at a worker count) in a number of
//     short rounds in alternating order, pools each cell's rounds and
//     compares every case with the baseline case at the same worker count,
//     pooled and round by round.
//   - Result marshals to JSON (WriteJSON writes one object per line) and
//     WriteTable prints results as an aligned table, headed by the Env: the
//     PostgreSQL settings that dominate commit cost and the client machine.
package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Config configures a scenario run. The zero value of every field but Pool
// means its default.
type Config struct {
	// Pool is the database. Its MaxConns must be at least the largest
	// writer count; a scenario opens the extra connections it needs (a
	// LISTEN connection, say) outside the pool.
	Pool *pgxpool.Pool
	// Schema is the schema the scenario creates for its tables and drops at
	// the end. It must not exist. Defaults to outbox_bench_<random>.
	Schema string
	// Duration is the measured time of each cell, split evenly over the
	// rounds. Defaults to 5s.
	Duration time.Duration
	// Warmup is the unmeasured load before each round of a cell: it opens
	// the connections, prepares the statements and brings the cell's
	// state (plans, caches, group commit) to a steady state. Defaults to
	// 200ms; negative means none.
	Warmup time.Duration
	// Writers lists the concurrency levels. Defaults to 1 and 8.
	Writers []int
	// Rounds is how many slices each cell's Duration is measured in, every
	// round running all cells, in alternating order. Slow drift of the
	// machine (storage that is fast for a few seconds, then slow) then
	// touches every cell alike instead of favouring whichever ran in a
	// fast phase. Defaults to 10. The retention scenario drains each mode
	// once a round, in alternating order, and defaults to
	// DefaultRetentionRounds.
	Rounds int
	// Events is the backlog the retention scenario fills and drains for
	// each mode in each round. Defaults to DefaultEvents.
	Events int
	// Batch is the relay's claim limit in the retention scenario. Defaults
	// to DefaultBatch.
	Batch int
	// Sink is the broker of the drain and latency scenarios: nats://...,
	// kafka:// (an in-process cluster), kafka://host:port or stdout: (a
	// null writer; drain only). Defaults to DefaultSink.
	Sink string
	// RelayBinary, when set, is the outbox command the latency scenario
	// runs the relay as (`RelayBinary relay ...`, a child process), so that
	// the relay's own CPU time is measured apart from the writers' and the
	// consumer's. Empty runs the relay in this process.
	RelayBinary string
	// DatabaseURL is the database as the child relay dials it; required
	// with RelayBinary.
	DatabaseURL string
	// Linger is the relay's Linger in the latency scenario.
	Linger time.Duration
	// TraceNeverSample makes the drain scenario also drain with tracing
	// on and a sampler that samples nothing (case relay_traced), in
	// Rounds pairs with the untraced relay, alternating which goes first,
	// and report its throughput over the untraced relay's.
	TraceNeverSample bool
	// Lanes is the relay's Lanes in the drain and latency scenarios.
	// Defaults to relay.DefaultLanes.
	Lanes int
	// Wakeups is who wakes an idle relay on the drain and latency
	// scenarios' table (outboxdriver.MigrateOptions.Wakeups); "" the
	// trigger, which the latency cells switch on and off (a new table has
	// none since schema version 26).
	Wakeups string
	// Rates are the offered loads of the latency scenario, in events/s.
	// Defaults to DefaultRates().
	Rates []int
	// Cases, when set, limits the latency scenario to the cells of these
	// names (idle, idle_poll_10ms, poll_500ms, poll_10ms, notify,
	// notify_long_tx), for long runs of one of them, and the fleet
	// scenario to the cases of these names (FleetCases).
	Cases []string
	// WriteModes adds the write scenario's cases of other write paths to
	// its default ones (WriteModeMessage, WriteModeInsertDelete,
	// WriteModeSQL).
	WriteModes []string
	// Source is the relay's source in the drain and latency scenarios:
	// SourcePoll (the default) or SourceCDC. With SourceCDC the drain
	// scenario drains the backlog once more by log tailing (after the
	// polling relay, in the same run), and the latency scenario runs the
	// relay with --source cdc.
	Source string
	// PlainWrites adds, beside each notify cell of the latency scenario,
	// the same cell with writers that use WriteTx in an ordinary
	// transaction (BEGIN, INSERT, COMMIT: three round trips) on a pgx.Tx
	// (WriterPgx) and on a *sql.Tx (WriterSQL), and the baselines of the
	// same transaction without an outbox (WriterOrderOnly) and with
	// Watermill's row (WriterWatermill).
	PlainWrites bool
	// MySQL and MySQLDSN are the database of the binlog scenario (the
	// others run on PostgreSQL, Pool) and the go-sql-driver DSN its
	// replication connection dials.
	MySQL    *sql.DB
	MySQLDSN string
	// Progress receives one line per measured cell and round while the
	// scenario runs. Nil means quiet.
	Progress io.Writer
}

// Defaults of Config.
const (
	DefaultDuration = 5 * time.Second
	DefaultWarmup   = 200 * time.Millisecond
	DefaultRounds   = 10
)

// DefaultWriters returns the concurrency levels measured by default.
func DefaultWriters() []int { return []int{1, 8} }

// MaxWriters bounds a writer count: every writer holds a connection.
const MaxWriters = 512

// withDefaults fills in the defaults and validates c.
func (c Config) withDefaults() (Config, error) {
	if c.Pool == nil {
		return c, errors.New("bench: Config.Pool is nil")
	}
	if c.Duration == 0 {
		c.Duration = DefaultDuration
	}
	if c.Duration < 0 {
		return c, fmt.Errorf("bench: duration %s must be positive", c.Duration)
	}
	switch {
	case c.Warmup == 0:
		c.Warmup = DefaultWarmup
	case c.Warmup < 0:
		c.Warmup = 0
	}
	if len(c.Writers) == 0 {
		c.Writers = DefaultWriters()
	}
	for _, w := range c.Writers {
		if w < 1 || w > MaxWriters {
			return c, fmt.Errorf("bench: writer count %d: use 1 to %d", w, MaxWriters)
		}
	}
	if c.Rounds == 0 {
		c.Rounds = DefaultRounds
	}
	if c.Rounds < 0 {
		return c, fmt.Errorf("bench: rounds %d must be positive", c.Rounds)
	}
	if c.Duration/time.Duration(c.Rounds) < time.Millisecond {
		return c, fmt.Errorf("bench: duration %s over %d rounds leaves less than 1ms a round", c.Duration, c.Rounds)
	}
	if most := slices.Max(c.Writers); int(c.Pool.Config().MaxConns) < most {
		return c, fmt.Errorf("bench: the pool has %d connections but %d writers need one each", c.Pool.Config().MaxConns, most)
	}
	for _, m := range c.WriteModes {
		if !slices.Contains(WriteModes(), m) {
			return c, fmt.Errorf("bench: unknown write mode %q: use %s", m, strings.Join(WriteModes(), ", "))
		}
	}
	switch c.Source {
	case "":
		c.Source = SourcePoll
	case SourcePoll, SourceCDC:
	default:
		return c, fmt.Errorf("bench: unknown source %q: use %s or %s", c.Source, SourcePoll, SourceCDC)
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	return c, nil
}

// The relay's sources (Config.Source).
const (
	SourcePoll = "poll"
	SourceCDC  = "cdc"
)

// Scenario is one benchmark.
type Scenario struct {
	// Name selects the scenario (`outbox bench --scenario NAME`).
	Name string
	// Summary says in one line what it measures.
	Summary string
	// Run runs it.
	Run func(ctx context.Context, cfg Config) ([]Result, error)
}

var scenarios = []Scenario{
	{Name: "write", Summary: "business transactions/s and latency with and without outbox events (WriteTx, or batched with Queue), against a round trip that writes nothing and a plain extra INSERT; NOTIFY and the notify trigger", Run: WritePath},
	{Name: "drain", Summary: "events/s of one relay draining a committed backlog to the broker, against the SQL path alone and the broker alone", Run: Drain},
	{Name: "latency", Summary: "commit-to-consumer latency at steady offered loads, wake-up strategies, an open transaction, relay CPU idle and busy", Run: CommitToConsumer},
	{Name: "retention", Summary: "relay drain events/s (SQL only, no broker) with delete vs keep retention, table size and dead tuples left, cost of cleaning kept rows", Run: RetentionModes},
	{Name: "fleet", Summary: "one relay process for ten outbox tables (fleet.Fleet): a trickle's commit-to-arrival latency while one table drains a flood, with and without the publish budget, and the flood's drain rate", Run: FleetFairness},
	{Name: "console", Summary: "p50/p95 of every console page and GET API route over 1,000,000 pending events and 100,000 dead letters; a relay's drain with and without a console refreshing the overview", Run: ConsoleBench},
	{Name: "binlog", Summary: "MySQL/MariaDB: a relay's drain of a committed backlog and its commit-to-publish latency at 200 events/s, polling against tailing the binary log, as ratios in one run", Run: Binlog},
	{Name: "console-drain", Summary: "the console scenario's drain alone: a relay's drain with and without a console refreshing the overview, in --rounds pairs", Run: ConsoleDrainBench},
}

// Scenarios lists the available scenarios.
func Scenarios() []Scenario { return slices.Clone(scenarios) }

// Lookup returns the scenario called name, or an error listing the
// available ones.
func Lookup(name string) (Scenario, error) {
	names := make([]string, len(scenarios))
	for i, s := range scenarios {
		if s.Name == name {
			return s, nil
		}
		names[i] = s.Name
	}
	return Scenario{}, fmt.Errorf("unknown scenario %q: available: %s", name, strings.Join(names, ", "))
}
