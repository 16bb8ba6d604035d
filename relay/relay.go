// Package relay publishes committed outbox events to a broker.
//
// The engine claims unpublished events from an outboxdriver.Source in
// insertion order, routes them (package route), publishes them through a
// sink.Sink and records the outcome only after the broker acknowledged.
// It is woken early by the source (LISTEN/NOTIFY for PostgreSQL), with the
// poll interval as the safety net, and claims again at once while a backlog
// remains. It never imports a database or broker client.
package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/route"
	"github.com/outboxkit/outbox/sink"
)

// Config configures a Relay. Zero values take the documented defaults.
type Config struct {
	// BatchSize is the most events claimed and published at once.
	// Defaults to 500.
	BatchSize int
	// PollInterval is the longest the relay waits for a wake-up before it
	// looks again. Defaults to 500ms.
	PollInterval time.Duration
	// Router maps events to messages. Defaults to Debezium's routing.
	Router *route.Router
	// RetryBase and RetryMax bound the exponential backoff, with jitter, of
	// an event whose publish failed while others succeeded, and of the whole
	// relay while every publish fails (broker down) or the database is
	// unreachable. Default 100ms and 30s.
	RetryBase, RetryMax time.Duration
	// FinishTimeout bounds recording a batch's outcome once the broker has
	// answered, also while stopping. Defaults to 10s.
	FinishTimeout time.Duration
	// Logger defaults to slog.Default(). Payloads are never logged.
	Logger *slog.Logger
	// Metrics receives counts and latencies; nil discards them.
	Metrics Metrics
}

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
	// DeadLettered reports one event moved to the dead-letter table.
	DeadLettered(destination string)
}

type nopMetrics struct{}

func (nopMetrics) Claimed(int)                     {}
func (nopMetrics) Published(string, time.Duration) {}
func (nopMetrics) PublishFailed(string, bool)      {}
func (nopMetrics) DeadLettered(string)             {}

// minWait is the first wait after the relay caught up. Waits then double up
// to PollInterval, so a writer whose transaction committed just as the relay
// went idle (and so sent no wake-up) waits milliseconds, not a poll interval.
const minWait = time.Millisecond

// Relay moves events from a Source to a Sink.
type Relay struct {
	src     outboxdriver.Source
	snk     sink.Sink
	cfg     Config
	log     *slog.Logger
	metrics Metrics

	mu        sync.Mutex
	started   bool
	stopping  bool
	stopClaim context.CancelFunc // stops claiming and waiting
	stopPub   context.CancelFunc // aborts in-flight publishes
	done      chan struct{}
	runErr    error
}

// New returns a Relay; it does no I/O. The caller keeps ownership of src
// and snk and closes them after Stop.
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
	if c.BatchSize == 0 {
		c.BatchSize = 500
	}
	if c.BatchSize < 0 || c.BatchSize > 100_000 {
		return nil, fmt.Errorf("relay: batch size %d must be between 1 and 100000", c.BatchSize)
	}
	if c.PollInterval == 0 {
		c.PollInterval = 500 * time.Millisecond
	}
	if c.PollInterval < minWait {
		return nil, fmt.Errorf("relay: poll interval %s must be at least %s", c.PollInterval, minWait)
	}
	if c.RetryBase == 0 {
		c.RetryBase = 100 * time.Millisecond
	}
	if c.RetryMax == 0 {
		c.RetryMax = 30 * time.Second
	}
	if c.RetryBase < 0 || c.RetryMax < c.RetryBase {
		return nil, fmt.Errorf("relay: retry backoff base %s and max %s must satisfy 0 < base <= max", c.RetryBase, c.RetryMax)
	}
	if c.FinishTimeout == 0 {
		c.FinishTimeout = 10 * time.Second
	}
	if c.Router == nil {
		r, err := route.New(nil)
		if err != nil {
			return nil, err
		}
		c.Router = r
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	m := c.Metrics
	if m == nil {
		m = nopMetrics{}
	}
	return &Relay{src: src, snk: snk, cfg: c, log: c.Logger, metrics: m}, nil
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
	go func() {
		defer close(r.done)
		r.loop(claimCtx, pubCtx)
	}()
	return nil
}

// Stop stops claiming, lets the in-flight batch finish publishing and
// record its outcome, and returns when the relay's goroutine has exited. If
// ctx ends first, in-flight publishes are cancelled (their events stay
// unpublished and are relayed again later) and Stop still waits for the
// goroutine. Stop is idempotent and safe when Start never ran.
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

