package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/sink"
)

func (r *Relay) loop(ctx, pubCtx context.Context) {
	var (
		wait           = minWait
		idle           bool
		idleSince      time.Time
		failures       int // consecutive claims that failed (database)
		brokerFailures int // consecutive batches that met a broker outage
	)
	w, ok := r.src.(outboxdriver.Waker)
	wakes := ok && w.WakesOnCommit()
	// flow is a moving average of the events per claim of this loop
	// (empty claims count as 0); steady says the relay left the wake-up
	// registry because of it, not because of a backlog.
	var (
		flow   float64
		steady bool
	)
	// register (re)registers the relay for wake-ups for three poll
	// intervals; it is renewed after one.
	register := func() {
		if err := r.src.SetIdle(ctx, 3*r.cfg.PollInterval); err != nil && ctx.Err() == nil {
			r.log.Warn("relay: cannot register for wake-ups; polling", "err", err)
		}
		idle, idleSince = true, time.Now()
	}
	for ctx.Err() == nil {
		leases := r.leases.snapshot()
		if len(leases) == 0 {
			r.waitForWork(ctx, r.cfg.PollInterval)
			continue
		}
		r.leases.inFlight.RLock()
		claimed := time.Now()
		b, err := r.src.Claim(ctx, leases, r.cfg.BatchSize)
		if err != nil {
			r.leases.inFlight.RUnlock()
			if ctx.Err() != nil {
				return
			}
			failures++
			d := backoff(failures, breakerBase, breakerMax)
			r.log.Error("relay: claim failed; retrying", "err", err, "retry_in", d)
			sleep(ctx, d)
			continue
		}
		failures = 0 // the database answered; a broker outage counts anew below
		recs := b.Records()
		r.metrics.Claimed(len(recs))
		flow = flow*(1-flowWeight) + float64(len(recs))*flowWeight
		if len(recs) == 0 {
			b.Release(ctx)
			r.leases.inFlight.RUnlock()
			if steady && flow >= rejoinFlow && wait <= maxSteadyWait {
				// Out of the registry while events come fast: a gap is
				// likely short, so look again soon rather than rejoin.
				r.waitForWork(ctx, wait)
				wait *= 2
				continue
			}
			steady = false
			if !idle || time.Since(idleSince) > r.cfg.PollInterval {
				// Register as idle (writers then send a wake-up), then look
				// once more: a row committed before the registration sent
				// no wake-up.
				register()
				continue
			}
			if wakes {
				// A commit wakes the wait: no need to look again sooner
				// than the poll interval.
				wait = r.cfg.PollInterval
			}
			r.waitForWork(ctx, wait)
			wait = min(wait*2, r.cfg.PollInterval)
			continue
		}
		r.stage(StageClaimed, len(recs))
		wait = minWait
		// Stay registered for wake-ups while batches come back short and
		// few: leaving and rejoining would cost two round trips a
		// wake-up. A full batch means a backlog, and claims that keep
		// finding several events mean a flow the relay keeps up with by
		// claiming back to back: leave, so that the writers are spared
		// the NOTIFY (which makes every notifying commit in the cluster
		// wait for the one before it).
		if idle && (len(recs) == r.cfg.BatchSize || (wakes && flow >= leaveFlow)) {
			idle, steady = false, len(recs) < r.cfg.BatchSize
			if err := r.src.SetIdle(ctx, 0); err != nil && ctx.Err() == nil {
				r.log.Warn("relay: cannot leave idle state", "err", err)
			}
		}
		clean, outage := r.process(pubCtx, b, recs)
		r.leases.inFlight.RUnlock()
		if outage == nil && len(recs) == r.cfg.BatchSize && r.cfg.Lanes > 1 {
			// A backlog: work it off in lanes.
			outage = r.lanes(ctx, pubCtx)
		}
		if clean && idle && len(recs) < r.cfg.BatchSize && wakes {
			// Caught up as of the claim, and still registered for
			// wake-ups: whatever committed since has sent one, so wait
			// for it rather than spend a claim on finding nothing.
			if time.Since(idleSince) > r.cfg.PollInterval {
				register()
				continue // look once more: the registration had lapsed
			}
			brokerFailures = 0
			r.linger(ctx, claimed)
			r.waitForWork(ctx, r.cfg.PollInterval)
			continue
		}
		if outage == nil {
			brokerFailures = 0
			if steady && len(recs) < r.cfg.BatchSize {
				r.linger(ctx, claimed)
			}
			continue
		}
		brokerFailures++
		d := backoff(brokerFailures, breakerBase, breakerMax)
		r.log.Warn("relay: the broker is unreachable; backing off without spending attempts", "retry_in", d, "err", outage)
		sleep(ctx, d)
	}
}

// linger waits until Config.Linger has passed since claimed, so that a
// few more events gather: fewer, fuller batches.
func (r *Relay) linger(ctx context.Context, claimed time.Time) {
	if d := r.cfg.Linger - time.Since(claimed); d > 0 {
		sleep(ctx, d)
	}
}

