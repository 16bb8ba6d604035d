package relayd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outbox/internal/confval"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx/cdc"
	"github.com/outboxkit/outbox/outboxprom"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/route"
	"github.com/outboxkit/outbox/sink"
)

// Options configure Open. The zero value relays public.outbox (the
// driver's default schema, on MySQL the URL's database) with the relay's
// defaults.
type Options struct {
	// Schema and Table name the outbox table; empty takes the defaults.
	Schema, Table string
	// Retention of published rows: delete (the default) or keep.
	Retention outboxdriver.Retention
	// RelayName identifies this relay in the lease registry; defaults to
	// host-pid-random.
	RelayName string
	// Relay configures the engine (batch size, lanes, poll interval,
	// routing, retries, poison policy, logger, ...). Its Logger also
	// serves the sink and the source; it defaults to warnings and errors
	// as text on standard error.
	Relay relay.Config
	// Source picks how the relay finds committed events: SourcePoll (the
	// default: claims rows, woken by LISTEN/NOTIFY) or SourceCDC (tails
	// PostgreSQL's WAL through logical replication; docs/cdc.md).
	Source string
	// CDC configures log tailing (Source SourceCDC): slot, publication,
	// mode, whether to create what is missing. Its SourceConfig is taken
	// from Retention, RelayName and Relay.Logger above.
	CDC cdc.Config
	// MaxConns bounds the database pool; defaults to the relay's lanes
	// plus three (one for LISTEN, one for lease upkeep, one to spare).
	MaxConns int32
	// Registerer, when set, gets the relay's Prometheus metrics
	// (package outboxprom): the engine's counters and the table's gauges,
	// the backlog and oldest-event age by destination (PostgreSQL) and the
	// drain estimate included (docs/operations.md, Metrics), and with
	// SourceCDC its replication slot's (outboxprom.RegisterCDC); with
	// Relay.Contracts (a *contract.Registry), the events let through
	// without a contract (outboxprom.RegisterContracts). A Metrics set in
	// Relay keeps receiving every count beside them.
	Registerer prometheus.Registerer
	// OneCPUWhileIdle runs the process on one P (GOMAXPROCS=1) while the
	// relay's batches come back short, and on the runtime's default from
	// the first full batch (a backlog) until batches have been short for a
	// second: a relay keeping up with light traffic is a chain of round
	// trips, and one P spares the hand-offs between OS threads. It
	// changes the whole process's GOMAXPROCS, so it suits a process that
	// mostly relays; it does nothing when GOMAXPROCS is set in the
	// environment. It is off by default, because a library must not
	// change its host's GOMAXPROCS unasked; `outbox relay`, a process of
	// its own, turns it on: that is the one difference between the two.
	OneCPUWhileIdle bool
}

// The sources Options.Source names.
const (
	SourcePoll = "poll"
	SourceCDC  = "cdc"
)

// Relay is a relay opened by Open, with everything it opened.
type Relay struct {
	relay *relay.Relay
	db    *DB
	src   outboxdriver.Source
	snk   sink.Sink
	table outboxdriver.Table
	log   *slog.Logger

	mu      sync.Mutex
	started bool
	closed  bool
}

