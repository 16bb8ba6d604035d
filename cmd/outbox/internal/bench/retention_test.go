package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/outboxkit/outbox/cmd/outbox/internal/bench"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
)

func TestRetentionModes(t *testing.T) {
	pool := testenv.Pool(t)
	ctx := context.Background()
	schema := testenv.Name("bench")
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+outboxdriver.QuoteIdent(schema)+` CASCADE`)
	})

	// 2000 events in batches of 300: six full batches and one of 200; the
	// cleanup deletes 1000, 1000, then finds none.
	const events, batch, rounds = 2000, 300, 2
	const batchesPerDrain = (events + batch - 1) / batch
	const cleanupCalls = events/bench.CleanupLimit + 1
	var progress bytes.Buffer
	results, err := bench.RetentionModes(ctx, bench.Config{
		Pool: pool, Schema: schema, Events: events, Batch: batch, Rounds: rounds, Progress: &progress,
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
	modes := []string{bench.ModeDelete, bench.ModeKeep, bench.ModePartitions, bench.ModeKeepLongTx, bench.ModePartitionsLongTx}
	if got := strings.Count(progress.String(), "\n"); got != len(modes)*rounds {
		t.Errorf("%d progress lines, want %d:\n%s", got, len(modes)*rounds, progress.String())
	}
	var cases []string
	for _, r := range results {
		cases = append(cases, r.Case)
	}
	if !reflect.DeepEqual(cases, modes) {
		t.Fatalf("cases %v, want %v", cases, modes)
	}

	for _, r := range results {
		name := r.Case
		if r.Scenario != "retention" || r.Unit != "event" || r.Workers != 1 || r.Env == nil || r.Env.Events != events || r.Env.Batch != batch {
			t.Errorf("%s: scenario %s, unit %s, workers %d, env %+v", name, r.Scenario, r.Unit, r.Workers, r.Env)
		}
		// Every event drained once, in every round.
		if r.Ops != events*rounds || r.Counters[bench.CounterDrained] != events*rounds || r.Counters[bench.CounterBatches] != batchesPerDrain*rounds {
			t.Errorf("%s: %d ops, counters %v; want %d events in %d batches", name, r.Ops, r.Counters, events*rounds, batchesPerDrain*rounds)
		}
		if got := r.Counters[bench.CounterUnpublishedAfterDrain]; got != 0 {
			t.Errorf("%s: %d rows left unpublished after the drains", name, got)
		}
		if r.PerSecond <= 0 || r.Seconds <= 0 || len(r.RoundsPerSecond) != rounds {
			t.Errorf("%s: %v events/s over %vs, rounds %v", name, r.PerSecond, r.Seconds, r.RoundsPerSecond)
		}
		for _, v := range r.RoundsPerSecond {
			if v <= 0 {
				t.Errorf("%s: a round at %v events/s", name, v)
			}
		}
		if l := r.Latency; l.Count != batchesPerDrain*rounds || l.P50 <= 0 || l.P50 > l.P99 || l.P99 > l.Max {
			t.Errorf("%s: batch latency %+v", name, l)
		}
		if c := r.VsBaseline; c == nil || c.Case != bench.ModeDelete || c.Ratio <= 0 || len(c.RoundRatios) != rounds {
			t.Errorf("%s: comparison %+v", name, c)
		} else if r.Case == bench.ModeDelete && c.Ratio != 1 {
			t.Errorf("delete compared with itself: %+v", c)
		}

		f := r.Retention
		if f == nil || f.Mode != r.Case || f.Partitions <= 0 || len(f.Rounds) != rounds {
			t.Fatalf("%s: figures %+v", name, f)
		}
		for i, rr := range append([]bench.RetentionRound{f.RetentionRound}, f.Rounds...) {
			which := "median"
			if i > 0 {
				which = "round " + string(rune('0'+i))
			}
			if rr.Events != events || rr.Batches != batchesPerDrain || rr.DrainSeconds <= 0 || rr.PerSecond <= 0 || rr.FillSeconds <= 0 ||
				rr.FilledBytes <= 0 || rr.BytesAfterDrain <= 0 || rr.DeadTuplesAfterDrain <= 0 {
				t.Errorf("%s, %s: drain figures %+v", name, which, rr)
			}
			switch r.Case {
			case bench.ModeDelete:
				// The outbox is empty after the drain; there is nothing to
				// clean up.
				if rr.LiveTuplesAfterDrain != 0 || rr.CleanupRows != 0 || rr.CleanupCalls != 0 || rr.BytesAfterCleanup != 0 {
					t.Errorf("%s, %s: %+v", name, which, rr)
				}
			case bench.ModeKeep, bench.ModeKeepLongTx:
				// Every row published and kept, then every row cleaned up
				// in batches.
				if rr.LiveTuplesAfterDrain != events || rr.CleanupRows != events || rr.CleanupCalls != cleanupCalls ||
					rr.CleanupSeconds <= 0 || rr.CleanupPerSecond <= 0 || rr.BytesAfterCleanup <= 0 || rr.DeadTuplesAfterCleanup <= 0 {
					t.Errorf("%s, %s: cleanup figures %+v", name, which, rr)
				}
				// Under the scenario's long transaction VACUUM removes
				// none of the dead rows. Without it, how many it removes
				// depends on every other session of the server (a test
				// running beside this one may hold a snapshot too): it
				// leaves no more than there were.
				switch {
				case r.Case == bench.ModeKeepLongTx && (rr.DeadTuplesAfterVacuum < events || rr.BytesAfterVacuum < rr.BytesAfterCleanup),
					rr.DeadTuplesAfterVacuum > rr.DeadTuplesAfterCleanup:
					t.Errorf("%s, %s: after VACUUM %d dead tuples of %d, %d of %d bytes", name, which,
						rr.DeadTuplesAfterVacuum, rr.DeadTuplesAfterCleanup, rr.BytesAfterVacuum, rr.BytesAfterCleanup)
				}
			case bench.ModePartitions, bench.ModePartitionsLongTx:
				// Every row published and kept in its hour's partition,
				// then the day dropped in one call, long transaction or not.
				if rr.LiveTuplesAfterDrain != events || rr.CleanupRows != events || rr.CleanupCalls != 1 || rr.PartitionsDropped < bench.PartitionHours ||
					rr.DeadTuplesAfterCleanup != 0 || rr.BytesAfterCleanup >= rr.BytesAfterDrain/10 || rr.DeadTuplesAfterVacuum != 0 {
					t.Errorf("%s, %s: cleanup figures %+v", name, which, rr)
				}
			}
		}
	}
	del, keep := results[0].Counters, results[1].Counters
	if del[bench.CounterRowsAfterDrain] != 0 {
		t.Errorf("delete left %d rows after its drains", del[bench.CounterRowsAfterDrain])
	}
	if _, ok := del[bench.CounterCleaned]; ok {
		t.Errorf("delete counted a cleanup: %v", del)
	}
	if keep[bench.CounterRowsAfterDrain] != events*rounds || keep[bench.CounterCleaned] != events*rounds || keep[bench.CounterRowsAfterCleanup] != 0 {
		t.Errorf("keep counters %v: want every row kept after the drains, then all cleaned up", keep)
	}

	var table bytes.Buffer
	if err := bench.WriteTable(&table, results); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"scenario retention", "batches of 300", "2 rounds", "autovacuum=", "events/s", "vs delete", "cleanup rows/s",
		"dead after drain", "vacuumed MiB", "delete  ", "keep    ", "partitions-longtx", "RetentionKeep"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	t.Logf("\n%s", table.String())

	var js bytes.Buffer
	if err := bench.WriteJSON(&js, results); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(js.String()), "\n")
	if len(lines) != len(modes) || !strings.Contains(lines[1], `"retention":{"mode":"keep"`) || !strings.Contains(lines[1], `"cleanup_per_second":`) {
		t.Fatalf("JSON:\n%s", js.String())
	}
	var back bench.Result
	if err := json.Unmarshal([]byte(lines[1]), &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.Retention, results[1].Retention) {
		t.Errorf("round trip: %+v, want %+v", back.Retention, results[1].Retention)
	}
}

func TestRetentionModesConfig(t *testing.T) {
	pool := testenv.Pool(t)
	for _, c := range []struct {
		cfg  bench.Config
		want string
	}{
		{bench.Config{Events: -1}, "events -1"},
		{bench.Config{Events: bench.MaxEvents + 1}, "events"},
		{bench.Config{Batch: bench.MaxBatch + 1}, "batch"},
		{bench.Config{Rounds: -1}, "rounds -1"},
	} {
		c.cfg.Pool = pool
		if _, err := bench.RetentionModes(context.Background(), c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("RetentionModes(%+v): %v, want an error about %s", c.cfg, err, c.want)
		}
	}
}
