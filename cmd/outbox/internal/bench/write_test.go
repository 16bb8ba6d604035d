package bench_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/cmd/outbox/internal/bench"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
)

// segments listens on channel and splits what it hears at every
// notification with a payload (the harness's fences): each segment counts
// the trigger's notifications (empty payload) between two of them.
type segments struct {
	mu     sync.Mutex
	counts []int64 // counts[k]: trigger notifications before the k-th fence, after the one before
	cur    int64
	stop   func() error
}

func listenSegments(t *testing.T, pool *pgxpool.Pool, channel string) *segments {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `LISTEN `+outboxdriver.QuoteIdent(channel)); err != nil {
		t.Fatal(err)
	}
	s := &segments{}
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		for {
			n, err := conn.WaitForNotification(lctx)
			if err != nil {
				done <- err
				return
			}
			s.mu.Lock()
			if n.Payload == "" {
				s.cur++
			} else {
				s.counts = append(s.counts, s.cur)
				s.cur = 0
			}
			s.mu.Unlock()
		}
	}()
	s.stop = sync.OnceValue(func() error {
		cancel()
		err := <-done
		conn.Close(ctx)
		if errors.Is(err, context.Canceled) {
			return nil
		}
		return err
	})
	t.Cleanup(func() { _ = s.stop() })
	return s
}

// end sends a last fence and waits until it is in, then returns the
// segments (the trailing one included).
func (s *segments) end(t *testing.T, pool *pgxpool.Pool, channel string) []int64 {
	t.Helper()
	ctx := context.Background()
	s.mu.Lock()
	before := len(s.counts)
	s.mu.Unlock()
	if _, err := pool.Exec(ctx, `SELECT pg_notify($1, 'test-end')`, channel); err != nil {
		t.Fatal(err)
	}
	var out []int64
	await.Eventually(t, 10*time.Second, func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.counts) <= before {
			return errors.New("the test's own LISTEN connection did not receive its end notification")
		}
		out = append([]int64(nil), s.counts...)
		return nil
	})
	return out
}