// lanes works off a backlog: Config.Lanes goroutines each claim, publish
// and record batches of their own disjoint share of the leased partitions
// until a claim of theirs comes back short of a full batch. It returns
// when every lane has stopped, with the first broker outage a lane met.
// A lane whose claim fails stops too; the main loop's next claim meets
// the failure and backs off.
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
				if len(leases) == 0 {
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
				_, out := r.process(pubCtx, b, recs)
				r.leases.inFlight.RUnlock()
				if out != nil {
					mu.Lock()
					if outage == nil {
						outage = out
					}
					mu.Unlock()
					return
				}
				if len(recs) < r.cfg.BatchSize {
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
	r.leases.setWake(nil)
	cancel()
	if err != nil && wctx.Err() == nil {
		r.log.Warn("relay: waiting for wake-up failed; polling", "err", err)
		sleep(ctx, d)
	}
}

// aggregate tracks one aggregate's events within a batch.
type aggregate struct {
	idx     []int // positions in the batch, in seq order
	next    int   // the next position to publish
	blocked bool  // a failure stops the rest of the aggregate in this batch
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
// of the batch's partitions became claimable by the batch itself.
func (r *Relay) process(ctx context.Context, b outboxdriver.Batch, recs []outboxdriver.Record) (clean bool, outage error) {
	// The claim's transaction sits idle while the batch is published, and
	// the server ends it after one lease TTL: publishing must finish well
	// before. Messages without an answer by then count as an outage.
	pctx, cancel := context.WithTimeout(ctx, r.cfg.LeaseTTL/2)
	defer cancel()
	aggs := map[[2]string]*aggregate{}
	order := make([]*aggregate, 0, len(recs))
	for i := range recs {
		k := [2]string{recs[i].AggregateType, recs[i].AggregateID}
		a := aggs[k]
		if a == nil {
			a = &aggregate{}
			aggs[k] = a
			order = append(order, a)
		}
		a.idx = append(a.idx, i)
	}
	var (
		out        outboxdriver.Outcome
		failedDest []string // destination of out.Failed[i]
		succeeded  int
		permanent  int
		msgs       = make([]sink.Message, 0, len(order))
		pos        = make([]int, 0, len(order))
		dests      = make([]string, 0, len(order))
	)
	for {
		msgs, pos, dests = msgs[:0], pos[:0], dests[:0]
		var wave []*aggregate
		for _, a := range order {
			if a.blocked || a.next >= len(a.idx) {
				continue
			}
			i := a.idx[a.next]
			m, err := r.cfg.Router.Message(&recs[i])
			if err != nil {
				r.metrics.PublishFailed("", true)
				permanent++
				f := r.failure(&recs[i], err, true)
				out.Failed, failedDest = append(out.Failed, f), append(failedDest, "")
				r.afterDeadLetter(a)
				continue
			}
			msgs, pos, dests = append(msgs, m), append(pos, i), append(dests, m.Destination)
			wave = append(wave, a)
		}
		if len(msgs) == 0 {
			break
		}
		results := r.snk.Publish(pctx, msgs)
		if len(results) != len(msgs) {
			b.Release(ctx)
			return false, fmt.Errorf("relay: the sink returned %d results for %d messages", len(results), len(msgs))
		}
		now := time.Now()
		for j, err := range results {
			rec, a := &recs[pos[j]], wave[j]
			if err == nil {
				out.Published = append(out.Published, rec.ID)
				r.metrics.Published(dests[j], now.Sub(rec.CreatedAt))
				succeeded++
				a.next++
				continue
			}
			perm := sink.IsPermanent(err)
			r.metrics.PublishFailed(dests[j], perm)
			if !perm && (sink.IsUnavailable(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
				outage = err
				a.blocked = true
				continue
			}
			if perm {
				permanent++
			}
			f := r.failure(rec, err, perm)
			out.Failed, failedDest = append(out.Failed, f), append(failedDest, dests[j])
			if f.DeadLetter {
				r.afterDeadLetter(a)
			} else {
				a.blocked = true
			}
		}
	}
	if succeeded == 0 && permanent == 0 && len(out.Failed) > 0 {
		outage = out.Failed[0].Err // nothing got through: the broker, not the events
		out.Failed = nil
	}
	if len(out.Published) == 0 && len(out.Failed) == 0 {
		b.Release(ctx)
		return false, outage
	}
	r.stage(StagePublished, len(out.Published))
	for _, f := range out.Failed {
		if f.DeadLetter {
			r.log.Warn("relay: dead-lettering event", "id", f.ID, "hold_aggregate", f.Hold, "err", f.Err)
		} else {
			r.log.Warn("relay: publish failed; will retry", "id", f.ID, "retry_in", f.RetryAfter, "err", f.Err)
		}
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.FinishTimeout)
	defer cancel()
	if err := b.Finish(fctx, out); err != nil {
		// The broker has the events; they will be published again (same
		// ids) by whoever owns their partitions next.
		if errors.Is(err, outboxdriver.ErrLeaseLost) {
			r.log.Warn("relay: lease lost mid-batch; outcome refused, the new owner republishes", "events", len(recs), "err", err)
		} else {
			r.log.Error("relay: recording the outcome failed; acknowledged events will be republished", "events", len(out.Published), "err", err)
		}
		return false, outage
	}
	r.stage(StageRecorded, len(recs))
	for i, f := range out.Failed {
		if f.DeadLetter {
			r.metrics.DeadLettered(failedDest[i])
		} else {
			r.metrics.Retried(failedDest[i])
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
	return clean, outage
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
	f.RetryAfter = backoff(attempt, r.cfg.RetryBase, r.cfg.RetryMax)
	return f
}

// afterDeadLetter applies the poison policy to the rest of the aggregate in
// this batch.
func (r *Relay) afterDeadLetter(a *aggregate) {
	if r.cfg.Poison == Hold {
		a.blocked = true
		return
	}
	a.next++
}