// Open opens the database dbURL names (postgres://, mysql://, sqlite://),
// checks that the outbox table is migrated, and makes a relay from it to
// snk. It does not start relaying (Start). opts may be nil.
//
// Open takes snk over: Stop closes it, and so does Open when it fails. A
// sink is opened by its package (natssink.DialStream, kafkasink.Dial,
// ...), so that a program links only the brokers it uses, or from a URL by
// package sink/sinkurl, which links them all.
func Open(ctx context.Context, dbURL string, snk sink.Sink, opts *Options) (_ *Relay, err error) {
	if snk == nil {
		return nil, errors.New("relayd: Open: nil sink")
	}
	o := Options{}
	if opts != nil {
		o = *opts
	}
	rl := &Relay{snk: snk}
	defer func() {
		if err != nil {
			rl.close()
		}
	}()
	// The relay's own check, before anything is opened.
	cfg := o.Relay.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := confval.Logger(cfg.Logger)
	cfg.Logger = log
	t := outboxdriver.Table{Schema: o.Schema, Name: o.Table}
	if err := checkNames(t); err != nil {
		return nil, fmt.Errorf("relayd: %w", err)
	}
	maxConns := o.MaxConns
	if maxConns == 0 {
		maxConns = int32(cfg.Lanes + 3)
	}
	rl.log = log
	if rl.db, err = OpenDB(ctx, dbURL, maxConns); err != nil {
		return nil, err
	}
	if t.Schema == "" {
		t.Schema = rl.db.Store.DefaultSchema()
	}
	if t.Name == "" {
		t.Name = outboxdriver.DefaultTableName
	}
	rl.table = t
	if err := rl.checkTable(ctx); err != nil {
		return nil, err
	}
	srcCfg := outboxdriver.SourceConfig{Retention: o.Retention, RelayName: o.RelayName, Logger: log}
	switch o.Source {
	case "", SourcePoll:
		rl.src, err = rl.db.Store.NewSource(t, &srcCfg)
	case SourceCDC:
		c := o.CDC
		c.SourceConfig = srcCfg
		rl.src, err = cdcSource(ctx, rl.db, t, &c)
	default:
		err = fmt.Errorf("relayd: unknown source %q: use %s or %s", o.Source, SourcePoll, SourceCDC)
	}
	if err != nil {
		return nil, err
	}
	if o.Retention == outboxdriver.RetentionDelete {
		// No row is kept. DropPartitionsAfter took CleanupAfter above
		// (WithDefaults): one window for rows and time partitions.
		cfg.CleanupAfter = 0
	}
	if o.OneCPUWhileIdle {
		cfg.OnStage = newProcs(cfg.BatchSize, log).onStage(cfg.OnStage)
	}
	if o.Registerer != nil {
		if cfg.Router == nil {
			if cfg.Router, err = route.New(nil); err != nil {
				return nil, err
			}
		}
		prom, err := newMetrics(o.Registerer, rl.db.Store, t, cfg.Router, rl.src.RelayName())
		if err != nil {
			return nil, err
		}
		if cfg.Metrics != nil {
			cfg.Metrics = bothMetrics{prom: prom, own: cfg.Metrics}
		} else {
			cfg.Metrics = prom
		}
		if uc, ok := cfg.Contracts.(outboxprom.UncoveredCounter); ok {
			if err := outboxprom.RegisterContracts(o.Registerer, uc); err != nil {
				return nil, err
			}
		}
		if src, ok := rl.src.(*cdc.Source); ok {
			err := outboxprom.RegisterCDC(o.Registerer, src.Slot(), func(ctx context.Context) (outboxdriver.SlotStatus, time.Duration, error) {
				st, err := src.Stats(ctx)
				return st.SlotStatus, st.Lag, err
			})
			if err != nil {
				return nil, err
			}
		}
	}
	if rl.relay, err = relay.New(rl.src, rl.snk, &cfg); err != nil {
		return nil, err
	}
	return rl, nil
}

// checkNames validates the names given; an empty one is the default.
func checkNames(t outboxdriver.Table) error {
	check := t.WithDefaults()
	return check.Validate()
}

// ErrNotMigrated is wrapped by Open and Start when the table does not
// exist (`outbox migrate` has not run).
var ErrNotMigrated = outboxdriver.ErrNotMigrated

// Start checks that the outbox table exists (it fails, wrapping
// ErrNotMigrated, when it does not), then starts relaying in the
// background.
func (r *Relay) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errors.New("relayd: relay is stopped")
	}
	if r.started {
		return errors.New("relayd: already started")
	}
	if err := r.checkTable(ctx); err != nil {
		return err
	}
	if err := r.relay.Start(ctx); err != nil {
		return err
	}
	r.started = true
	r.log.Info("relay started", "table", r.table.String(), "relay", r.src.RelayName())
	return nil
}

