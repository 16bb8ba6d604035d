package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox/internal/backoff"
	"github.com/outboxkit/outbox/internal/confval"
	"github.com/outboxkit/outbox/internal/tracing"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/route"
	"github.com/outboxkit/outbox/sink"
)

// Policy says what happens to an aggregate's later events once one of its
// events was dead-lettered.
type Policy int

const (
	// Hold keeps them waiting until an operator retries or discards the
	// dead letter (outbox dlq). The default: order is never broken.
	Hold Policy = iota
	// Continue lets them flow on at once.
	Continue
)

// String returns "hold" or "continue".
func (p Policy) String() string {
	if p == Continue {
		return "continue"
	}
	return "hold"
}

// ParsePolicy parses "hold" or "continue".
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "hold":
		return Hold, nil
	case "continue":
		return Continue, nil
	}
	return 0, fmt.Errorf("unknown poison policy %q: use hold or continue", s)
}

// Config configures a Relay. Zero values take the documented defaults.
type Config struct {
	// BatchSize is the most events claimed and published at once.
	// Defaults to 500.
	BatchSize int
	// Lanes is how many batches the relay keeps in flight while it works
	// off a backlog. Once a claim comes back full, the relay's partitions
	// are split into Lanes disjoint sets (partition mod Lanes), and each
	// set is claimed, published and recorded on its own, so that one
	// lane's database round trips overlap another's publishing; order
	// holds because an aggregate lives in one partition. When every lane
	// has caught up, the relay claims over all its partitions again.
	// Each lane holds a database connection while its batch is in
	// flight. Defaults to 4; 1 turns pipelining off.
	Lanes int
	// ClaimLimit, when set, is asked before every claim how many events
	// to claim at most, given BatchSize; an answer outside 1 to
	// BatchSize counts as BatchSize. While it answers less than
	// BatchSize, the relay works a backlog with one batch in flight: the
	// lanes stand down. fleet.Fleet (package relayd/fleet) sets it, so that a flooded source's
	// claims and deletes shrink while other sources of the same process
	// have work (docs/operations.md, One relay for many databases).
	ClaimLimit func(batchSize int) int
	// Linger is the shortest time from one claim to the next while the
	// relay keeps up with light traffic (batches come back short): events
	// committed meanwhile gather into the next batch instead of costing a
	// claim, a publish and a record each. It adds up to Linger to their
	// latency. Zero (the default) means none: latency first. What a linger
	// saves in CPU and costs in latency: docs/benchmarks.md#latency.
	Linger time.Duration
	// PollInterval is the longest the relay waits for a wake-up before it
	// looks again. Defaults to 500ms.
	PollInterval time.Duration
	// LeaseTTL is how long a partition lease lasts without renewal; leases
	// are renewed every third of it. After a relay dies, its partitions
	// move to others within about two TTLs. Defaults to 10s.
	LeaseTTL time.Duration
	// Router maps events to messages. Defaults to Debezium's routing.
	Router *route.Router
	// RetryBase and RetryMax bound the exponential backoff, with jitter,
	// between attempts of an event the broker did not take. Defaults 1s
	// and 5m.
	RetryBase, RetryMax time.Duration
	// MaxAttempts is how many times an event is tried before it is
	// dead-lettered (a permanent error dead-letters at once). Attempts are
	// spent only when some publishes of a batch succeed: while every
	// publish fails (broker down) the relay backs off as a whole instead.
	// Defaults to 20.
	MaxAttempts int
	// Poison says what happens to an aggregate's later events once one of
	// its events was dead-lettered. Defaults to Hold.
	Poison Policy
	// CleanupAfter, when positive, deletes published rows kept by the
	// source (retention "keep") once they are older than this, in batches
	// of CleanupBatch, at every lease upkeep. Zero never deletes them.
	CleanupAfter time.Duration
	// CleanupBatch is the most rows one cleanup statement deletes.
	// Defaults to 1000.
	CleanupBatch int
	// DropPartitionsAfter: on a table partitioned by time
	// (docs/retention.md), a partition whose range ended this long ago is
	// dropped once none of its events is unpublished and none was
	// published within it. Zero takes CleanupAfter; a negative value drops
	// none. Partitions ahead are made whatever it is.
	DropPartitionsAfter time.Duration
	// PartitionsEvery is how often the relay maintains a time-partitioned
	// table's partitions (Source.MaintainTimePartitions). Defaults to 1m.
	PartitionsEvery time.Duration
	// PartitionLockTimeout bounds each wait of that maintenance for its
	// exclusive lock on the table. Defaults to
	// outboxdriver.DefaultPartitionLockTimeout.
	PartitionLockTimeout time.Duration
	// FinishTimeout bounds recording a batch's outcome once the broker has
	// answered, also while stopping. Defaults to 10s.
	FinishTimeout time.Duration
	// Logger defaults to warnings and errors as text on standard error.
	// Payloads are never logged.
	Logger *slog.Logger
	// Metrics receives counts and latencies; nil discards them.
	Metrics Metrics
	// TracerProvider makes the publish span of every event: a child of the
	// trace context its writer stored, whose traceparent and tracestate the
	// message carries (docs/tracing.md). Nil means otel.GetTracerProvider(),
	// looked up at every batch, so nothing is made until the application
	// sets one; with a no-op provider tracing costs nothing per event.
	TracerProvider trace.TracerProvider
	// Contracts, when set, checks every claimed event against its payload
	// contract before it is routed (a *contract.Registry, for rows written
	// by plain SQL): an event that breaks its contract is dead-lettered at
	// once, its last error starting with "contract:". An event without an
	// eventVersion header is published with its contract's version.
	Contracts Checker
	// OnStage, when set, is called at each stage of the relay's work with
	// the number of events concerned. It must not block. Useful for
	// tracing and fault injection.
	OnStage func(stage Stage, n int)
}

