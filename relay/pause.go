package relay

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outbox/internal/backoff"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/route"
)

// pauses is the relay's view of the pauses in force (outbox pause): read
// from the Source about once per poll interval. A relay honours a pause
// within one poll interval of it: every claim that starts later sees it.
// A claim that finds the view older than half a poll interval starts a
// read in the background and goes on with the view it has, so that a
// relay claiming steadily does not pay the read in front of its claims;
// only a view a whole poll interval old is read before the claim.
//
// A paused event is never touched: the relay blocks its aggregate for the
// rest of the batch (as for a broker outage, spending no attempt) and
// leaves the event to be claimed again. So that a paused backlog does not
// fill every batch while other events wait behind it, the relay asks the
// Source to leave the paused aggregate types out of its claims, and, when
// the router picks the destination by aggregate type alone, the types it
// saw routed to a paused destination. A batch with paused events the
// source could not leave out makes the relay wait a poll interval before
// it claims again.
type pauses struct {
	src    outboxdriver.Source
	every  time.Duration
	byType bool // the destination depends on the aggregate type alone
	log    *slog.Logger
	db     *backoff.Outage // reads are calls of the database

	mu      sync.Mutex
	set     pauseSet
	readAt  time.Time
	learned map[string]string // aggregate type -> its paused destination
	reading bool              // a read ahead runs
	stalled atomic.Bool       // a batch held paused events the claim could not leave out

	bg    context.Context // the relay's claims' context, for reads ahead; nil: none
	ahead sync.WaitGroup  // the read ahead, waited for when the relay stops
}

func newPauses(src outboxdriver.Source, every time.Duration, byType bool, log *slog.Logger, db *backoff.Outage) *pauses {
	return &pauses{src: src, every: every, byType: byType, log: log, db: db, learned: map[string]string{}}
}

// refresh reads the pauses when the last read is a poll interval old,
// and reports whether everything is paused. A failed read keeps the last
// set (the claim that follows meets the same database); it is reported to
// the database's outage tracker, which logs it.
func (p *pauses) refresh(ctx context.Context) (all bool) {
	return p.refreshFrom(ctx, p.src)
}

// refreshBefore is refresh before the records of batch b are published,
// read through b (on the claim's own connection, where it holds one), so
// that a relay whose lanes hold every connection of a small pool never
// waits for one more while it holds one.
func (p *pauses) refreshBefore(ctx context.Context, b outboxdriver.Batch) {
	p.refreshFrom(ctx, b)
}

// pauseReader reads the pauses in force: a Source, or a Batch on its
// claim's connection.
type pauseReader interface {
	Pauses(ctx context.Context) ([]outboxdriver.Pause, error)
}

// refreshFrom reads the pauses through r when due, and starts a read
// ahead (through the Source) when the view is half due. The read runs
// without p.mu held: lanes that find the set stale at the same time each
// read (one small query), and the newest read wins; none waits on
// another's connection.
func (p *pauses) refreshFrom(ctx context.Context, r pauseReader) (all bool) {
	p.mu.Lock()
	if age := time.Since(p.readAt); age < p.every {
		all = p.set.All
		if age >= p.every/2 && !p.reading && p.bg != nil {
			p.reading = true
			p.ahead.Go(p.readAhead)
		}
		p.mu.Unlock()
		return all
	}
	p.mu.Unlock()
	all, err := p.read(ctx, r)
	switch {
	case err == nil:
		p.db.OK()
	case ctx.Err() == nil:
		p.db.Fail(opPauses, err) // the claim that follows backs off
	}
	return all
}

// readAhead reads the pauses before they are due. It gives up when they
// fall due (the claims then read them themselves, and report a failure)
// and fails silently; a success tells the outage tracker the database
// answers.
func (p *pauses) readAhead() {
	defer func() {
		p.mu.Lock()
		p.reading = false
		p.mu.Unlock()
	}()
	rctx, cancel := context.WithTimeout(p.bg, p.every)
	defer cancel()
	if _, err := p.read(rctx, p.src); err == nil {
		p.db.OK()
	}
}