// checkTable fails unless the table exists, and warns when its schema is
// older than this build's.
func (r *Relay) checkTable(ctx context.Context) error {
	st, err := r.db.Store.Status(ctx, r.table)
	if err != nil {
		return fmt.Errorf("relayd: %w", err)
	}
	if st.SchemaVersion < st.LatestSchemaVersion {
		// A relay of this build still reads the older schema's
		// table (json or jsonb payloads alike): say so, and relay on.
		r.log.Warn("relayd: the outbox table's schema is older than this build's; run `outbox migrate`",
			"table", r.table.String(), "version", st.SchemaVersion, "latest", st.LatestSchemaVersion)
	}
	return nil
}

// Stop stops the relay as relay.Relay.Stop does (the batch in flight
// finishes, or is cancelled when ctx ends), then closes the source, the
// sink and the database pool Open opened. It is idempotent, and closes
// what Open opened also when Start never ran.
func (r *Relay) Stop(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	err := r.relay.Stop(ctx)
	r.closed = true
	if r.started {
		r.log.Info("relay stopped")
	}
	return errors.Join(err, r.close())
}

// close closes what Open opened, in the reverse order.
func (r *Relay) close() error {
	var errs []error
	if r.src != nil {
		errs = append(errs, r.src.Close())
	}
	if r.snk != nil {
		errs = append(errs, r.snk.Close())
	}
	if r.db != nil {
		r.db.Close()
	}
	return errors.Join(errs...)
}

// Run starts the relay and stops it when ctx ends, waiting at most grace
// for the batch in flight.
func (r *Relay) Run(ctx context.Context, grace time.Duration) error {
	if err := r.Start(ctx); err != nil {
		r.Stop(context.WithoutCancel(ctx))
		return err
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	return r.Stop(sctx)
}

// Ready reports whether the relay is working (relay.Relay.Ready).
func (r *Relay) Ready() bool { return r.relay.Ready() }

// Table is the outbox table relayed, its defaults filled in.
func (r *Relay) Table() outboxdriver.Table { return r.table }

// Store is the database's driver, for status and dead letters.
func (r *Relay) Store() outboxdriver.Store { return r.db.Store }

// RelayName is the name this relay registers under.
func (r *Relay) RelayName() string { return r.src.RelayName() }

// Source is the source the relay claims from: the driver's polling source,
// or with SourceCDC a *cdc.Source, whose Stats tell the replication slot's
// state and lag.
func (r *Relay) Source() outboxdriver.Source { return r.src }

// Sink is the sink the relay publishes through (the one given to Open).
func (r *Relay) Sink() sink.Sink { return r.snk }

// destinationGroups is how many routed values the backlog by destination
// reads at most per scrape; the rest is reported as outboxprom.Other.
const destinationGroups = 1000

// newMetrics registers the relay's metrics on reg: the engine's counters,
// the table's status and the backlog by destination as router routes it.
func newMetrics(reg prometheus.Registerer, store outboxdriver.Store, t outboxdriver.Table, router *route.Router, name string) (*outboxprom.Metrics, error) {
	cfg := &outboxprom.Config{
		Status:    func(ctx context.Context) (outboxdriver.Status, error) { return store.Status(ctx, t) },
		RelayName: name,
	}
	cfg.Destinations = func(ctx context.Context) ([]outboxprom.DestinationBacklog, error) {
		groups, err := store.BacklogBy(ctx, t, router.RouteBy(), destinationGroups)
		if err != nil {
			return nil, err
		}
		out := make([]outboxprom.DestinationBacklog, 0, len(groups))
		for _, gr := range groups {
			d := outboxprom.Other
			if !gr.Rest {
				if dest, err := router.DestinationOf(gr.Value); err == nil {
					d = dest
				}
			}
			out = append(out, outboxprom.DestinationBacklog{Destination: d, Events: gr.Events, OldestAge: gr.OldestAge})
		}
		return out, nil
	}
	return outboxprom.NewWithConfig(reg, cfg)
}
