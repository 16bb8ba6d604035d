package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxmysql"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxsqlite"
)

// startConsoleProcess starts `outbox console args...` as a process of its own,
// killed when the test ends, and returns it with the base URL it serves.
func startConsoleProcess(t *testing.T, args ...string) (*relayProc, string) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"console"}, args...)...)
	p := &relayProc{cmd: cmd, stderr: &testenv.Buffer{}, done: make(chan error, 1)}
	cmd.Stdout = io.Discard
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("console stderr:\n%s", p.stderr.String())
		}
	})
	listening := regexp.MustCompile(`on (http://127\.0\.0\.1:\d+)`)
	var base string
	await.Eventually(t, 30*time.Second, func() error {
		if m := listening.FindStringSubmatch(p.stderr.String()); m != nil {
			base = m[1]
			return nil
		}
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("console ended before listening: %v; stderr %q", err, p.stderr.String())
		default:
		}
		return fmt.Errorf("console not listening; stderr %q", p.stderr.String())
	})
	return p, base
}

// consoleCall sends one API call with a bearer token and decodes the
// answer into out (when not nil); it fails t unless the status is want.
func consoleCall(t *testing.T, base, method, path, token string, body any, want int, out any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != want {
		t.Fatalf("%s %s: %d %s; want %d", method, path, resp.StatusCode, b, want)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v in %s", method, path, err, b)
		}
	}
}

// crashTarget is a migrated outbox table on one database, as the crash
// test reads and fills it.
type crashTarget struct {
	flags []string
	store outboxdriver.Store
	tb    outboxdriver.Table
	// addPublished inserts published events n of 1..events, of aggregate
	// agg-(n % aggregates), in that order, with payload {"n": n}.
	addPublished func(events, aggregates int)
	// rows lists every row of the outbox table in seq order.
	rows func() []crashRow
}

type crashRow struct {
	id               string
	seq              int64
	aggregate        string
	headers, payload string
}

func crashTargetOn(t *testing.T, ctx context.Context, db string) crashTarget {
	t.Helper()
	switch db {
	case "postgres":
		tb, flags := migrated(t)
		pool := testenv.Pool(t)
		return crashTarget{flags: flags, store: outboxpgx.New(pool), tb: tb,
			addPublished: func(events, aggregates int) {
				if _, err := pool.Exec(ctx, `INSERT INTO `+tb.Qualified("")+` (id, aggregatetype, aggregateid, type, payload, published_at)
SELECT gen_random_uuid(), 'order', 'agg-' || (i % $2), 'Placed', json_build_object('n', i), now() - interval '10 minutes'
FROM generate_series(1, $1) AS i ORDER BY i`, events, aggregates); err != nil {
					t.Fatal(err)
				}
			},
			rows: func() []crashRow {
				rows, err := pool.Query(ctx, `SELECT id::text, seq, aggregateid, headers::text, coalesce(payload::text, '') FROM `+tb.Qualified("")+` ORDER BY seq`)
				if err != nil {
					t.Fatal(err)
				}
				defer rows.Close()
				return scanCrashRows(t, rows)
			}}
	case "mysql":
		m := mysqlMigrated(t)
		return sqlCrashTarget(t, ctx, m.flags, outboxmysql.New(m.db), m.db, m.tb, "2006-01-02 15:04:05.000000")
	default:
		path := filepath.Join(t.TempDir(), "app.db")
		flags := []string{"--db", "sqlite://" + path}
		if _, stderr, code := run(t, nil, append([]string{"migrate"}, flags...)...); code != 0 {
			t.Fatalf("migrate: %s", stderr)
		}
		sdb, err := outboxsqlite.Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sdb.Close() })
		return sqlCrashTarget(t, ctx, flags, outboxsqlite.New(sdb), sdb, outboxdriver.Table{Schema: outboxsqlite.Schema, Name: "outbox"}, "2006-01-02 15:04:05.000")
	}
}

