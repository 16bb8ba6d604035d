package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/outboxkit/outbox/internal/backoff"
	"github.com/outboxkit/outbox/internal/confval"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/relayd"
	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/sinkurl"
)

// MaxSources is the most sources one Fleet relays: every source adds
// its own series to every metric (label source), and a bound on the
// sources is the bound on the label's values.
const MaxSources = 64

// MaxWeight is the largest weight of a source.
const MaxWeight = 100

// sourceName is the form of a source's name, which labels its metrics
// and log lines.
var sourceName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$`)

// Source is one outbox table a Fleet relays.
type Source struct {
	// Name identifies the source in metrics (label source), logs, health
	// and reloads: letters, digits, '_', '.', ':' and '-', at most 64.
	Name string
	// DB is the database URL, as for relayd.Open; Sink the sink URL, as
	// for sinkurl.Open, with SinkOptions. Sources with the same Sink and
	// SinkOptions share one sink.
	DB, Sink    string
	SinkOptions sinkurl.Options
	// Weight is the source's share of the publish budget when several
	// sources have work: it gets up to Weight turns in a row. 0 means 1.
	Weight int
	// Options configure the source's relay as for relayd.Open; Registerer and
	// OneCPUWhileIdle are ignored (the Fleet gives every source a
	// registry of its own, and no source changes the process's
	// GOMAXPROCS).
	Options relayd.Options
	// Config is what the source was configured from (its entry in a
	// configuration file, say): on Reload, a source whose Config, DB or
	// Sink changed is stopped and started anew; one whose Weight alone
	// changed keeps running with the new weight.
	Config string
}

// Options configure a Fleet. The zero value works.
type Options struct {
	// Budget is the publish budget the sources share; nil takes
	// NewBudget(0, 0).
	Budget *Budget
	// Metrics gives every source a Prometheus registry of its own, its
	// series labelled source="<name>"; the Fleet gathers them all
	// (Fleet.Gather).
	Metrics bool
	// Grace is how long a source that a reload removes may take to finish
	// its batch in flight before its publishes are cancelled. Defaults to
	// 30s.
	Grace time.Duration
	// Logger defaults to warnings and errors as text on standard error.
	Logger *slog.Logger
}

// Fleet relays several outbox tables (sources), each through a relay of
// its own as relayd.Open makes it, with its own leases, breaker and metrics,
// from one process. Sources with the same sink URL and sink options share
// one sink connection, and every source's publishes go through one
// publish Budget, so that a flooded source cannot crowd out the others.
// A source that cannot be opened (its database is down) is retried in the
// background while the others relay. Reload changes the set of sources
// without a restart.
type Fleet struct {
	budget *Budget
	opts   Options
	log    *slog.Logger

	reload  sync.Mutex // serialises Start, Reload and Stop
	mu      sync.Mutex
	members map[string]*member
	sinks   map[string]*sharedSink
	started bool
	stopped bool
}

// sharedSink is a sink opened once for the sources that name it.
type sharedSink struct {
	snk  sink.Sink
	refs int
}

// New returns a Fleet; it does no I/O.
func New(opts *Options) (*Fleet, error) {
	o := Options{}
	if opts != nil {
		o = *opts
	}
	if o.Budget == nil {
		b, err := NewBudget(0, 0)
		if err != nil {
			return nil, err
		}
		o.Budget = b
	}
	if o.Grace == 0 {
		o.Grace = 30 * time.Second
	}
	if o.Grace < 0 {
		return nil, fmt.Errorf("relayd: fleet grace %s must not be negative", o.Grace)
	}
	o.Logger = confval.Logger(o.Logger)
	return &Fleet{budget: o.Budget, opts: o, log: o.Logger, members: map[string]*member{}, sinks: map[string]*sharedSink{}}, nil
}

// CheckSources checks a set of sources as Start and Reload do: between 1
// and MaxSources, unique valid names, weights within 0 to
// MaxWeight, a database and a sink URL each, no two on the same
// table of the same database, and each one's Options.Relay as relay.New
// does (a *relay.ConfigError).
func CheckSources(srcs []Source) error {
	if len(srcs) == 0 {
		return errors.New("no sources")
	}
	if len(srcs) > MaxSources {
		return fmt.Errorf("%d sources: at most %d per process (each labels its own metrics)", len(srcs), MaxSources)
	}
	names := map[string]bool{}
	tables := map[string]string{}
	for _, s := range srcs {
		if !sourceName.MatchString(s.Name) {
			return fmt.Errorf("source name %q: use 1 to 64 letters, digits, '_', '.', ':' or '-', starting with a letter or digit", s.Name)
		}
		if names[s.Name] {
			return fmt.Errorf("source %q: named twice", s.Name)
		}
		names[s.Name] = true
		if s.Weight < 0 || s.Weight > MaxWeight {
			return fmt.Errorf("source %q: weight %d: use 1 to %d", s.Name, s.Weight, MaxWeight)
		}
		if s.DB == "" {
			return fmt.Errorf("source %q: no database URL", s.Name)
		}
		if s.Sink == "" {
			return fmt.Errorf("source %q: no sink URL", s.Name)
		}
		if err := (outboxdriver.Table{Schema: s.Options.Schema, Name: s.Options.Table}).WithDefaults().Validate(); err != nil {
			return fmt.Errorf("source %q: %w", s.Name, err)
		}
		if err := s.Options.Relay.WithDefaults().Validate(); err != nil {
			return fmt.Errorf("source %q: %w", s.Name, err)
		}
		key := s.DB + "\x00" + s.Options.Schema + "\x00" + s.Options.Table
		if other, ok := tables[key]; ok {
			return fmt.Errorf("sources %q and %q relay the same table", other, s.Name)
		}
		tables[key] = s.Name
	}
	return nil
}

// Start checks srcs (CheckSources) and starts relaying each of them in
// the background. A source that cannot be opened yet is retried with
// backoff and shows as starting in Health.
func (f *Fleet) Start(ctx context.Context, srcs []Source) error {
	if err := CheckSources(srcs); err != nil {
		return fmt.Errorf("relayd: %w", err)
	}
	f.reload.Lock()
	defer f.reload.Unlock()
	f.mu.Lock()
	if f.started || f.stopped {
		f.mu.Unlock()
		return errors.New("relayd: fleet already started")
	}
	f.started = true
	f.mu.Unlock()
	for _, s := range srcs {
		f.add(ctx, s)
	}
	f.log.Info("relay fleet started", "sources", len(srcs))
	return nil
}

// Reload makes the running sources srcs: it stops the sources no longer
// named (each finishes its batch in flight within Options.Grace and
// releases its leases, so that another relay takes its partitions), stops
// and restarts the changed ones, starts the new ones, and applies changed
// weights. A set that CheckSources refuses changes nothing.
func (f *Fleet) Reload(ctx context.Context, srcs []Source) error {
	if err := CheckSources(srcs); err != nil {
		return fmt.Errorf("relayd: %w", err)
	}
	f.reload.Lock()
	defer f.reload.Unlock()
	f.mu.Lock()
	if !f.started || f.stopped {
		f.mu.Unlock()
		return errors.New("relayd: fleet is not running")
	}
	var gone []*member
	var start []Source
	var added, removed, restarted, reweighted []string
	want := map[string]bool{}
	for _, s := range srcs {
		want[s.Name] = true
		m := f.members[s.Name]
		switch {
		case m == nil:
			start = append(start, s)
			added = append(added, s.Name)
		case m.spec.Config != s.Config || m.spec.DB != s.DB || m.spec.Sink != s.Sink:
			gone = append(gone, m)
			start = append(start, s)
			restarted = append(restarted, s.Name)
		case m.spec.Weight != s.Weight:
			m.spec.Weight = s.Weight
			m.share.setWeight(s.Weight)
			reweighted = append(reweighted, s.Name)
		}
	}
	for name, m := range f.members {
		if !want[name] {
			gone = append(gone, m)
			removed = append(removed, name)
		}
	}
	for _, m := range gone {
		delete(f.members, m.spec.Name)
	}
	f.mu.Unlock()
	f.stopMembers(gone, f.opts.Grace)
	for _, s := range start {
		f.add(ctx, s)
	}
	for _, l := range [][]string{added, removed, restarted, reweighted} {
		sort.Strings(l)
	}
	f.log.Info("relay fleet reloaded", "sources", len(srcs), "added", added, "removed", removed, "restarted", restarted, "reweighted", reweighted)
	return nil
}

// Stop stops every source as Relay.Stop does (the batches in flight
// finish, or are cancelled when ctx ends; the leases are released) and
// closes the shared sinks. It is idempotent.
func (f *Fleet) Stop(ctx context.Context) error {
	f.reload.Lock()
	defer f.reload.Unlock()
	f.mu.Lock()
	if f.stopped {
		f.mu.Unlock()
		return nil
	}
	f.stopped = true
	ms := make([]*member, 0, len(f.members))
	for _, m := range f.members {
		ms = append(ms, m)
	}
	clear(f.members)
	f.mu.Unlock()
	grace := time.Duration(-1)
	if d, ok := ctx.Deadline(); ok {
		grace = max(time.Until(d), 0)
	}
	errs := f.stopMembers(ms, grace)
	f.mu.Lock()
	for k, s := range f.sinks {
		errs = append(errs, s.snk.Close())
		delete(f.sinks, k)
	}
	f.mu.Unlock()
	return errors.Join(errs...)
}

// stopMembers stops ms at once, each within grace (negative: no bound).
func (f *Fleet) stopMembers(ms []*member, grace time.Duration) []error {
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() {
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if grace >= 0 {
				ctx, cancel = context.WithTimeout(ctx, grace)
			}
			defer cancel()
			errs[i] = m.stop(ctx)
		})
	}
	wg.Wait()
	return errs
}

// add starts relaying s in the background.
func (f *Fleet) add(ctx context.Context, s Source) {
	mctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m := &member{f: f, spec: s, share: f.budget.share(s.Weight), cancel: cancel, done: make(chan struct{}),
		log: f.log.With("source", s.Name), since: time.Now()}
	f.mu.Lock()
	f.members[s.Name] = m
	f.mu.Unlock()
	go m.run(mctx)
}

// SourceHealth is one source's state.
type SourceHealth struct {
	// Name is the source's name; Table its outbox table (once opened).
	Name, Table string
	// State is "starting" (not opened yet: Err says why), "ready" (its
	// lease upkeep reaches the database) or "not ready".
	State string
	// Err is the last reason the source could not be opened.
	Err string
	// Relay is the name the source's relay leases partitions under.
	Relay string
}

// The states of SourceHealth.
const (
	SourceStarting = "starting"
	SourceReady    = "ready"
	SourceNotReady = "not ready"
)

// Health reports every source's state, by name.
func (f *Fleet) Health() []SourceHealth {
	f.mu.Lock()
	ms := make([]*member, 0, len(f.members))
	for _, m := range f.members {
		ms = append(ms, m)
	}
	f.mu.Unlock()
	out := make([]SourceHealth, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.health())
	}
	slices.SortFunc(out, func(a, b SourceHealth) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out
}

// Ready reports whether every source is ready.
func (f *Fleet) Ready() bool {
	h := f.Health()
	for _, s := range h {
		if s.State != SourceReady {
			return false
		}
	}
	return len(h) > 0
}

// Gather gathers the metrics of every running source (Options.Metrics),
// each series labelled with its source; it makes the Fleet a
// prometheus.Gatherer.
func (f *Fleet) Gather() ([]*dto.MetricFamily, error) {
	f.mu.Lock()
	var gs prometheus.Gatherers
	for _, m := range f.members {
		if reg := m.registry(); reg != nil {
			gs = append(gs, reg)
		}
	}
	f.mu.Unlock()
	return gs.Gather()
}

// sinkKey identifies a shared sink: its URL and options.
func sinkKey(s Source) string {
	return fmt.Sprintf("%s\x00%+v", s.Sink, s.SinkOptions)
}

// acquireSink returns the sink s names, opening it when no running source
// shares it yet.
func (f *Fleet) acquireSink(ctx context.Context, s Source, log *slog.Logger) (sink.Sink, error) {
	key := sinkKey(s)
	f.mu.Lock()
	if sh, ok := f.sinks[key]; ok {
		sh.refs++
		f.mu.Unlock()
		return sh.snk, nil
	}
	f.mu.Unlock()
	snk, err := sinkurl.Open(ctx, s.Sink, &s.SinkOptions, log)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if sh, ok := f.sinks[key]; ok {
		// Another source opened it meanwhile.
		sh.refs++
		snk.Close()
		return sh.snk, nil
	}
	f.sinks[key] = &sharedSink{snk: snk, refs: 1}
	return snk, nil
}

// releaseSink closes the sink s names once no source uses it.
func (f *Fleet) releaseSink(s Source) error {
	key := sinkKey(s)
	f.mu.Lock()
	defer f.mu.Unlock()
	sh, ok := f.sinks[key]
	if !ok {
		return nil
	}
	if sh.refs--; sh.refs > 0 {
		return nil
	}
	delete(f.sinks, key)
	return sh.snk.Close()
}

// member is one running source of a Fleet.
type member struct {
	f      *Fleet
	spec   Source
	share  *budgetShare
	cancel context.CancelFunc
	done   chan struct{}
	log    *slog.Logger

	mu    sync.Mutex
	rl    *relayd.Relay
	reg   *prometheus.Registry
	err   error
	since time.Time
}

// Opening a source that fails is retried after a delay between these.
const (
	openRetryBase = time.Second
	openRetryMax  = 30 * time.Second
)

// run opens and starts the source's relay, retrying until it starts or
// ctx ends.
func (m *member) run(ctx context.Context) {
	defer close(m.done)
	for attempt := 1; ; attempt++ {
		err := m.start(ctx)
		if err == nil || ctx.Err() != nil {
			return
		}
		d := backoff.Delay(attempt, openRetryBase, openRetryMax)
		m.mu.Lock()
		m.err = err
		m.mu.Unlock()
		m.log.Warn("relay fleet: source cannot start; retrying", "err", oneLine(err), "retry_in", d, "attempt", attempt)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// start opens the source's relay and starts it.
func (m *member) start(ctx context.Context) error {
	snk, err := m.f.acquireSink(ctx, m.spec, m.log)
	if err != nil {
		return err
	}
	o := m.spec.Options
	o.Relay.ClaimLimit = m.share.claimLimit
	o.OneCPUWhileIdle = false
	o.Registerer = nil
	o.Relay.Logger = confval.Logger(o.Relay.Logger).With("source", m.spec.Name)
	var reg *prometheus.Registry
	if m.f.opts.Metrics {
		reg = prometheus.NewRegistry()
		o.Registerer = prometheus.WrapRegistererWith(prometheus.Labels{"source": m.spec.Name}, reg)
	}
	rl, err := relayd.Open(ctx, m.spec.DB, &fairSink{Sink: snk, share: m.share}, &o)
	if err == nil {
		if err = rl.Start(ctx); err != nil {
			rl.Stop(context.WithoutCancel(ctx))
		}
	}
	if err != nil {
		m.f.releaseSink(m.spec)
		return err
	}
	m.mu.Lock()
	m.rl, m.reg, m.err = rl, reg, nil
	m.mu.Unlock()
	return nil
}

// stop stops the source's relay (or its attempts to start) as Relay.Stop
// does, within ctx.
func (m *member) stop(ctx context.Context) error {
	m.cancel()
	<-m.done
	m.mu.Lock()
	rl := m.rl
	m.rl, m.reg = nil, nil
	m.mu.Unlock()
	if rl == nil {
		return nil
	}
	err := rl.Stop(ctx)
	m.log.Info("relay fleet: source stopped")
	return errors.Join(err, m.f.releaseSink(m.spec))
}

func (m *member) registry() *prometheus.Registry {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reg
}

func (m *member) health() SourceHealth {
	m.mu.Lock()
	defer m.mu.Unlock()
	h := SourceHealth{Name: m.spec.Name, State: SourceStarting}
	if m.err != nil {
		h.Err = oneLine(m.err)
	}
	if m.rl == nil {
		return h
	}
	h.Table, h.Relay = m.rl.Table().String(), m.rl.RelayName()
	h.State = SourceNotReady
	if m.rl.Ready() {
		h.State = SourceReady
	}
	return h
}

// oneLine is err's text on one line, for a health report.
func oneLine(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }
