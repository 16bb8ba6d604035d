package relayd

import (
	"log/slog"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/relay"
)

// The controller narrows the process to one P, widens it to the default on
// a full batch, stays wide while short batches follow closely, and narrows
// again once batches have come back short for narrowAfter. Not parallel:
// it sets the test process's GOMAXPROCS.
func TestProcsFollowTheLoad(t *testing.T) {
	testenv.NeedProcsChoice(t)
	orig := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(orig) })
	runtime.SetDefaultGOMAXPROCS()
	def := runtime.GOMAXPROCS(0)

	p := newProcs(10, slog.New(slog.DiscardHandler))
	var stages []relay.Stage
	onStage := p.onStage(func(s relay.Stage, _ int) { stages = append(stages, s) })
	check := func(when string, want int) {
		t.Helper()
		if got := runtime.GOMAXPROCS(0); got != want {
			t.Fatalf("%s: GOMAXPROCS %d, want %d", when, got, want)
		}
	}
	check("at start", 1)
	onStage(relay.StageClaimed, 3)
	check("after a short batch", 1)
	onStage(relay.StageClaimed, 10)
	check("after a full batch", def)
	onStage(relay.StageRecorded, 10)
	onStage(relay.StageClaimed, 3)
	check("after a short batch right after a full one", def)
	p.lastFull = time.Now().Add(-narrowAfter)
	onStage(relay.StageClaimed, 3)
	check("after short batches for "+narrowAfter.String(), 1)
	if len(stages) != 5 {
		t.Fatalf("the wrapped OnStage saw %v, want all 5 stages", stages)
	}

	t.Setenv("GOMAXPROCS", strconv.Itoa(def))
	runtime.GOMAXPROCS(def)
	if p := newProcs(10, slog.New(slog.DiscardHandler)); p != nil {
		t.Fatal("GOMAXPROCS set in the environment, and the relay adapts it anyway")
	}
	check("with GOMAXPROCS in the environment", def)
}
