package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
)

// The relay process runs on one P while idle, on more while it works off a
// backlog, and on one again once the backlog is gone, as its Go metrics
// show.
func TestRelayProcessUsesEveryCPUOnlyForABacklog(t *testing.T) {
	t.Parallel()
	testenv.NeedProcsChoice(t)
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
		await.Eventually(t, 20*time.Second, func() error {
			if n := procs(); !ok(n) {
				return fmt.Errorf("%s: GOMAXPROCS still %d", when, n)
			}
			return nil
		})
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
	time.Sleep(time.Second) // the relay narrows once batches have been short this long
	insert(1)
	waitProcs("a short batch after the backlog", func(n int) bool { return n == 1 })
	waitBacklogZero(t, tb, 20*time.Second)
}