func TestWritePath(t *testing.T) {
	pool := testenv.Pool(t)
	ctx := context.Background()
	schema := testenv.Name("bench")
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+outboxdriver.QuoteIdent(schema)+` CASCADE`)
	})
	channel := outboxdriver.Table{Schema: schema, Name: "outbox"}.Channel()
	heard := listenSegments(t, pool, channel)

	var progress bytes.Buffer
	writers, rounds := []int{1, 2}, 2
	results, err := bench.WritePath(ctx, bench.Config{
		Pool:     pool,
		Schema:   schema,
		Duration: 400 * time.Millisecond,
		Warmup:   50 * time.Millisecond,
		Writers:  writers,
		Rounds:   rounds,
		Progress: &progress,
	})
	if err != nil {
		t.Fatal(err)
	}

	var gone bool
	if err := pool.QueryRow(ctx, `SELECT to_regnamespace($1) IS NULL`, schema).Scan(&gone); err != nil {
		t.Fatal(err)
	}
	if !gone {
		t.Errorf("schema %s still exists after the run", schema)
	}

	cases := []string{bench.CaseBaseline, bench.CaseRoundTrip, bench.CasePlainInsert, bench.CaseWatermillRow, bench.CaseOutbox, bench.CaseOutboxQueue, bench.CaseOutboxCommit, bench.CaseOutboxNotify, bench.CaseOutboxNoTrigger, bench.CaseOutbox10}
	events := map[string]int64{bench.CaseBaseline: 0, bench.CaseRoundTrip: 0, bench.CasePlainInsert: 0, bench.CaseWatermillRow: 0, bench.CaseOutbox: 1, bench.CaseOutboxQueue: 1, bench.CaseOutboxCommit: 1, bench.CaseOutboxNotify: 1, bench.CaseOutboxNoTrigger: 1, bench.CaseOutbox10: 10}
	if len(results) != len(writers)*len(cases) {
		t.Fatalf("%d results, want %d", len(results), len(writers)*len(cases))
	}
	if got := strings.Count(progress.String(), "\n"); got != len(results)*rounds {
		t.Errorf("%d progress lines, want %d:\n%s", got, len(results)*rounds, progress.String())
	}
	var waitSamples int64
	for _, r := range results {
		for _, n := range r.Waits {
			waitSamples += n
		}
		if _, err := os.Stat("/proc/stat"); err == nil && r.CPUBusy <= 0 {
			t.Errorf("%s at %d writers: no CPU time measured", r.Case, r.Workers)
		}
	}
	if waitSamples == 0 {
		t.Error("no wait event sampled in any cell")
	}
	var notifyCommits []int64 // per outbox_notify cell
	var writersWakes int64    // notifications of the outbox_no_trigger cells
	var noTriggerCells int64
	for i, r := range results {
		wantCase, wantWriters := cases[i%len(cases)], writers[i/len(cases)]
		if r.Case != wantCase || r.Workers != wantWriters || r.Scenario != "write" || r.Unit != "tx" {
			t.Fatalf("result %d is %s/%s at %d writers, want write/%s at %d", i, r.Scenario, r.Case, r.Workers, wantCase, wantWriters)
		}
		name := fmt.Sprintf("%s/%d writers", r.Case, r.Workers)
		if r.PerSecond <= 0 || r.Ops <= 0 {
			t.Errorf("%s: %v tx/s from %d transactions", name, r.PerSecond, r.Ops)
		}
		l := r.Latency
		if l.Count != r.Ops || l.P50 <= 0 || l.P50 > l.P99 || l.P99 > l.Max {
			t.Errorf("%s: latency %+v for %d transactions", name, l, r.Ops)
		}
		if r.VsBaseline == nil || r.VsBaseline.Case != bench.CaseBaseline || r.VsBaseline.Ratio <= 0 {
			t.Errorf("%s: comparison %+v", name, r.VsBaseline)
		} else if r.Case == bench.CaseBaseline && (r.VsBaseline.Ratio != 1 || r.VsBaseline.AddedP50 != 0) {
			t.Errorf("%s: baseline compared with itself: %+v", name, r.VsBaseline)
		}
		if len(r.RoundsPerSecond) != rounds || r.Env == nil {
			t.Errorf("%s: rounds %v, env %v", name, r.RoundsPerSecond, r.Env)
		}

		committed := r.Counters[bench.CounterCommitted]
		if committed < r.Ops {
			t.Errorf("%s: %d committed but %d measured", name, committed, r.Ops)
		}
		if got, want := r.Counters[bench.CounterOutboxRows], committed*events[r.Case]; got != want {
			t.Errorf("%s: %d outbox rows, want %d (%d transactions of %d events)", name, got, want, committed, events[r.Case])
		}
		if r.Case == bench.CaseBaseline && r.Counters[bench.CounterOutboxRows] != 0 {
			t.Errorf("%s: the baseline wrote outbox rows", name)
		}
		wantPlain := int64(0)
		if r.Case == bench.CasePlainInsert {
			wantPlain = committed
		}
		if got, ok := r.Counters[bench.CounterPlainRows]; !ok || got != wantPlain {
			t.Errorf("%s: %d plain rows (counted: %v), want %d", name, got, ok, wantPlain)
		}
		wantWatermill := int64(0)
		if r.Case == bench.CaseWatermillRow {
			wantWatermill = committed
		}
		if got, ok := r.Counters[bench.CounterWatermillRows]; !ok || got != wantWatermill {
			t.Errorf("%s: %d Watermill rows (counted: %v), want %d", name, got, ok, wantWatermill)
		}
		wantNotified := int64(0)
		if r.Case == bench.CaseOutboxNotify {
			wantNotified = committed
			notifyCommits = append(notifyCommits, committed)
		}
		got := r.Counters[bench.CounterNotifications]
		if r.Case == bench.CaseOutboxNoTrigger {
			// No trigger: the writers wake relays themselves whenever
			// their view of the registry is too old to rule one out
			// (at the start of a cell, say): at most one a commit.
			if got > committed {
				t.Errorf("%s: %d notifications for %d commits", name, got, committed)
			}
			writersWakes += got
			noTriggerCells++
			continue
		}
		if got != wantNotified {
			t.Errorf("%s: %d notifications counted by the harness, want %d", name, got, wantNotified)
		}
	}

	// Independently of the harness's own count: a second LISTEN connection
	// heard the trigger's notifications only while the outbox_notify cells
	// ran, one per committed transaction, and none in the other cells
	// (outbox in particular). The harness's fences split the rounds of the
	// cells apart, and every round commits something, so exactly one
	// segment per round of an outbox_notify cell is not empty.
	var nonzero, heardSum, wantSum int64
	for _, n := range heard.end(t, pool, channel) {
		if n != 0 {
			nonzero++
			heardSum += n
		}
	}
	for _, c := range notifyCommits {
		wantSum += c
	}
	if want := int64(rounds * len(notifyCommits)); nonzero < want || nonzero > want+int64(rounds)*noTriggerCells {
		t.Errorf("notifications heard in %d rounds of cells, want only in the %d rounds of outbox_notify cells (and in outbox_no_trigger's, %d)", nonzero, want, int64(rounds)*noTriggerCells)
	}
	if heardSum != wantSum+writersWakes {
		t.Errorf("heard %d notifications, want %d: one per transaction committed in the outbox_notify cells, and the %d the harness counted in outbox_no_trigger's", heardSum, wantSum+writersWakes, writersWakes)
	}
	if err := heard.stop(); err != nil {
		t.Errorf("test listener: %v", err)
	}

	var table bytes.Buffer
	if err := bench.WriteTable(&table, results); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"synchronous_commit=", "fsync=", "wal_level=", bench.CaseOutboxNotify, "tx/s"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	t.Logf("\n%s", table.String())
}

func TestWritePathPoolTooSmall(t *testing.T) {
	pool := testenv.Pool(t)
	n := int(pool.Config().MaxConns) + 1
	_, err := bench.WritePath(context.Background(), bench.Config{Pool: pool, Writers: []int{1, n}})
	if err == nil || !strings.Contains(err.Error(), "writers need one each") {
		t.Fatalf("WritePath with %d writers on a pool of %d: %v", n, n-1, err)
	}
}
