package backoff

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// SummaryEvery is the longest an outage goes on without a log line: while
// calls keep failing, one summary line this often.
const SummaryEvery = 30 * time.Second

// Outage is the state of one dependency (a database, a broker) as every
// path of a process that calls it sees it, so that they log an outage once
// and back off alike. Each failed call is reported with Fail, each
// successful one with OK. It logs three kinds of line:
//
//   - Down, at the first failure: the operation that failed and its error.
//   - Still, at most every SummaryEvery while calls keep failing: how long
//     so far (down_for), how many calls failed (failures), the last
//     operation and error.
//   - Recovered, once a call succeeded and none failed for Settle
//     afterwards: how long the outage lasted (down_for: until the first
//     success of that quiet spell) and how many calls failed.
//
// An outage ends by a quiet spell rather than by one success: paths that
// answer from memory (log tailing's claims) or that fail for a reason of
// their own would otherwise end and start it again at every call. The end
// is logged Settle after the first success of the spell (a timer), or at a
// success after that, whichever comes first; End logs a pending one at
// once, and stops the timer, when the process stops.
//
// An Outage is safe for concurrent use. Its zero value is not: use
// NewOutage.
type Outage struct {
	cfg OutageConfig
	now func() time.Time

	down atomic.Bool // an outage is on: OK takes the lock

	mu       sync.Mutex
	since    time.Time // when the outage began
	failures int       // calls failed since
	lastOp   string
	lastErr  error
	reported time.Time // when the last down or still line was logged
	answered time.Time // the first success since the last failure; zero: none
	spell    int       // counts quiet spells begun: a timer of an older one does nothing
	timer    *time.Timer
}

// OutageConfig says what an Outage logs and how its callers back off.
type OutageConfig struct {
	// Log receives the lines.
	Log *slog.Logger
	// Level is the level of the down and still lines; the recovered line
	// is logged at warning level (or Level, if lower), so that it follows
	// the lines it closes wherever they are shown.
	Level slog.Level
	// Down, Still and Recovered are the messages of the three lines.
	Down, Still, Recovered string
	// Base and Max bound the delay Fail returns: Delay(failures, Base,
	// Max). Max is also the longest a failing path waits before it calls
	// again.
	Base, Max time.Duration
	// Settle is how long after a success no call may fail for the outage
	// to end. Zero means 2 * Max: every path that still fails has failed
	// again within it.
	Settle time.Duration
}

// NewOutage returns the tracker of one dependency's outages.
func NewOutage(cfg OutageConfig) *Outage {
	if cfg.Settle <= 0 {
		cfg.Settle = 2 * cfg.Max
	}
	return &Outage{cfg: cfg, now: time.Now}
}

// Fail records a failed call of op and returns how long the caller waits
// before it calls again: Delay of the failures so far in this outage, so
// that it grows to Max whichever path fails.
func (o *Outage) Fail(op string, err error) time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.now()
	o.endSpellLocked()
	o.lastOp, o.lastErr = op, err
	if !o.down.Load() {
		o.since, o.failures, o.reported = now, 1, now
		o.down.Store(true)
		o.cfg.Log.Log(context.Background(), o.cfg.Level, o.cfg.Down, "op", op, "err", err)
		return Delay(1, o.cfg.Base, o.cfg.Max)
	}
	o.failures++
	if now.Sub(o.reported) >= SummaryEvery {
		o.reported = now
		o.cfg.Log.Log(context.Background(), o.cfg.Level, o.cfg.Still, "down_for", now.Sub(o.since).Round(time.Millisecond),
			"failures", o.failures, "op", op, "err", err)
	}
	return Delay(o.failures, o.cfg.Base, o.cfg.Max)
}

// OK records a successful call. Outside an outage it costs an atomic load.
func (o *Outage) OK() {
	if !o.down.Load() {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.down.Load() {
		return
	}
	now := o.now()
	switch {
	case o.answered.IsZero():
		o.answered = now
		o.spell++
		spell := o.spell
		o.timer = time.AfterFunc(o.cfg.Settle, func() { o.settled(spell) })
	case now.Sub(o.answered) >= o.cfg.Settle:
		o.recoveredLocked()
	}
}

// settled ends the outage when the quiet spell spell lasted Settle.
func (o *Outage) settled(spell int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.down.Load() && o.spell == spell && !o.answered.IsZero() {
		o.recoveredLocked()
	}
}

// endSpellLocked ends the quiet spell, if any: a call failed, or the
// outage ended.
func (o *Outage) endSpellLocked() {
	o.answered = time.Time{}
	if o.timer != nil {
		o.timer.Stop()
		o.timer = nil
	}
}

// Down reports whether an outage is on.
func (o *Outage) Down() bool { return o.down.Load() }

// End logs the end of an outage whose quiet spell began but was not
// noticed yet (the process stops). An outage still failing stays unlogged:
// its last line says what it was.
func (o *Outage) End() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.down.Load() && !o.answered.IsZero() {
		o.recoveredLocked()
	}
	o.endSpellLocked()
}

func (o *Outage) recoveredLocked() {
	level := min(slog.LevelWarn, o.cfg.Level)
	o.cfg.Log.Log(context.Background(), level, o.cfg.Recovered, "down_for", o.answered.Sub(o.since).Round(time.Millisecond),
		"failures", o.failures)
	o.down.Store(false)
	o.endSpellLocked()
	o.failures = 0
}