func (r *Relay) loop(ctx, pubCtx context.Context) {
	var (
		wait      = minWait
		idle      bool
		idleSince time.Time
		failures  int // consecutive whole-relay failures (database or broker)
	)
	for ctx.Err() == nil {
		b, err := r.src.Claim(ctx, r.cfg.BatchSize)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			d := r.backoff(failures)
			r.log.Error("relay: claim failed; retrying", "err", err, "retry_in", d)
			sleep(ctx, d)
			continue
		}
		recs := b.Records()
		r.metrics.Claimed(len(recs))
		if len(recs) == 0 {
			b.Release(ctx)
			if !idle || time.Since(idleSince) > r.cfg.PollInterval {
				// Register as idle (writers then send a wake-up), then look
				// once more: a row committed before the registration sent
				// no wake-up.
				if err := r.src.SetIdle(ctx, 3*r.cfg.PollInterval); err != nil && ctx.Err() == nil {
					r.log.Warn("relay: cannot register for wake-ups; polling", "err", err)
				}
				idle, idleSince = true, time.Now()
				continue
			}
			if err := r.src.Wait(ctx, wait); err != nil && ctx.Err() == nil {
				r.log.Warn("relay: waiting for wake-up failed; polling", "err", err)
				sleep(ctx, wait)
			}
			wait = min(wait*2, r.cfg.PollInterval)
			continue
		}
		wait = minWait
		if idle {
			idle = false
			if err := r.src.SetIdle(ctx, 0); err != nil && ctx.Err() == nil {
				r.log.Warn("relay: cannot leave idle state", "err", err)
			}
		}
		if r.process(pubCtx, b, recs) {
			failures = 0
			continue
		}
		failures++
		d := r.backoff(failures)
		r.log.Warn("relay: every publish of the batch failed; backing off", "events", len(recs), "retry_in", d)
		sleep(ctx, d)
	}
}

// process publishes one claimed batch and records the outcome. It returns
// false when every message failed transiently (the broker is down): the
// claim is then released untouched, so no event spends an attempt.
func (r *Relay) process(ctx context.Context, b outboxdriver.Batch, recs []outboxdriver.Record) bool {
	msgs := make([]sink.Message, 0, len(recs))
	pos := make([]int, 0, len(recs)) // msgs[i] is recs[pos[i]]
	var out outboxdriver.Outcome
	var failedDest []string // destination of out.Failed[i]
	dest := make([]string, len(recs))
	for i := range recs {
		m, err := r.cfg.Router.Message(&recs[i])
		if err != nil {
			out.Failed = append(out.Failed, outboxdriver.Failure{ID: recs[i].ID, Err: err, Permanent: true})
			failedDest = append(failedDest, "")
			r.metrics.PublishFailed("", true)
			continue
		}
		dest[i] = m.Destination
		msgs = append(msgs, m)
		pos = append(pos, i)
	}
	var results []error
	if len(msgs) > 0 {
		results = r.snk.Publish(ctx, msgs)
		if len(results) != len(msgs) {
			r.log.Error("relay: sink returned a wrong number of results; releasing the batch", "want", len(msgs), "got", len(results))
			b.Release(ctx)
			return false
		}
	}
	transient := 0
	now := time.Now()
	for i, err := range results {
		rec := &recs[pos[i]]
		if err == nil {
			out.Published = append(out.Published, rec.ID)
			r.metrics.Published(dest[pos[i]], now.Sub(rec.CreatedAt))
			continue
		}
		perm := sink.IsPermanent(err)
		r.metrics.PublishFailed(dest[pos[i]], perm)
		if !perm {
			transient++
		}
		out.Failed = append(out.Failed, outboxdriver.Failure{ID: rec.ID, Err: err, Permanent: perm, RetryAfter: r.backoff(rec.Attempts + 1)})
		failedDest = append(failedDest, dest[pos[i]])
	}
	if transient > 0 && transient == len(recs) {
		r.log.Warn("relay: publish failed", "err", results[0])
		b.Release(ctx)
		return false
	}
	for _, f := range out.Failed {
		if f.Permanent {
			r.log.Warn("relay: event refused for good; dead-lettering", "id", f.ID, "err", f.Err)
		} else {
			r.log.Warn("relay: publish failed; will retry", "id", f.ID, "retry_in", f.RetryAfter, "err", f.Err)
		}
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.FinishTimeout)
	defer cancel()
	if err := b.Finish(fctx, out); err != nil {
		// The broker has the events; they will be published again (same
		// ids) once the claim's locks are gone.
		r.log.Error("relay: recording the outcome failed; acknowledged events will be republished", "events", len(out.Published), "err", err)
		return true
	}
	for i, f := range out.Failed {
		if f.Permanent {
			r.metrics.DeadLettered(failedDest[i])
		}
	}
	return true
}

// backoff returns the delay before attempt n+1: exponential from RetryBase,
// capped at RetryMax, with full jitter over its upper half.
func (r *Relay) backoff(n int) time.Duration {
	d := r.cfg.RetryBase
	for i := 1; i < n && d < r.cfg.RetryMax; i++ {
		d *= 2
	}
	d = min(d, r.cfg.RetryMax)
	return d/2 + rand.N(d/2+1)
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