func sqlCrashTarget(t *testing.T, ctx context.Context, flags []string, store outboxdriver.Store, db *sql.DB, tb outboxdriver.Table, layout string) crashTarget {
	name := "`" + tb.Schema + "`.`" + tb.Name + "`"
	return crashTarget{flags: flags, store: store, tb: tb,
		addPublished: func(events, aggregates int) {
			at := time.Now().UTC().Add(-10 * time.Minute).Format(layout)
			for first := 1; first <= events; first += 500 {
				var q strings.Builder
				var args []any
				q.WriteString(`INSERT INTO ` + name + ` (id, aggregatetype, aggregateid, type, payload, published_at) VALUES `)
				for n := first; n < first+500 && n <= events; n++ {
					if n > first {
						q.WriteString(", ")
					}
					q.WriteString("(?, 'order', ?, 'Placed', ?, ?)")
					args = append(args, uuid.Must(uuid.NewV7()).String(), fmt.Sprint("agg-", n%aggregates), fmt.Sprintf(`{"n":%d}`, n), at)
				}
				if _, err := db.ExecContext(ctx, q.String(), args...); err != nil {
					t.Fatal(err)
				}
			}
		},
		rows: func() []crashRow {
			rows, err := db.QueryContext(ctx, `SELECT id, seq, aggregateid, headers, coalesce(payload, '') FROM `+name+` ORDER BY seq`)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			return scanCrashRows(t, rows)
		}}
}

