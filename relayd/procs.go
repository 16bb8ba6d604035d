package relayd

import (
	"log/slog"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/outboxkit/outbox/relay"
)

// narrowAfter is how long batches must come back short before the relay
// process goes back to one P.
const narrowAfter = time.Second

// procs fits the process's GOMAXPROCS to the relay's load
// (Options.OneCPUWhileIdle). While batches come
// back short the relay is a chain of round trips (claim, publish, record),
// and every hand-off between its goroutines (the relay's, the broker
// client's reader and flusher) would wake a second OS thread to run the
// woken goroutine on the idle P and put it back to sleep afterwards, a
// sizeable share of the relay's CPU at light load
// (docs/benchmarks.md#latency).
// With one P the
// woken goroutine runs on the same thread once the current one blocks. A
// full batch means a backlog, which the lanes work off in parallel: then
// the process gets the runtime's default back (all CPUs, or the
// container's CPU limit), and keeps it until batches have come back short
// for narrowAfter.
//
// It changes nothing when GOMAXPROCS is set in the environment.
type procs struct {
	batch int
	log   *slog.Logger

	mu       sync.Mutex
	wide     bool
	lastFull time.Time
}

// newProcs returns nil when GOMAXPROCS is set in the environment;
// otherwise it narrows the process to one P and returns the controller.
func newProcs(batch int, log *slog.Logger) *procs {
	if _, set := os.LookupEnv("GOMAXPROCS"); set {
		return nil
	}
	runtime.GOMAXPROCS(1)
	return &procs{batch: batch, log: log}
}

// claimed notes a claimed batch of n events.
func (p *procs) claimed(n int) {
	if p == nil {
		return
	}
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case n >= p.batch:
		p.lastFull = now
		if !p.wide {
			p.wide = true
			runtime.SetDefaultGOMAXPROCS()
			p.log.Debug("relay: a backlog; running on every CPU", "gomaxprocs", runtime.GOMAXPROCS(0))
		}
	case p.wide && now.Sub(p.lastFull) >= narrowAfter:
		p.wide = false
		runtime.GOMAXPROCS(1)
		p.log.Debug("relay: batches come back short; running on one CPU")
	}
}

// onStage wraps next (which may be nil) to feed claimed batches to p.
func (p *procs) onStage(next func(relay.Stage, int)) func(relay.Stage, int) {
	if p == nil {
		return next
	}
	return func(s relay.Stage, n int) {
		if s == relay.StageClaimed {
			p.claimed(n)
		}
		if next != nil {
			next(s, n)
		}
	}
}
