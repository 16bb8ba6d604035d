package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/reconcile"
)

// `outbox reconcile` exits 0 on a clean outbox, 1 with the findings, 2 on
// a check that cannot run.
func TestReconcileExitStatus(t *testing.T) {
	t.Parallel()
	tb, flags := migrated(t)
	ctx := testenv.Context(t, time.Minute)
	pool := testenv.Pool(t)
	if out, stderr, code := run(t, nil, append([]string{"reconcile"}, flags...)...); code != 0 || !strings.Contains(out, "clean") {
		t.Fatalf("clean: exit %d, %q %q", code, out, stderr)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+tb.Qualified("_orders")+` (id text, created_at timestamptz DEFAULT now());
		INSERT INTO `+tb.Qualified("_orders")+` (id) VALUES ('41'), ('42');
		INSERT INTO `+tb.Qualified("")+` (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'order', '41', 'OrderPlaced', '{}')`); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "reconcile.json")
	cfg := map[string]any{"checks": []map[string]string{{
		"name":     "orders",
		"business": `SELECT id FROM ` + tb.Qualified("_orders") + ` WHERE created_at >= $1 AND created_at < $2`,
		"events":   `SELECT aggregateid FROM ` + tb.Qualified("") + ` WHERE type = 'OrderPlaced' AND created_at >= $1 AND created_at < $2`,
	}}}
	b, _ := json.Marshal(cfg)
	if err := os.WriteFile(cfgFile, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, stderr, code := run(t, nil, append([]string{"reconcile", "--json", "--config", cfgFile}, flags...)...)
	var rep reconcile.Report
	if err := json.Unmarshal([]byte(out), &rep); code != 1 || err != nil || len(rep.Findings) != 1 || rep.Findings[0].Kind != "missing-event" || strings.Join(rep.Findings[0].IDs, ",") != "42" {
		t.Fatalf("findings: exit %d, %q %q (%v)", code, out, stderr, err)
	}
	if err := os.WriteFile(cfgFile, []byte(`{"checks": [{"name": "bad", "business": "SELEC 1", "events": "SELECT 1"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := run(t, nil, append([]string{"reconcile", "--config", cfgFile}, flags...)...); code != 2 || !strings.Contains(stderr, "check bad: business query") {
		t.Fatalf("bad query: exit %d, %q", code, stderr)
	}
}

// `outbox relay --reconcile-every` reconciles inside the relay and exports
// the findings as metrics.
func TestRelayReconcilesOnASchedule(t *testing.T) {
	t.Parallel()
	tb, flags := migrated(t)
	ctx := testenv.Context(t, time.Minute)
	if _, err := testenv.Pool(t).Exec(ctx, `INSERT INTO `+tb.Qualified("_dead_letter")+` (id, aggregatetype, aggregateid, type, payload, seq, created_at, attempts, last_error, dead_lettered_at)
		VALUES (gen_random_uuid(), 'order', '9', 'OrderPlaced', '{}', 1, now() - interval '3 hours', 1, 'x', now() - interval '2 hours')`); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	startRelay(t, append(flags, "--sink", "stdout:", "--metrics-addr", addr, "--reconcile-every", "1s")...)
	const want = `outbox_reconcile_findings{kind="dead-letter",scope="order"} 1`
	await.Eventually(t, 30*time.Second, func() error {
		m := ""
		if resp, err := http.Get("http://" + addr + "/metrics"); err == nil { // refused until the relay listens
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			m = string(b)
		}
		if !strings.Contains(m, want) || !strings.Contains(m, "outbox_reconcile_last_success_timestamp_seconds") {
			return fmt.Errorf("/metrics lacks %q:\n%s", want, m)
		}
		return nil
	})
}
