package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox/internal/backoff"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/sink"
)

// loop is the batch loop: claim, publish, record, until ctx ends. A claim
// that fails, or a batch that meets a broker outage, is reported to that
// dependency's outage tracker, which logs the outage once and says how long
// to wait before the next claim (at most breakerMax: the next claim is the
// next try).
func (r *Relay) loop(ctx, pubCtx context.Context) {
	wk := newWakeups(r.src, r.cfg.PollInterval, r.db)
	for ctx.Err() == nil {
		leases := r.leases.snapshot()
		if len(leases) == 0 || r.pauses.refresh(ctx) {
			r.waitForWork(ctx, r.cfg.PollInterval)
			continue
		}
		r.leases.inFlight.RLock()
		claimed := time.Now()
		limit := r.claimLimit()
		b, err := r.src.Claim(ctx, leases, limit)
		if err != nil {
			r.leases.inFlight.RUnlock()
			if ctx.Err() != nil {
				return
			}
			sleep(ctx, r.db.Fail(opClaim, err))
			continue
		}
		r.db.OK()
		recs := b.Records()
		r.metrics.Claimed(len(recs))
		if len(recs) == 0 {
			b.Release(ctx)
			r.leases.inFlight.RUnlock()
			if d, ok := wk.empty(ctx); ok {
				r.waitForWork(ctx, d)
			}
			continue
		}
		r.stage(StageClaimed, len(recs))
		full := len(recs) == limit
		wk.claimed(ctx, len(recs), full)
		clean, retry, outage := r.process(pubCtx, b, recs)
		r.leases.inFlight.RUnlock()
		if retry > 0 {
			// The outcome was not recorded: the database fails.
			sleep(ctx, retry)
			continue
		}
		if outage == nil && r.pauses.stall() {
			// Paused events the claim could not leave out: they would
			// come back at once.
			r.waitForWork(ctx, r.cfg.PollInterval)
			continue
		}
		if outage == nil && full && r.cfg.Lanes > 1 && limit == r.cfg.BatchSize {
			// A backlog: work it off in lanes.
			outage = r.lanes(ctx, pubCtx)
		}
		if outage != nil {
			if ctx.Err() != nil {
				return // stopping: publishes in flight were cut short
			}
			// The next claim publishes the batch again: the probe of the
			// broker, every breakerMax at most.
			sleep(ctx, r.broker.Fail("publish", outage))
			continue
		}
		r.broker.OK()
		if clean && !full {
			switch wk.caughtUp(ctx) {
			case claimAgain:
				continue
			case awaitWakeup:
				r.linger(ctx, claimed)
				r.waitForWork(ctx, r.cfg.PollInterval)
				continue
			}
		}
		if wk.steady && !full {
			r.linger(ctx, claimed)
		}
	}
}

// linger waits until Config.Linger has passed since claimed, so that a
// few more events gather: fewer, fuller batches.
func (r *Relay) linger(ctx context.Context, claimed time.Time) {
	if d := r.cfg.Linger - time.Since(claimed); d > 0 {
		sleep(ctx, d)
	}
}

// claimLimit is the most events the next claim may take: BatchSize, or
// less while Config.ClaimLimit says so.
func (r *Relay) claimLimit() int {
	if r.cfg.ClaimLimit == nil {
		return r.cfg.BatchSize
	}
	if n := r.cfg.ClaimLimit(r.cfg.BatchSize); n >= 1 && n < r.cfg.BatchSize {
		return n
	}
	return r.cfg.BatchSize
}

