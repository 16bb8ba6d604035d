package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

// `outbox audit` filters the trail by actor, action, event and time, as a
// table or JSON lines; `outbox audit prune --before` is the one way rows
// leave it, and is itself audited.
func TestAuditCommand(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	ctx := testenv.Context(t, time.Minute)
	if _, err := outboxpgx.New(pool).Migrate(ctx, tb, nil); err != nil {
		t.Fatal(err)
	}
	ids := testenv.AddDeadLetters(t, pool, tb,
		testenv.DeadLetterRow{AggregateType: "order", AggregateID: "1", Type: "OrderPlaced", Payload: `{}`, LastError: "x", Attempts: 1},
		testenv.DeadLetterRow{AggregateType: "order", AggregateID: "2", Type: "OrderPlaced", Payload: `{}`, LastError: "x", Attempts: 1})
	db := []string{"--db", testenv.DatabaseURL(), "--schema", tb.Schema}
	if _, err := runInProcess(t, "", append([]string{"dlq", "retry", ids[0], "--actor", "ada", "--reason", "fixed"}, db...)...); err != nil {
		t.Fatal(err)
	}
	if _, err := runInProcess(t, "", append([]string{"dlq", "discard", ids[1], "--actor", "bob"}, db...)...); err != nil {
		t.Fatal(err)
	}
	lines := func(args ...string) []outboxdriver.AuditRecord {
		t.Helper()
		out, err := runInProcess(t, "", append(append([]string{"audit", "--json"}, args...), db...)...)
		if err != nil {
			t.Fatalf("audit %v: %v\n%s", args, err, out)
		}
		var recs []outboxdriver.AuditRecord
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if l == "" {
				continue
			}
			var r outboxdriver.AuditRecord
			if err := json.Unmarshal([]byte(l), &r); err != nil {
				t.Fatalf("audit %v: line %q: %v", args, l, err)
			}
			recs = append(recs, r)
		}
		return recs
	}
	if got := lines(); len(got) != 2 || got[0].Action != "discard" || got[1].Action != "retry" {
		t.Fatalf("audit: %+v", got)
	}
	if got := lines("--actor", "ada"); len(got) != 1 || got[0].EventID != ids[0] || got[0].Reason != "fixed" || got[0].Role != "operator" {
		t.Fatalf("audit --actor ada: %+v", got)
	}
	if got := lines("--action", "discard", "--event", ids[1]); len(got) != 1 || got[0].Actor != "bob" {
		t.Fatalf("audit --action discard --event: %+v", got)
	}
	if got := lines("--since", time.Now().Add(time.Hour).UTC().Format(time.RFC3339)); len(got) != 0 {
		t.Fatalf("audit --since in an hour: %+v", got)
	}
	if got := lines("--until", "2000-01-01"); len(got) != 0 {
		t.Fatalf("audit --until 2000: %+v", got)
	}
	out, err := runInProcess(t, "", append([]string{"audit"}, db...)...)
	if err != nil || !strings.Contains(out, "ACTION") || !strings.Contains(out, "discard") {
		t.Fatalf("audit as a table: %v\n%s", err, out)
	}
	for _, bad := range [][]string{{"audit", "--since", "soon"}, {"audit", "--event", "nope"}, {"audit", "prune"}, {"audit", "prune", "--before", "2999-01-01"}} {
		if _, err := runInProcess(t, "", append(bad, db...)...); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
	if _, err := pool.Exec(ctx, `DELETE FROM `+tb.Qualified("_audit")); err == nil || !strings.Contains(err.Error(), "outbox audit prune") {
		t.Fatalf("a DELETE on the audit table: %v; want a refusal naming outbox audit prune", err)
	}
	out, err = runInProcess(t, "", append([]string{"audit", "prune", "--before", time.Now().UTC().Format(time.RFC3339Nano), "--actor", "dpo", "--reason", "kept 1 year"}, db...)...)
	if err != nil || !strings.Contains(out, "2 audit row(s)") {
		t.Fatalf("audit prune: %v\n%s", err, out)
	}
	if got := lines(); len(got) != 1 || got[0].Action != "audit-prune" || got[0].Actor != "dpo" || got[0].Reason != "kept 1 year" {
		t.Fatalf("after the prune: %+v", got)
	}
}

// `outbox audit prune --help` says that it runs as the owner role, and
// that the other roles are refused.
func TestAuditPruneHelpNamesTheOwner(t *testing.T) {
	t.Parallel()
	out, err := runInProcess(t, "", "audit", "prune", "--help")
	if err != nil || !strings.Contains(out, "Run it as the owner role") || !strings.Contains(out, "only the owner prunes") {
		t.Fatalf("audit prune --help: %v\n%s", err, out)
	}
}
