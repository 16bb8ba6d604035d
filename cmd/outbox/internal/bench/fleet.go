package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/relayd"
	"github.com/outboxkit/outbox/relayd/fleet"
	"github.com/outboxkit/outbox/route"
	"github.com/outboxkit/outbox/sink/sinkurl"
)

// The fleet scenario's shape: FleetSources tables relayed by one
// fleet.Fleet; the first is flooded, the others get one event every
// FleetTrickleGap in turn.
const (
	FleetSources    = 10
	FleetTrickleGap = 10 * time.Millisecond
	// DefaultFleetRounds is the fleet scenario's default Config.Rounds.
	DefaultFleetRounds = 2
	// fleetQuiet is how long the trickle runs without the flood.
	fleetQuiet = 3 * time.Second
	// fleetWarm is how long the trickle runs, unmeasured, before the
	// quiet phase: a fleet just started spends its first few hundred
	// milliseconds on new connections (a backend each, its listener's
	// first claims), which are not what a steady fleet costs.
	fleetWarm = 500 * time.Millisecond
)

// fleetCase is one publish budget the scenario measures.
type fleetCase struct {
	name          string
	turns, quanta int
	duty          float64 // the budget's pace (fleet.Budget.Pace); 1: none
	desc          string
}

func fleetCases() []fleetCase {
	return []fleetCase{
		{"budget", fleet.DefaultBudgetTurns, fleet.DefaultBudgetQuantum, fleet.DefaultBudgetDuty,
			fmt.Sprintf("publish budget of %d turns of %d messages, weighted round robin, a source publishing at most %.0f%% of the time while another has work (the default)",
				fleet.DefaultBudgetTurns, fleet.DefaultBudgetQuantum, 100*fleet.DefaultBudgetDuty)},
		{"unpaced", fleet.DefaultBudgetTurns, 100, 1, fmt.Sprintf("publish budget of %d turns of 100 messages, weighted round robin, not paced", fleet.DefaultBudgetTurns)},
		{"no_budget", 1024, 100_000, 1, "no effective budget: every source publishes whole waves whenever it likes"},
	}
}

// FleetCases returns the names of the fleet scenario's cases.
func FleetCases() []string {
	var names []string
	for _, c := range fleetCases() {
		names = append(names, c.name)
	}
	return names
}

// fleetCasesNamed returns the cases of these names, in the scenario's
// order, or every case when names is empty.
func fleetCasesNamed(names []string) ([]fleetCase, error) {
	all := fleetCases()
	if len(names) == 0 {
		return all, nil
	}
	for _, n := range names {
		if !slices.Contains(FleetCases(), n) {
			return nil, fmt.Errorf("bench: unknown fleet case %q: use %s", n, strings.Join(FleetCases(), ", "))
		}
	}
	var cases []fleetCase
	for _, c := range all {
		if slices.Contains(names, c.name) {
			cases = append(cases, c)
		}
	}
	return cases, nil
}