// lanes works off a backlog: Config.Lanes goroutines each claim, publish
// and record batches of their own disjoint share of the leased partitions
// until a claim of theirs comes back short of a full batch, or
// Config.ClaimLimit asks for smaller claims (the main loop then goes on
// with one batch in flight). It returns when every lane has stopped, with
// the first broker outage a lane met. A lane whose claim fails stops too;
// the main loop's next claim meets the failure and backs off.
func (r *Relay) lanes(ctx, pubCtx context.Context) error {
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		outage error
	)
	n := r.cfg.Lanes
	for lane := range n {
		wg.Go(func() {
			for ctx.Err() == nil {
				var leases []outboxdriver.Lease
				for _, l := range r.leases.snapshot() {
					if l.Partition%n == lane {
						leases = append(leases, l)
					}
				}
				if len(leases) == 0 || r.pauses.refresh(ctx) || r.claimLimit() < r.cfg.BatchSize {
					return
				}
				r.leases.inFlight.RLock()
				b, err := r.src.Claim(ctx, leases, r.cfg.BatchSize)
				if err != nil {
					r.leases.inFlight.RUnlock()
					return
				}
				recs := b.Records()
				r.metrics.Claimed(len(recs))
				if len(recs) == 0 {
					b.Release(ctx)
					r.leases.inFlight.RUnlock()
					return
				}
				r.stage(StageClaimed, len(recs))
				_, retry, out := r.process(pubCtx, b, recs)
				r.leases.inFlight.RUnlock()
				if retry > 0 {
					return // the main loop's next claim meets the database
				}
				if out != nil {
					mu.Lock()
					if outage == nil {
						outage = out
					}
					mu.Unlock()
					return
				}
				if len(recs) < r.cfg.BatchSize || r.pauses.stalled.Load() {
					return
				}
			}
		})
	}
	wg.Wait()
	return outage
}

// waitForWork waits for a wake-up from the source, newly acquired
// partitions, d, or ctx.
func (r *Relay) waitForWork(ctx context.Context, d time.Duration) {
	wctx, cancel := context.WithCancel(ctx)
	r.leases.setWake(cancel)
	err := r.src.Wait(wctx, d)
	if err != nil && wctx.Err() == nil {
		r.db.Fail("wait for wake-up", err)
		sleep(wctx, d) // polling; newly acquired partitions end it too
	}
	r.leases.setWake(nil)
	cancel()
}

// process publishes one claimed batch and records the outcome. The events
// of one aggregate go out in waves: wave k holds the k-th event of every
// aggregate still flowing, and starts only once wave k-1 was answered, so
// no event is published while an earlier event of its aggregate failed.
//
// A failure that says the broker is unreachable (sink.Unavailable, or the
// relay's own stop) spends no attempt: the event is left untouched and its
// aggregate stops for this batch. So does every failure when nothing at all
// succeeded. process then returns the outage so the relay backs off as a
// whole; otherwise it returns nil. clean reports that every record was
// published and recorded, none of them after an earlier failure: nothing
// of the batch's partitions became claimable by the batch itself. retry,
// when positive, says the database failed to record the outcome: the
// caller waits that long before it claims again.
func (r *Relay) process(ctx context.Context, b outboxdriver.Batch, recs []outboxdriver.Record) (clean bool, retry time.Duration, outage error) {
	// The claim's transaction sits idle while the batch is published, and
	// the server ends it after one lease TTL: publishing must finish well
	// before. Messages without an answer by then count as an outage.
	pctx, cancel := context.WithTimeout(ctx, r.cfg.LeaseTTL/2)
	defer cancel()
	// The pauses are read again when due before anything is published: a
	// claim that waited (for a lock, or for a CPU) past a poll interval can
	// hold events committed after a pause that the read before the claim
	// could not see. Through the batch when it can: it holds a connection.
	r.pauses.refreshBefore(ctx, b)
	plan := newWaves(recs)
	tr := r.tracing.Tracer() // nil: tracing off, no span and no cost
	var ps *publishSpans
	if tr != nil {
		ps = r.publishSpans(pctx, tr, len(recs))
	}
	var (
		out       outboxdriver.Outcome
		failed    []failedEvent // of out.Failed[i]
		succeeded int
		permanent int
		n         = plan.aggregates()
		msgs      = make([]sink.Message, 0, n)
		pos       = make([]int, 0, n)
		dests     = make([]string, 0, n)
		wave      = make([]*aggregate, 0, n) // the aggregate of msgs[j]
		spans     []trace.Span               // the publish span of msgs[j], when tracing
	)
	for {
		msgs, pos, dests, wave, spans = msgs[:0], pos[:0], dests[:0], wave[:0], spans[:0]
		for _, a := range plan.next() {
			i := a.at()
			if r.pauses.typePaused(recs[i].AggregateType) {
				a.block() // paused: left untouched, its aggregate waits
				continue
			}
			m, err := r.message(&recs[i])
			if err != nil && r.pauses.destPausedRec(&recs[i], r.cfg.Router) {
				a.block() // its destination is paused: not checked, not dead-lettered
				continue
			}
			if err != nil {
				r.metrics.PublishFailed("", true)
				permanent++
				f := r.failure(&recs[i], err, true)
				fe := failedEvent{rec: i, at: time.Now(), class: DeadLetterInvalid}
				if tr != nil {
					fe.span = ps.start(&recs[i], nil)
				}
				out.Failed, failed = append(out.Failed, f), append(failed, fe)
				r.afterDeadLetter(a)
				continue
			}
			if r.pauses.destPaused(recs[i].AggregateType, m.Destination) {
				a.block()
				continue
			}
			if tr != nil {
				// A copy of its own, so that m stays on the stack while
				// tracing is off: not an allocation per event.
				tm := m
				spans = append(spans, ps.start(&recs[i], &tm))
				m = tm
			}
			msgs, pos, dests = append(msgs, m), append(pos, i), append(dests, m.Destination)
			wave = append(wave, a)
		}
		if len(msgs) == 0 {
			break
		}
		results := r.snk.Publish(pctx, msgs)
		now := time.Now()
		if len(results) != len(msgs) {
			err := fmt.Errorf("relay: the sink returned %d results for %d messages", len(results), len(msgs))
			for _, s := range spans {
				endPublish(s, OutcomeDeferred, err, now)
			}
			endFailed(out.Failed, failed, false)
			b.Release(ctx)
			return false, 0, err
		}
		for j, err := range results {
			rec, a := &recs[pos[j]], wave[j]
			var span trace.Span
			if tr != nil {
				span = spans[j]
			}
			if err == nil {
				out.Published = append(out.Published, rec.ID)
				r.metrics.Published(dests[j], now.Sub(rec.CreatedAt))
				succeeded++
				a.advance()
				if span != nil {
					endPublish(span, OutcomePublished, nil, now)
				}
				continue
			}
			perm := sink.IsPermanent(err)
			r.metrics.PublishFailed(dests[j], perm)
			if !perm && (sink.IsUnavailable(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
				outage = err
				a.block()
				if span != nil {
					endPublish(span, OutcomeDeferred, err, now)
				}
				continue
			}
			if perm {
				permanent++
			}
			f := r.failure(rec, err, perm)
			class := DeadLetterExhausted
			if perm {
				class = DeadLetterRefused
			}
			out.Failed, failed = append(out.Failed, f), append(failed, failedEvent{dest: dests[j], rec: pos[j], span: span, at: now, class: class})
			if f.DeadLetter {
				r.afterDeadLetter(a)
			} else {
				a.block()
			}
		}
	}
	recorded := true
	if succeeded == 0 && permanent == 0 && len(out.Failed) > 0 {
		outage = out.Failed[0].Err // nothing got through: the broker, not the events
		recorded = false
	}
	endFailed(out.Failed, failed, recorded)
	if !recorded {
		out.Failed = nil
	}
	if len(out.Published) == 0 && len(out.Failed) == 0 {
		b.Release(ctx)
		return false, 0, outage
	}
	r.stage(StagePublished, len(out.Published))
	for i, f := range out.Failed {
		rec, fe := &recs[failed[i].rec], failed[i]
		tid := traceAttr(rec, fe.span)
		if f.DeadLetter {
			r.log.Warn("relay: dead-lettering event", "event_id", rec.ID, "aggregatetype", rec.AggregateType, "aggregateid", rec.AggregateID,
				"partition", rec.Partition, "attempt", rec.Attempts+1, "destination", fe.dest, "class", fe.class, "hold_aggregate", f.Hold, "err", f.Err, tid)
		} else {
			r.log.Warn("relay: publish failed; will retry", "event_id", rec.ID, "aggregatetype", rec.AggregateType, "aggregateid", rec.AggregateID,
				"partition", rec.Partition, "attempt", rec.Attempts+1, "destination", fe.dest, "retry_in", f.RetryAfter, "err", f.Err, tid)
		}
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.FinishTimeout)
	defer cancel()
	if err := b.Finish(fctx, out); err != nil {
		// The broker has the events; they will be published again (same
		// ids) by whoever owns their partitions next.
		if errors.Is(err, outboxdriver.ErrLeaseLost) {
			r.log.Warn("relay: lease lost mid-batch; outcome refused, the new owner republishes", "events", len(recs), "err", err)
			return false, 0, outage
		}
		// Said once per outage; the outage's lines count the rest.
		level := slog.LevelError
		if r.db.Down() {
			level = slog.LevelDebug
		}
		r.log.Log(ctx, level, "relay: recording the outcome failed; acknowledged events will be republished", "events", len(out.Published), "err", err)
		return false, r.db.Fail("record outcome", err), outage
	}
	r.stage(StageRecorded, len(recs))
	for i, f := range out.Failed {
		if f.DeadLetter {
			r.metrics.DeadLettered(failed[i].dest)
			if c, ok := r.metrics.(DeadLetterClasses); ok {
				c.DeadLetteredAs(failed[i].dest, failed[i].class)
			}
		} else {
			r.metrics.Retried(failed[i].dest)
		}
	}
	clean = outage == nil && len(out.Published) == len(recs)
	for i := range recs {
		if recs[i].Attempts > 0 {
			// A retried event may have held its aggregate back: its later
			// events are claimable now, and no wake-up will say so.
			clean = false
			break
		}
	}
	return clean, 0, outage
}

// failedEvent is what process keeps about the event of out.Failed[i].
type failedEvent struct {
	dest  string          // its destination ("" when it could not be routed)
	rec   int             // its position in the batch
	span  trace.Span      // its publish span, when tracing
	at    time.Time       // when the broker answered
	class DeadLetterClass // why it is dead-lettered, if it is
}

// endFailed ends the publish spans of failed events: retried or
// dead-lettered when recorded, deferred when the batch met an outage
// instead.
func endFailed(fs []outboxdriver.Failure, failed []failedEvent, recorded bool) {
	for i, fe := range failed {
		if fe.span == nil {
			continue
		}
		outcome := OutcomeDeferred
		switch {
		case recorded && fs[i].DeadLetter:
			outcome = OutcomeDeadLettered
		case recorded:
			outcome = OutcomeRetried
		}
		endPublish(fe.span, outcome, fs[i].Err, fe.at)
	}
}

// failure turns a publish error into a retry or a dead letter.
func (r *Relay) failure(rec *outboxdriver.Record, err error, permanent bool) outboxdriver.Failure {
	attempt := rec.Attempts + 1
	f := outboxdriver.Failure{ID: rec.ID, Err: err}
	if permanent || attempt >= r.cfg.MaxAttempts {
		f.DeadLetter = true
		f.Hold = r.cfg.Poison == Hold
		return f
	}
	f.RetryAfter = backoff.Delay(attempt, r.cfg.RetryBase, r.cfg.RetryMax)
	return f
}

// afterDeadLetter applies the poison policy to the rest of the aggregate in
// this batch.
func (r *Relay) afterDeadLetter(a *aggregate) {
	if r.cfg.Poison == Hold {
		a.block()
		return
	}
	a.advance()
}
