package cdc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxmysql"
	"github.com/outboxkit/outbox/outboxmysql/cdc"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/route"
	"github.com/outboxkit/outbox/sink/natssink"
)

// TestBinlogServerRestartUnderLoad kills a MariaDB server of the test's
// own (not the shared one) with SIGKILL while writers commit and a
// binlog relay publishes to NATS JetStream, and starts it again: the
// relay resumes by itself from its saved position, and every event whose
// commit returned is published, in commit order per aggregate, with
// nothing that was never committed. A commit cut off by the kill may have
// happened or not: such events may appear, or not.
func TestBinlogServerRestartUnderLoad(t *testing.T) {
	t.Parallel()
	m := testenv.StartPrivateMariaDB(t)
	db := m.DB("test")
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(20)
	ctx := testenv.Context(t, 5*time.Minute)
	tb := outboxdriver.Table{Schema: "test", Name: "outbox"}
	if _, err := outboxmysql.New(db).Migrate(ctx, tb, nil); err != nil {
		t.Fatal(err)
	}
	_, js := testenv.JetStream(t)
	stream, prefix := testenv.Stream(t, js)
	src, err := cdc.NewSource(db, tb, &cdc.Config{DSN: m.Config("test").FormatDSN(), SaveInterval: 100 * time.Millisecond,
		SourceConfig: outboxdriver.SourceConfig{Logger: slog.New(slog.NewTextHandler(testLog{t}, nil))}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	snk, err := natssink.New(js, &natssink.Config{Stream: prefix, Subjects: []string{prefix + ".>"}})
	if err != nil {
		t.Fatal(err)
	}
	router, err := route.New(&route.Config{Replacement: prefix + ".${routedByValue}"})
	if err != nil {
		t.Fatal(err)
	}
	rl, err := relay.New(src, snk, &relay.Config{Router: router, LeaseTTL: 2 * time.Second, PollInterval: 100 * time.Millisecond,
		RetryBase: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(testLog{t}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := rl.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		rl.Stop(stopCtx)
	})

	// Writers: aggregate w's events carry n = 0, 1, 2... in commit order
	// (one writer per aggregate). A failed commit is in doubt; a failed
	// statement before it rolls back, and the writer tries n again.
	ob, err := outbox.New(outboxmysql.New(db), &outbox.Config{Schema: tb.Schema, Table: tb.Name})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	committed, inDoubt := map[string]bool{}, map[string]bool{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			n := 0
			for {
				select {
				case <-stop:
					return
				default:
				}
				e := ev(fmt.Sprint("w", w), n)
				e.ID = fmt.Sprintf("00000000-0000-4000-8000-%04d%08d", w, n)
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					time.Sleep(50 * time.Millisecond)
					continue
				}
				if err := ob.WriteTx(ctx, tx, e); err != nil {
					tx.Rollback()
					time.Sleep(50 * time.Millisecond)
					continue
				}
				err = tx.Commit()
				mu.Lock()
				if err == nil {
					committed[e.ID] = true
				} else {
					inDoubt[e.ID] = true
				}
				mu.Unlock()
				n++ // an in-doubt n is not written again: its successor follows it
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(committed)
	}
	testenv.WaitStreamMsgs(t, stream, 100, 90*time.Second)
	m.Kill()
	t.Logf("killed the server after %d commits", count())
	m.Start()
	before := count()
	await.Eventually(t, 90*time.Second, func() error {
		if n := count(); n < before+100 {
			return fmt.Errorf("%d commits since the restart, want 100", n-before)
		}
		return nil
	})
	close(stop)
	wg.Wait()
	testenv.WaitStreamMsgs(t, stream, uint64(count()), 120*time.Second)

	seen := map[string]bool{}
	last := map[string]int{}
	for _, msg := range testenv.StreamMessages(t, stream) {
		id := msg.Header.Get("id")
		if !committed[id] && !inDoubt[id] {
			t.Fatalf("published %s, which never committed", id)
		}
		if seen[id] {
			continue // a copy (duplicates only after faults)
		}
		seen[id] = true
		var p struct{ N int }
		if err := json.Unmarshal(msg.Data, &p); err != nil {
			t.Fatal(err)
		}
		agg := string(msg.Header.Get(natssink.KeyHeader))
		if prev, ok := last[agg]; ok && p.N <= prev {
			t.Fatalf("aggregate %s: event %d after %d", agg, p.N, prev)
		}
		last[agg] = p.N
	}
	for id := range committed {
		if !seen[id] {
			t.Fatalf("event %s committed and never published (%d of %d committed seen)", id, len(seen), len(committed))
		}
	}
	t.Logf("%d committed, %d in doubt, %d distinct published", len(committed), len(inDoubt), len(seen))
}