// Stage names a point in the relay's work, for Config.OnStage.
type Stage string

// Stages, in the order a batch passes them.
const (
	StageAcquired  Stage = "acquired"  // partitions leased (n = how many)
	StageClaimed   Stage = "claimed"   // a non-empty batch claimed
	StagePublished Stage = "published" // the broker answered for every wave, nothing recorded yet
	StageRecorded  Stage = "recorded"  // the outcome committed
)

// Metrics is the relay's observability hook. Implementations must be safe
// for concurrent use and must not block.
type Metrics interface {
	// Claimed reports a claim of n events (0 for an empty claim).
	Claimed(n int)
	// Published reports one event the broker acknowledged, with the time
	// from its insertion to the acknowledgement.
	Published(destination string, sinceCreated time.Duration)
	// PublishFailed reports one event the broker did not acknowledge.
	PublishFailed(destination string, permanent bool)
	// Retried reports one event scheduled for another attempt.
	Retried(destination string)
	// DeadLettered reports one event moved to the dead-letter table.
	DeadLettered(destination string)
	// PartitionsOwned reports, after every lease upkeep that reached the
	// database, how many partitions this relay leases (and 0 at Stop).
	PartitionsOwned(n int)
}

// DeadLetterClass says why an event was dead-lettered.
type DeadLetterClass string

// The classes of dead letters.
const (
	// DeadLetterInvalid: the record cannot become the message its writer
	// meant (it cannot be routed, its aggregate id cannot be the key, its
	// headers cannot be read). Nothing was sent.
	DeadLetterInvalid DeadLetterClass = "invalid"
	// DeadLetterRefused: the broker refused the message for good (a
	// permanent error, sink.Permanent).
	DeadLetterRefused DeadLetterClass = "refused"
	// DeadLetterExhausted: every one of Config.MaxAttempts failed.
	DeadLetterExhausted DeadLetterClass = "exhausted"
)

// DeadLetterClasses is implemented by a Metrics that also counts dead
// letters by class (package outboxprom does). The relay calls it beside
// Metrics.DeadLettered.
type DeadLetterClasses interface {
	DeadLetteredAs(destination string, class DeadLetterClass)
}

type nopMetrics struct{}

func (nopMetrics) Claimed(int)                     {}
func (nopMetrics) Published(string, time.Duration) {}
func (nopMetrics) PublishFailed(string, bool)      {}
func (nopMetrics) Retried(string)                  {}
func (nopMetrics) DeadLettered(string)             {}
func (nopMetrics) PartitionsOwned(int)             {}

// DefaultLanes is Config.Lanes' default.
const DefaultLanes = 4

// DefaultBatchSize is Config.BatchSize's default.
const DefaultBatchSize = 500

// The whole relay backs off between these bounds while the database or the
// broker fails: 100 ms doubling to 1 s, with jitter. The cap is also how
// often a relay tries a dependency that is down, so that it resumes within
// about a second of its return; a try costs one call that fails at once
// while the dependency is down (a refused connection, or a sink's publish
// that fails without sending while its client is disconnected).
const (
	breakerBase = 100 * time.Millisecond
	breakerMax  = time.Second
)

// The operations named in the database outage's lines.
const (
	opClaim  = "claim"
	opUpkeep = "lease upkeep"
	opPauses = "pauses read"
)

// newOutages returns the trackers of the relay's two dependencies: every
// path that calls the database reports to one, the batch loop's publishes
// to the other, so that each outage is logged once (docs/operations.md,
// Logs during outages).
func newOutages(log *slog.Logger) (db, broker *backoff.Outage) {
	db = backoff.NewOutage(backoff.OutageConfig{Log: log, Level: slog.LevelError, Base: breakerBase, Max: breakerMax,
		Down:      "relay: the database fails; backing off until it answers",
		Still:     "relay: the database still fails",
		Recovered: "relay: recovered: the database answers again"})
	broker = backoff.NewOutage(backoff.OutageConfig{Log: log, Level: slog.LevelWarn, Base: breakerBase, Max: breakerMax,
		Down:      "relay: the broker is unreachable; backing off without spending attempts",
		Still:     "relay: the broker is still unreachable",
		Recovered: "relay: recovered: the broker takes messages again"})
	return db, broker
}