// start lets claims read ahead within ctx, the relay's claims' context;
// called before the relay's goroutines start.
func (p *pauses) start(ctx context.Context) { p.bg = ctx }

// wait waits for a read ahead to end.
func (p *pauses) wait() { p.ahead.Wait() }

// read reads the pauses through r and applies them unless a read that
// started later was applied first. A failed read keeps the last set.
func (p *pauses) read(ctx context.Context, r pauseReader) (all bool, err error) {
	start := time.Now()
	ps, err := r.Pauses(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		return p.set.All, err
	}
	if start.Before(p.readAt) {
		return p.set.All, nil // a read that started later was applied
	}
	p.readAt = start
	set := newPauseSet(ps)
	if !set.All && !p.set.All && maps.Equal(set.Destinations, p.set.Destinations) && maps.Equal(set.AggregateTypes, p.set.AggregateTypes) {
		return false, nil
	}
	if !set.Empty() || !p.set.Empty() {
		p.log.Info("relay: pauses changed", "all", set.All, "destinations", slices.Sorted(maps.Keys(set.Destinations)),
			"aggregate_types", slices.Sorted(maps.Keys(set.AggregateTypes)))
	}
	p.set = set
	maps.DeleteFunc(p.learned, func(_, dest string) bool { return !set.Destinations[dest] })
	p.exclude()
	return set.All, nil
}

// exclude tells the source which aggregate types to leave out; p.mu is
// held.
func (p *pauses) exclude() {
	types := slices.Collect(maps.Keys(p.set.AggregateTypes))
	for t := range p.learned {
		if !p.set.AggregateTypes[t] {
			types = append(types, t)
		}
	}
	slices.Sort(types)
	p.src.ExcludeAggregateTypes(types)
}

// destPausedRec reports whether rec routes to a paused destination, for
// an event whose message could not be made (its contract refused it): a
// paused event is left untouched even when it would be dead-lettered.
func (p *pauses) destPausedRec(rec *outboxdriver.Record, router *route.Router) bool {
	if router == nil {
		return false
	}
	p.mu.Lock()
	none := len(p.set.Destinations) == 0
	p.mu.Unlock()
	if none {
		return false
	}
	m, err := router.Message(rec)
	return err == nil && p.destPaused(rec.AggregateType, m.Destination)
}

// typePaused reports whether aggregateType is paused, before routing.
func (p *pauses) typePaused(aggregateType string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.set.All && !p.set.AggregateTypes[aggregateType] {
		return false
	}
	if p.set.All {
		p.stalled.Store(true)
	}
	return true
}

// destPaused reports whether destination is paused; an event of
// aggregateType routed there is left for later.
func (p *pauses) destPaused(aggregateType, destination string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.set.Destinations[destination] {
		return false
	}
	if p.byType {
		if _, ok := p.learned[aggregateType]; !ok {
			p.learned[aggregateType] = destination
			p.exclude()
		}
		return true
	}
	p.stalled.Store(true)
	return true
}

// stall reports (once) that a batch held paused events the source could
// not leave out of its claims.
func (p *pauses) stall() bool { return p.stalled.Swap(false) }

// pauseSet is the set of pauses in force, as a relay consults it.
type pauseSet struct {
	All            bool
	Destinations   map[string]bool
	AggregateTypes map[string]bool
}

// newPauseSet returns the set of ps.
func newPauseSet(ps []outboxdriver.Pause) pauseSet {
	var s pauseSet
	for _, p := range ps {
		switch p.Kind {
		case outboxdriver.PauseAll:
			s.All = true
		case outboxdriver.PauseDestination:
			if s.Destinations == nil {
				s.Destinations = map[string]bool{}
			}
			s.Destinations[p.Value] = true
		case outboxdriver.PauseAggregateType:
			if s.AggregateTypes == nil {
				s.AggregateTypes = map[string]bool{}
			}
			s.AggregateTypes[p.Value] = true
		}
	}
	return s
}

// Empty reports whether nothing is paused.
func (s pauseSet) Empty() bool {
	return !s.All && len(s.Destinations) == 0 && len(s.AggregateTypes) == 0
}