// FleetFairness measures what a flooded source does to the others in one
// relay process (fleet.Fleet): the commit-to-arrival latency of a
// trickle to nine sources, without a flood and while the tenth source
// drains a backlog of Config.Events events, with the default publish
// budget, with the budget not paced, and without one; and the flood's
// drain rate in each case, the budget's cost. Each round runs every case,
// in alternating order.
func FleetFairness(ctx context.Context, cfg Config) (results []Result, err error) {
	if cfg.Events == 0 {
		cfg.Events = DefaultEvents
	}
	if cfg.Rounds == 0 {
		cfg.Rounds = DefaultFleetRounds
	}
	if cfg.Sink == "" {
		cfg.Sink = DefaultSink
	}
	if !strings.HasPrefix(cfg.Sink, "nats://") {
		return nil, fmt.Errorf("bench: the fleet scenario publishes to NATS: pass --sink nats://host:port, not %q", cfg.Sink)
	}
	cases, err := fleetCasesNamed(cfg.Cases)
	if err != nil {
		return nil, err
	}
	cfg.Cases = nil // the latency scenario's names, checked by withDefaults
	if cfg, err = cfg.withDefaults(); err != nil {
		return nil, err
	}
	env, err := ReadEnv(ctx, cfg.Pool)
	if err != nil {
		return nil, err
	}
	schema, drop, err := freshSchema(ctx, cfg.Pool, cfg.Schema)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, drop()) }()
	tables := make([]outboxdriver.Table, FleetSources)
	for i := range tables {
		tables[i] = outboxdriver.Table{Schema: schema, Name: fmt.Sprintf("outbox_%d", i)}
		if _, err := outboxpgx.New(cfg.Pool).Migrate(ctx, tables[i], nil); err != nil {
			return nil, err
		}
	}
	tag := make([]byte, 4)
	_, _ = rand.Read(tag)
	b, err := openNATS(ctx, cfg.Sink, "outboxbench_"+hex.EncodeToString(tag))
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, b.Close()) }()
	f := &fleetRun{cfg: cfg, tables: tables, broker: b, committed: map[string]time.Time{}, arrived: map[string]time.Time{}, stored: map[string]time.Time{}}
	stop, err := b.consume(ctx, f.arrive)
	if err != nil {
		return nil, err
	}
	defer stop()

	type pooled struct {
		quiet, flood fleetLatencies
		events       int64
		seconds      float64
		rounds       []float64
	}
	acc := make([]pooled, len(cases))
	for round := range cfg.Rounds {
		for k := range cases {
			i := k
			if round%2 == 1 {
				i = len(cases) - 1 - k
			}
			c := cases[i]
			quiet, flood, secs, err := f.round(ctx, c)
			if err != nil {
				return nil, fmt.Errorf("bench: fleet %s: %w", c.name, err)
			}
			acc[i].quiet.merge(&quiet)
			acc[i].flood.merge(&flood)
			acc[i].events += int64(cfg.Events)
			acc[i].seconds += secs
			acc[i].rounds = append(acc[i].rounds, float64(cfg.Events)/secs)
			fmt.Fprintf(cfg.Progress, "fleet %s round %d: trickle p99 %s quiet, %s during the flood (commit to publish %s, %s); flood %.0f events/s\n",
				c.name, round+1, quiet.arrive.Summary().P99, flood.arrive.Summary().P99,
				quiet.publish.Summary().P99, flood.publish.Summary().P99, float64(cfg.Events)/secs)
		}
	}
	for i, c := range cases {
		q, fl := acc[i].quiet.arrive.Summary(), acc[i].flood.arrive.Summary()
		qp, flp := acc[i].quiet.publish.Summary(), acc[i].flood.publish.Summary()
		for _, r := range []struct {
			name     string
			lat, pub Latency
			per      float64
		}{{c.name + "_quiet", q, qp, 0}, {c.name + "_flooded", fl, flp, float64(acc[i].events) / acc[i].seconds}} {
			res := Result{Scenario: "fleet", Case: r.name, Description: c.desc, Workers: FleetSources, Unit: "event",
				Latency: r.lat, Env: env, Counters: map[string]int64{"trickle_events": r.lat.Count, "publish_p99_us": r.pub.P99.Microseconds()}}
			if r.per > 0 {
				res.Ops, res.Seconds, res.PerSecond, res.RoundsPerSecond = acc[i].events, acc[i].seconds, r.per, acc[i].rounds
				if q.P99 > 0 {
					res.Counters["trickle_p99_vs_quiet_permille"] = int64(1000 * fl.P99 / q.P99)
				}
				if qp.P99 > 0 {
					res.Counters["publish_p99_vs_quiet_permille"] = int64(1000 * flp.P99 / qp.P99)
				}
			}
			results = append(results, res)
		}
	}
	return results, nil
}

// fleetRun is the fleet scenario's state.
type fleetRun struct {
	cfg    Config
	tables []outboxdriver.Table
	broker *natsBroker

	mu        sync.Mutex
	committed map[string]time.Time // trickle event id -> commit returned
	arrived   map[string]time.Time // first arrival of any event
	stored    map[string]time.Time // when JetStream stored that first copy
	floodLeft int
}

func (f *fleetRun) arrive(id string, stored time.Time) {
	now := time.Now()
	f.mu.Lock()
	if _, ok := f.arrived[id]; !ok {
		f.arrived[id], f.stored[id] = now, stored
		if _, trickle := f.committed[id]; !trickle {
			f.floodLeft--
		}
	}
	f.mu.Unlock()
}

// round runs one case: a fleet with the case's budget, a quiet trickle,
// then the flood with the trickle. It returns the trickle latencies of
// both phases and how long the flood took to arrive.
func (f *fleetRun) round(ctx context.Context, c fleetCase) (quiet, flood fleetLatencies, secs float64, err error) {
	// Every round starts from the same state: the previous flood's
	// deleted rows vacuumed (autovacuum may be off, and they would slow
	// the flooded table's claims) and its WAL checkpointed, so that
	// neither falls into this round's quiet phase.
	for _, t := range f.tables {
		if _, err := f.cfg.Pool.Exec(ctx, `VACUUM `+outboxdriver.QuoteIdent(t.Schema)+`.`+outboxdriver.QuoteIdent(t.Name)); err != nil {
			return quiet, flood, 0, err
		}
	}
	if _, err := checkpoint(ctx, f.cfg.Pool); err != nil {
		return quiet, flood, 0, err
	}
	budget, err := fleet.NewBudget(c.turns, c.quanta)
	if err != nil {
		return quiet, flood, 0, err
	}
	if err := budget.Pace(c.duty, fleet.DefaultBudgetWindow); err != nil {
		return quiet, flood, 0, err
	}
	fl, err := fleet.New(&fleet.Options{Budget: budget})
	if err != nil {
		return quiet, flood, 0, err
	}
	router, err := route.New(&route.Config{Replacement: f.broker.Destination()})
	if err != nil {
		return quiet, flood, 0, err
	}
	dbURL := f.cfg.Pool.Config().ConnString()
	srcs := make([]fleet.Source, len(f.tables))
	for i, t := range f.tables {
		srcs[i] = fleet.Source{Name: fmt.Sprintf("src%d", i), DB: dbURL, Sink: f.broker.url,
			SinkOptions: sinkurl.Options{NATSStream: f.broker.stream, NATSSubjects: []string{strings.ToLower(f.broker.stream) + ".>"}, NATSNoCreate: true},
			Options: relayd.Options{
				Schema: t.Schema, Table: t.Name,
				Relay: relay.Config{Router: router, Lanes: f.cfg.Lanes, BatchSize: f.cfg.Batch},
			}}
	}
	if err := fl.Start(ctx, srcs); err != nil {
		return quiet, flood, 0, err
	}
	defer fl.Stop(context.WithoutCancel(ctx))
	if err := waitFor(ctx, time.Minute, fl.Ready); err != nil {
		return quiet, flood, 0, fmt.Errorf("fleet not ready: %w", err)
	}
	// Warm-up: one event to every source, then the trickle for fleetWarm.
	var ids []string
	for i := range f.tables {
		id, err := f.write(ctx, i)
		if err != nil {
			return quiet, flood, 0, err
		}
		ids = append(ids, id)
	}
	if err := f.waitArrived(ctx, ids); err != nil {
		return quiet, flood, 0, err
	}
	if ids, err = f.trickle(ctx, time.Now().Add(fleetWarm), nil); err != nil {
		return quiet, flood, 0, err
	}
	if err := f.waitArrived(ctx, ids); err != nil {
		return quiet, flood, 0, err
	}
	// Quiet: the trickle alone.
	if ids, err = f.trickle(ctx, time.Now().Add(fleetQuiet), nil); err != nil {
		return quiet, flood, 0, err
	}
	if err := f.waitArrived(ctx, ids); err != nil {
		return quiet, flood, 0, err
	}
	quiet = f.latencies(ids)
	// The flood, and the trickle until it arrived.
	f.mu.Lock()
	f.floodLeft = f.cfg.Events
	f.mu.Unlock()
	start := time.Now()
	t := f.tables[0]
	if _, err := f.cfg.Pool.Exec(ctx, `INSERT INTO `+outboxdriver.QuoteIdent(t.Schema)+`.`+outboxdriver.QuoteIdent(t.Name)+
		` (id, aggregatetype, aggregateid, type, payload)
		SELECT gen_random_uuid(), 'src0', (g % 1000)::text, 'E', '{}' FROM generate_series(1, $1::int) AS g ORDER BY g`, f.cfg.Events); err != nil {
		return quiet, flood, 0, err
	}
	done := func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.floodLeft <= 0
	}
	if ids, err = f.trickle(ctx, time.Now().Add(10*time.Minute), done); err != nil {
		return quiet, flood, 0, err
	}
	secs = time.Since(start).Seconds()
	if err := f.waitArrived(ctx, ids); err != nil {
		return quiet, flood, 0, err
	}
	flood = f.latencies(ids)
	return quiet, flood, secs, nil
}

// write commits one event to table i and returns its id.
func (f *fleetRun) write(ctx context.Context, i int) (string, error) {
	id := uuid.Must(uuid.NewV7()).String()
	t := f.tables[i]
	f.mu.Lock()
	f.committed[id] = time.Time{} // a trickle event, not the flood's
	f.mu.Unlock()
	if _, err := f.cfg.Pool.Exec(ctx, `INSERT INTO `+outboxdriver.QuoteIdent(t.Schema)+`.`+outboxdriver.QuoteIdent(t.Name)+
		` (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 't', 'E', '{}')`, id, fmt.Sprintf("src%d", i)); err != nil {
		return "", err
	}
	now := time.Now()
	f.mu.Lock()
	f.committed[id] = now
	f.mu.Unlock()
	return id, nil
}

// trickle writes one event every FleetTrickleGap to sources 1..n-1 in
// turn, until the deadline or until stop reports true.
func (f *fleetRun) trickle(ctx context.Context, until time.Time, stop func() bool) ([]string, error) {
	tick := time.NewTicker(FleetTrickleGap)
	defer tick.Stop()
	var ids []string
	for k := 0; time.Now().Before(until) && (stop == nil || !stop()); k++ {
		id, err := f.write(ctx, 1+k%(len(f.tables)-1))
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
		select {
		case <-tick.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return ids, nil
}

func (f *fleetRun) waitArrived(ctx context.Context, ids []string) error {
	return waitFor(ctx, 2*time.Minute, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, id := range ids {
			if _, ok := f.arrived[id]; !ok {
				return false
			}
		}
		return true
	})
}

// fleetLatencies are the trickle's latencies: commit to arrival at the
// consumer, and commit to publish (JetStream storing the message).
type fleetLatencies struct{ arrive, publish Recorder }

func (l *fleetLatencies) merge(o *fleetLatencies) {
	l.arrive.Merge(&o.arrive)
	l.publish.Merge(&o.publish)
}

func (f *fleetRun) latencies(ids []string) fleetLatencies {
	f.mu.Lock()
	defer f.mu.Unlock()
	var l fleetLatencies
	for _, id := range ids {
		l.arrive.Record(f.arrived[id].Sub(f.committed[id]))
		if st := f.stored[id]; !st.IsZero() {
			l.publish.Record(st.Sub(f.committed[id]))
		}
	}
	return l
}