func scanCrashRows(t *testing.T, rows interface {
	Next() bool
	Scan(...any) error
	Err() error
}) []crashRow {
	t.Helper()
	var out []crashRow
	for rows.Next() {
		var r crashRow
		if err := rows.Scan(&r.id, &r.seq, &r.aggregate, &r.headers, &r.payload); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// replayed is what the table holds of a replay: its copies in seq order,
// each with the original it copies, and the originals by id.
type replayed struct {
	copies    []crashRow
	of        []string // outbox-replay-of of each copy
	originals map[string]crashRow
}

func (c crashTarget) replayed(t *testing.T, request string) replayed {
	t.Helper()
	r := replayed{originals: map[string]crashRow{}}
	for _, row := range c.rows() {
		var h map[string]string
		if err := json.Unmarshal([]byte(row.headers), &h); err != nil {
			t.Fatalf("headers %q: %v", row.headers, err)
		}
		if h["outbox-replay-id"] == request {
			r.copies, r.of = append(r.copies, row), append(r.of, h["outbox-replay-of"])
		} else {
			r.originals[row.id] = row
		}
	}
	return r
}

func payloadN(t *testing.T, payload string) int {
	t.Helper()
	var p struct{ N int }
	if err := json.Unmarshal([]byte(payload), &p); err != nil {
		t.Fatalf("payload %q: %v", payload, err)
	}
	return p.N
}

// A console killed (SIGKILL) in the middle of a replay leaves the request
// executing with exactly the batches it committed applied (its progress,
// its cursor and the copies in the table agree), visibly so; a new console
// takes it over once the heartbeat is stale and finishes it: every kept
// event is re-enqueued exactly once, each aggregate's copies in the order
// of the originals. On PostgreSQL, MySQL/MariaDB and SQLite.
func TestConsoleCrashMidReplayResumes(t *testing.T) {
	t.Parallel()
	for _, db := range []string{"postgres", "mysql", "sqlite"} {
		t.Run(db, func(t *testing.T) {
			t.Parallel()
			ctx := testenv.Context(t, 3*time.Minute)
			crashMidReplay(t, crashTargetOn(t, ctx, db))
		})
	}
}

func crashMidReplay(t *testing.T, c crashTarget) {
	ctx := testenv.Context(t, 3*time.Minute)
	const events, aggregates, batch = 3000, 30, 10
	c.addPublished(events, aggregates)
	users := filepath.Join(t.TempDir(), "users.json")
	token := func(name, role string) string {
		out, err := runInProcess(t, "", "console", "user", "add", name, "--role", role, "--users", users)
		if err != nil {
			t.Fatal(err)
		}
		return regexp.MustCompile(`API token: (obx_\S+)`).FindStringSubmatch(out)[1]
	}
	otto, anna := token("otto", "operator"), token("anna", "approver")
	args := append(append([]string{}, c.flags...), "--users", users, "--addr", "127.0.0.1:0", "--replay-batch", fmt.Sprint(batch), "--takeover-after", "2s")

	first, base := startConsoleProcess(t, args...)
	var req outboxdriver.Request
	consoleCall(t, base, "POST", "/api/v1/requests/replay", otto, map[string]any{
		"since": time.Now().Add(-time.Hour).Format(time.RFC3339), "new_ids": true, "reason": "consumer lost its state"}, 201, &req)
	consoleCall(t, base, "POST", "/api/v1/requests/"+req.ID+"/approve", anna, map[string]any{"reason": "checked"}, 200, nil)

	// Kill the console once some batches, but not all, are committed.
	for deadline := time.Now().Add(60 * time.Second); ; {
		r, err := c.store.GetRequest(ctx, c.tb, req.ID)
		if err != nil {
			t.Fatal(err)
		}
		if r.State == outboxdriver.StateDone {
			t.Fatalf("the replay of %d events finished before the console could be killed mid-way", events)
		}
		if r.Done >= 5*batch {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replay made no progress in 60s: %+v", r)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-first.done
	first.done <- nil

	// What the killed console left: executing, its progress exactly the
	// copies in the table, its cursor the last original they copy.
	r, err := c.store.GetRequest(ctx, c.tb, req.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r.State != outboxdriver.StateExecuting || r.Total == nil || *r.Total != events || r.Done <= 0 || r.Done >= events {
		t.Fatalf("after the kill: state %s, done %d of %v; want executing, part of %d done", r.State, r.Done, r.Total, events)
	}
	mid := c.replayed(t, req.ID)
	var lastCopied int64
	for _, of := range mid.of {
		lastCopied = max(lastCopied, mid.originals[of].seq)
	}
	if n := int64(len(mid.copies)); n != r.Done || r.Cursor != lastCopied || r.Done%batch != 0 {
		t.Fatalf("after the kill: %d copies in the table, progress %d, cursor %d (last original copied %d): a batch is half applied", n, r.Done, r.Cursor, lastCopied)
	}
	killedAt := r.Done

	// The visible state through a new console, then its take-over.
	_, base = startConsoleProcess(t, args...)
	await.Eventually(t, 90*time.Second, func() error {
		consoleCall(t, base, "GET", "/api/v1/requests/"+req.ID, otto, nil, 200, &r)
		if r.State == outboxdriver.StateDone {
			return nil
		}
		if r.State != outboxdriver.StateExecuting {
			t.Fatalf("after the restart: %+v; want executing, then done", r)
		}
		return fmt.Errorf("after the restart: %+v; want executing, then done", r)
	})
	// Exactly once, in order per aggregate.
	done := c.replayed(t, req.ID)
	if r.Done != events || len(done.copies) != events {
		t.Fatalf("done: progress %d, %d copies; want %d each", r.Done, len(done.copies), events)
	}
	last := map[string]int{}
	seen := map[string]bool{}
	for i, cp := range done.copies {
		orig, ok := done.originals[done.of[i]]
		if !ok || seen[orig.id] || cp.id == orig.id {
			t.Fatalf("copy %s of %q: want a new id copying a kept original once", cp.id, done.of[i])
		}
		seen[orig.id] = true
		n := payloadN(t, cp.payload)
		if n != payloadN(t, orig.payload) || cp.aggregate != orig.aggregate || n <= last[cp.aggregate] {
			t.Fatalf("%s: copy of #%d after the copy of #%d (original #%d)", cp.aggregate, n, last[cp.aggregate], payloadN(t, orig.payload))
		}
		last[cp.aggregate] = n
	}
	if len(seen) != events || len(last) != aggregates {
		t.Fatalf("%d originals copied over %d aggregates; want %d over %d", len(seen), len(last), events, aggregates)
	}
	recs, err := c.store.FindAudit(ctx, c.tb, outboxdriver.AuditQuery{RequestID: req.ID, Action: "execute", Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || !strings.Contains(recs[0].Detail, "resumed by executor") || !strings.Contains(recs[0].Detail, fmt.Sprintf("after %d events", killedAt)) {
		t.Fatalf("audit of the executions: %+v; want the start and the resumption after %d events", recs, killedAt)
	}
}
