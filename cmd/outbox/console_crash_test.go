package main

import (
	"bytes"
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

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
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
	for deadline := time.Now().Add(30 * time.Second); ; {
		if m := listening.FindStringSubmatch(p.stderr.String()); m != nil {
			return p, m[1]
		}
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("console ended before listening: %v; stderr %q", err, p.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("console not listening after 30s; stderr %q", p.stderr.String())
		}
	}
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

// A console killed (SIGKILL) in the middle of a replay leaves the request
// executing with exactly the batches it committed applied (its progress,
// its cursor and the copies in the table agree), visibly so; a new console
// takes it over once the heartbeat is stale and finishes it: every kept
// event is re-enqueued exactly once, each aggregate's copies in the order
// of the originals.
func TestConsoleCrashMidReplayResumes(t *testing.T) {
	t.Parallel()
	tb, flags := migrated(t)
	pool := testenv.Pool(t)
	ctx := testenv.Context(t, 3*time.Minute)
	const events, aggregates, batch = 3000, 30, 10
	if _, err := pool.Exec(ctx, `INSERT INTO `+tb.Qualified("")+` (id, aggregatetype, aggregateid, type, payload, published_at)
SELECT gen_random_uuid(), 'order', 'agg-' || (i % $2), 'Placed', json_build_object('n', i), now() - interval '10 minutes'
FROM generate_series(1, $1) AS i ORDER BY i`, events, aggregates); err != nil {
		t.Fatal(err)
	}
	users := filepath.Join(t.TempDir(), "users.json")
	token := func(name, role string) string {
		out, err := runInProcess(t, "", "console", "user", "add", name, "--role", role, "--users", users)
		if err != nil {
			t.Fatal(err)
		}
		return regexp.MustCompile(`API token: (obx_\S+)`).FindStringSubmatch(out)[1]
	}
	otto, anna := token("otto", "operator"), token("anna", "approver")
	args := append(flags, "--users", users, "--addr", "127.0.0.1:0", "--replay-batch", fmt.Sprint(batch), "--takeover-after", "2s")

	first, base := startConsoleProcess(t, args...)
	var req outboxdriver.Request
	consoleCall(t, base, "POST", "/api/v1/requests/replay", otto, map[string]any{
		"since": time.Now().Add(-time.Hour).Format(time.RFC3339), "new_ids": true, "reason": "consumer lost its state"}, 201, &req)
	consoleCall(t, base, "POST", "/api/v1/requests/"+req.ID+"/approve", anna, map[string]any{"reason": "checked"}, 200, nil)

	// Kill the console once some batches, but not all, are committed.
	drv := outboxpgx.New(pool)
	for deadline := time.Now().Add(60 * time.Second); ; {
		r, err := drv.GetRequest(ctx, tb, req.ID)
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
	r, err := drv.GetRequest(ctx, tb, req.ID)
	if err != nil {
		t.Fatal(err)
	}
	copies := func() int64 {
		t.Helper()
		var n int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+tb.Qualified("")+` WHERE headers->>'outbox-replay-id' = $1`, req.ID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	var lastCopied int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(max(o.seq), 0) FROM `+tb.Qualified("")+` o JOIN `+tb.Qualified("")+` c
ON c.headers->>'outbox-replay-of' = o.id::text WHERE c.headers->>'outbox-replay-id' = $1`, req.ID).Scan(&lastCopied); err != nil {
		t.Fatal(err)
	}
	if r.State != outboxdriver.StateExecuting || r.Total == nil || *r.Total != events || r.Done <= 0 || r.Done >= events {
		t.Fatalf("after the kill: state %s, done %d of %v; want executing, part of %d done", r.State, r.Done, r.Total, events)
	}
	if n := copies(); n != r.Done || r.Cursor != lastCopied || r.Done%batch != 0 {
		t.Fatalf("after the kill: %d copies in the table, progress %d, cursor %d (last original copied %d): a batch is half applied", n, r.Done, r.Cursor, lastCopied)
	}
	killedAt := r.Done

	// The visible state through a new console, then its take-over.
	_, base = startConsoleProcess(t, args...)
	for deadline := time.Now().Add(90 * time.Second); ; {
		consoleCall(t, base, "GET", "/api/v1/requests/"+req.ID, otto, nil, 200, &r)
		if r.State == outboxdriver.StateDone {
			break
		}
		if r.State != outboxdriver.StateExecuting || time.Now().After(deadline) {
			t.Fatalf("after the restart: %+v; want executing, then done", r)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r.Done != events || copies() != events {
		t.Fatalf("done: progress %d, %d copies; want %d each", r.Done, copies(), events)
	}
	// Exactly once, in order per aggregate.
	rows, err := pool.Query(ctx, `SELECT o.aggregateid, (o.payload->>'n')::int, count(*) OVER (PARTITION BY o.id)
FROM `+tb.Qualified("")+` c JOIN `+tb.Qualified("")+` o ON c.headers->>'outbox-replay-of' = o.id::text
WHERE c.headers->>'outbox-replay-id' = $1 ORDER BY c.seq`, req.ID)
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]int{}
	seen := 0
	for rows.Next() {
		var agg string
		var n, times int
		if err := rows.Scan(&agg, &n, &times); err != nil {
			t.Fatal(err)
		}
		if times != 1 {
			t.Fatalf("event %d of %s was replayed %d times", n, agg, times)
		}
		if n <= last[agg] {
			t.Fatalf("%s: copy of #%d after the copy of #%d", agg, n, last[agg])
		}
		last[agg] = n
		seen++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if seen != events || len(last) != aggregates {
		t.Fatalf("%d copies of originals over %d aggregates; want %d over %d", seen, len(last), events, aggregates)
	}
	recs, err := drv.FindAudit(ctx, tb, outboxdriver.AuditQuery{RequestID: req.ID, Action: "execute", Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || !strings.Contains(recs[0].Detail, "resumed by executor") || !strings.Contains(recs[0].Detail, fmt.Sprintf("after %d events", killedAt)) {
		t.Fatalf("audit of the executions: %+v; want the start and the resumption after %d events", recs, killedAt)
	}
}
