package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/relay"
)

// needProcsChoice fails the test where the relay's choice of GOMAXPROCS
// cannot be seen: GOMAXPROCS set in the environment, or one CPU.
func needProcsChoice(t *testing.T) {
	t.Helper()
	if _, set := os.LookupEnv("GOMAXPROCS"); set {
		t.Fatal("GOMAXPROCS is set in the environment: unset it, this test checks the relay's own choice")
	}
	n := runtime.NumCPU()
	if n < 2 {
		t.Fatalf("%d CPU: one P is the default here, so the relay's narrowing cannot be seen; run on at least 2 CPUs", n)
	}
}

// The controller narrows the process to one P, widens it to the default on
// a full batch, stays wide while short batches follow closely, and narrows
// again once batches have come back short for narrowAfter. Not parallel:
// it sets the test process's GOMAXPROCS.
func TestProcsFollowTheLoad(t *testing.T) {
	needProcsChoice(t)
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

// The relay process runs on one P while idle, on more while it works off a
// backlog, and on one again once the backlog is gone, as its Go metrics
// show.
func TestRelayProcessUsesEveryCPUOnlyForABacklog(t *testing.T) {
	t.Parallel()
	needProcsChoice(t)
	tb, flags := migrated(t)
	addr := freeAddr(t)
	startRelay(t, append(flags, "--sink", "stdout:", "--metrics-addr", addr, "--batch", "100")...)
	// procs reads the metric; 0 until the metrics server answers.
	procs := func() int {
		t.Helper()
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return 0
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return 0
		}
		for _, line := range strings.Split(string(body), "\n") {
			if v, ok := strings.CutPrefix(line, "go_sched_gomaxprocs_threads "); ok {
				n, err := strconv.Atoi(v)
				if err != nil {
					t.Fatalf("metric line %q: %v", line, err)
				}
				return n
			}
		}
		t.Fatal("/metrics lacks go_sched_gomaxprocs_threads")
		return 0
	}
	waitProcs := func(when string, ok func(int) bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			n := procs()
			if ok(n) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: GOMAXPROCS still %d after 20s", when, n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitProcs("idle", func(n int) bool { return n == 1 })
	pool := testenv.Pool(t)
	insert := func(n int) {
		t.Helper()
		if _, err := pool.Exec(context.Background(), `INSERT INTO `+tb.Qualified("")+` (id, aggregatetype, aggregateid, type, payload)
SELECT gen_random_uuid(), 'order', (i % 100)::text, 'Placed', '{}' FROM generate_series(1, $1) AS i`, n); err != nil {
			t.Fatal(err)
		}
	}
	insert(50_000)
	waitProcs("a backlog of 50000 events", func(n int) bool { return n > 1 })
	waitBacklogZero(t, tb, 60*time.Second)
	time.Sleep(narrowAfter)
	insert(1)
	waitProcs("a short batch after the backlog", func(n int) bool { return n == 1 })
	waitBacklogZero(t, tb, 20*time.Second)
}
