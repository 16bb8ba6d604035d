package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/internal/workload"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxsqlite"
)

// sqliteWorkload writes from this process, through the SQLite Writer,
// while the relay runs in another: each transaction bumps its aggregate's
// version in a business table and writes one event per version, so
// commit order per aggregate is version order; some roll back.
//
// The writers take turns in this process (turn) rather than in SQLite's
// busy handler, which is not a queue: a waiter sleeps between tries, and
// a writer that commits and begins again at once wins every race, so a
// waiter could starve for as long as the others kept writing and fail
// with SQLITE_BUSY on a slow machine. The relay's process still contends
// for the lock through the handler, as an application's would.
func sqliteWorkload(ctx context.Context, db *sql.DB, writers, txs, aggs int) (*workload.Result, error) {
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS aggregates (id TEXT PRIMARY KEY, version INTEGER NOT NULL)`); err != nil {
		return nil, err
	}
	ob, err := outbox.New(outboxsqlite.New(db), nil)
	if err != nil {
		return nil, err
	}
	res := &workload.Result{Versions: map[string]int{}, IDs: map[string]workload.Payload{}}
	var mu, turn sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 3))
			for range txs / writers {
				agg := fmt.Sprint("agg-", rng.IntN(aggs))
				err := func() error {
					turn.Lock()
					defer turn.Unlock()
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					defer tx.Rollback()
					var v int
					if err := tx.QueryRowContext(ctx, `INSERT INTO aggregates (id, version) VALUES (?, 1)
						ON CONFLICT (id) DO UPDATE SET version = version + 1 RETURNING version`, agg).Scan(&v); err != nil {
						return err
					}
					p := workload.Payload{Agg: agg, V: v}
					body, _ := json.Marshal(p)
					e := outbox.Event{ID: newEventID(rng), AggregateType: "order", AggregateID: agg, Type: "Bumped", Payload: body}
					if err := ob.WriteTx(ctx, tx, e); err != nil {
						return err
					}
					if rng.IntN(10) == 0 {
						mu.Lock()
						res.RolledBack++
						mu.Unlock()
						return tx.Rollback()
					}
					if err := tx.Commit(); err != nil {
						return err
					}
					mu.Lock()
					res.IDs[e.ID], res.Versions[agg] = p, v
					mu.Unlock()
					return nil
				}()
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return res, <-errs
}

func newEventID(rng *rand.Rand) string {
	return fmt.Sprintf("0190a0d0-%04x-7000-8000-%012x", rng.Uint32()&0xffff, rng.Uint64()&0xffffffffffff)
}

// sqliteStatus runs `outbox status --json` and decodes it.
func sqliteStatus(t *testing.T, flags []string) map[string]any {
	t.Helper()
	out, stderr, code := run(t, nil, append([]string{"status", "--json"}, flags...)...)
	if code != 0 {
		t.Fatalf("status: code %d: %s", code, stderr)
	}
	var st map[string]any
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --json printed %q: %v", out, err)
	}
	return st
}

// TestSQLiteEndToEnd is the newcomer's path on a database file: migrate
// twice, status --json, a relay process publishing to JetStream while
// this process writes (some transactions rolled back), then every
// committed event is in the stream in commit order per aggregate, the
// backlog is 0 and the dead-letter list is empty.
func TestSQLiteEndToEnd(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "app.db")
	flags := []string{"--db", "sqlite://" + path} // an absolute path: sqlite:///...
	out, stderr, code := run(t, nil, append([]string{"migrate"}, flags...)...)
	if code != 0 || !strings.Contains(out, "main.outbox") {
		t.Fatalf("first migrate: code %d out %q err %q", code, out, stderr)
	}
	out, stderr, code = run(t, nil, append([]string{"migrate"}, flags...)...)
	if code != 0 || !strings.Contains(out, "nothing to do") {
		t.Fatalf("second migrate: code %d out %q err %q", code, out, stderr)
	}
	st := sqliteStatus(t, flags)
	if st["backlog"] != 0.0 || st["dead_letters"] != 0.0 || st["schema"] != "main" {
		t.Fatalf("status of a fresh table: %v", st)
	}
	if parts, _ := st["partitions"].([]any); len(parts) != 64 {
		t.Fatalf("status lists %d partitions, want the default 64", len(parts))
	}

	stream, sinkFlags := natsTarget(t)
	startRelay(t, append(append([]string{}, flags...), append(sinkFlags, "--batch", "50")...)...)
	ctx := testenv.Context(t, 2*time.Minute)
	db, err := outboxsqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	res, err := sqliteWorkload(ctx, db, 3, 300, 20)
	if err != nil {
		t.Fatalf("a writer failed: %v", err)
	}
	testenv.WaitStreamMsgs(t, stream, uint64(res.Committed()), 60*time.Second)
	await.Eventually(t, 30*time.Second, func() error {
		st, err := outboxsqlite.New(db).Status(ctx, outboxdriver.Table{})
		if err != nil {
			t.Fatal(err)
		}
		if st.Backlog != 0 {
			return fmt.Errorf("backlog still %d", st.Backlog)
		}
		return nil
	})
	if _, err := workload.Check(res, natsDeliveries(t, stream)); err != nil {
		t.Fatal(err)
	}
	if st := sqliteStatus(t, flags); st["backlog"] != 0.0 {
		t.Fatalf("status after the relay caught up: %v", st)
	}
	out, stderr, code = run(t, nil, append([]string{"dlq", "list", "--json"}, flags...)...)
	if code != 0 || strings.TrimSpace(out) != "[]" {
		t.Fatalf("dlq list --json: code %d out %q err %q; want []", code, out, stderr)
	}
	t.Logf("%d committed, %d rolled back, all delivered in order from the SQLite file", res.Committed(), res.RolledBack)
}

// TestSQLiteErrors: a sqlite:// URL whose directory does not exist, or
// that names no file, fails with one clear line and creates nothing.
func TestSQLiteErrors(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "no", "such", "dir", "app.db")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate", "--db", "sqlite://" + missing}, "does not exist"},
		{[]string{"status", "--db", "sqlite://no-such-dir-here/app.db"}, "directory no-such-dir-here does not exist"},
		{[]string{"status", "--db", "sqlite://"}, "name the database file"},
		{[]string{"status", "--db", "sqlite://x.db?mode=ro"}, "file path only"},
		{[]string{"status", "--db", "sqlite://" + missing, "--table", `x"; DROP TABLE y; --`}, "not a valid identifier"},
	} {
		_, stderr, code := run(t, []string{"OUTBOX_DB="}, c.args...)
		line := strings.TrimRight(stderr, "\n")
		if code == 0 || strings.Contains(line, "\n") || !strings.HasPrefix(line, "outbox: ") || !strings.Contains(line, c.want) {
			t.Errorf("%v: code %d stderr %q; want one line starting with \"outbox: \" containing %q", c.args, code, stderr, c.want)
		}
	}
}