// Relay moves events from a Source to a Sink.
type Relay struct {
	src     outboxdriver.Source
	snk     sink.Sink
	cfg     Config
	log     *slog.Logger
	metrics Metrics

	mu        sync.Mutex
	started   bool
	stopClaim context.CancelFunc // stops claiming, waiting and lease upkeep
	stopPub   context.CancelFunc // aborts in-flight publishes
	done      chan struct{}

	leases leaseState
	pauses *pauses
	schema schemaState

	db     *backoff.Outage // every call of the source that reaches the database
	broker *backoff.Outage // the batches' publishes

	tracing   *tracing.Provider
	sys       attribute.KeyValue // messaging.system of snk
	spanNames spanNames
}

// New returns a Relay; it does no I/O. The caller keeps ownership of src
// and snk and closes them after Stop. A cfg field out of its range
// (Config.Validate, after Config.WithDefaults) fails with a *ConfigError.
func New(src outboxdriver.Source, snk sink.Sink, cfg *Config) (*Relay, error) {
	if src == nil {
		return nil, errors.New("relay: source is nil")
	}
	if snk == nil {
		return nil, errors.New("relay: sink is nil")
	}
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if c.Router == nil {
		r, err := route.New(nil)
		if err != nil {
			return nil, err
		}
		c.Router = r
	}
	c.Logger = confval.Logger(c.Logger)
	m := c.Metrics
	if m == nil {
		m = nopMetrics{}
	}
	db, broker := newOutages(c.Logger)
	r := &Relay{src: src, snk: snk, cfg: c, log: c.Logger, metrics: m, tracing: tracing.NewProvider(c.TracerProvider),
		pauses: newPauses(src, c.PollInterval, c.Router.ByAggregateType(), c.Logger, db), db: db, broker: broker}
	r.sys = r.system()
	return r, nil
}

// Start starts relaying in the background and returns at once. It fails if
// the relay was already started.
func (r *Relay) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return errors.New("relay: already started")
	}
	r.started = true
	base := context.WithoutCancel(ctx)
	claimCtx, stopClaim := context.WithCancel(base)
	pubCtx, stopPub := context.WithCancel(base)
	r.stopClaim, r.stopPub = stopClaim, stopPub
	r.done = make(chan struct{})
	r.pauses.start(claimCtx)
	var wg sync.WaitGroup
	wg.Go(func() { r.manageLeases(claimCtx) })
	wg.Go(func() { r.loop(claimCtx, pubCtx) })
	wg.Go(func() { r.maintainPartitions(claimCtx) })
	go func() {
		wg.Wait()
		r.pauses.wait()
		// Hand the partitions over at once rather than after a TTL.
		ctx, cancel := context.WithTimeout(base, r.cfg.FinishTimeout)
		defer cancel()
		if err := r.src.Release(ctx, r.leases.owns(), true); err != nil {
			r.log.Warn("relay: releasing leases at stop failed; they expire by themselves", "err", err)
		}
		r.metrics.PartitionsOwned(0)
		r.db.End()
		r.broker.End()
		close(r.done)
	}()
	return nil
}

// Stop stops claiming, lets the in-flight batch finish publishing and
// record its outcome, releases the relay's leases and returns when every
// goroutine has exited. If ctx ends first, in-flight publishes are
// cancelled (their events stay unpublished and are relayed again later) and
// Stop still waits. Stop is idempotent and safe when Start never ran.
func (r *Relay) Stop(ctx context.Context) error {
	r.mu.Lock()
	if !r.started {
		r.mu.Unlock()
		return nil
	}
	r.stopClaim()
	done := r.done
	r.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
		r.stopPub()
		<-done
	}
	r.stopPub()
	return nil
}

// Run starts the relay and stops it gracefully when ctx ends, waiting at
// most grace for the in-flight batch.
func (r *Relay) Run(ctx context.Context, grace time.Duration) error {
	if err := r.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	return r.Stop(sctx)
}

// Ready reports whether the relay is working: its last lease upkeep reached
// the database within one lease TTL, and its table works with its code
// (SchemaCheck).
func (r *Relay) Ready() bool { return r.leases.ready(r.cfg.LeaseTTL) && !r.schema.isBlocked() }

// Partitions returns the partitions this relay leases now.
func (r *Relay) Partitions() []outboxdriver.Lease { return r.leases.snapshot() }

func (r *Relay) stage(s Stage, n int) {
	if r.cfg.OnStage != nil {
		r.cfg.OnStage(s, n)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
