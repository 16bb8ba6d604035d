package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

// outbox pause shows in outbox status (text and JSON) and in the audit
// with actor, role and reason; resume lifts it; held list and release go
// through the same operations.
func TestPauseResumeHeldCLI(t *testing.T) {
	t.Parallel()
	tb, flags := migrated(t)
	with := func(args ...string) []string { return append(args, flags...) }
	if _, stderr, code := run(t, nil, with("pause", "--scope", "aggregatetype=order")...); code == 0 || !strings.Contains(stderr, "reason") {
		t.Fatalf("pause without a reason: code %d, %q", code, stderr)
	}
	if _, stderr, code := run(t, nil, with("pause", "--scope", "colour=red", "--reason", "x")...); code == 0 || !strings.Contains(stderr, "all, destination=NAME or aggregatetype=NAME") {
		t.Fatalf("pause of a bad scope: code %d, %q", code, stderr)
	}
	out, stderr, code := run(t, nil, with("pause", "--scope", "aggregatetype=order", "--reason", "billing migration", "--actor", "ada")...)
	if code != 0 || !strings.Contains(out, "paused aggregatetype=order") {
		t.Fatalf("pause: code %d, %q %q", code, out, stderr)
	}
	out, _, _ = run(t, nil, with("status")...)
	if !strings.Contains(out, "aggregatetype=order") || !strings.Contains(out, "billing migration") {
		t.Fatalf("status does not show the pause:\n%s", out)
	}
	out, _, _ = run(t, nil, with("status", "--json")...)
	var st struct {
		Pauses []outboxdriver.Pause `json:"pauses"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil || len(st.Pauses) != 1 || st.Pauses[0].Value != "order" || st.Pauses[0].Actor != "ada" || st.Pauses[0].Role != "operator" {
		t.Fatalf("status --json pauses: %s (%v)", out, err)
	}
	pool := testenv.Pool(t)
	recs, err := outboxpgx.New(pool).FindAudit(context.Background(), tb, outboxdriver.AuditQuery{Limit: 1})
	if err != nil || len(recs) != 1 || recs[0].Action != "pause" || recs[0].Actor != "ada" || recs[0].Role != "operator" || recs[0].Reason != "billing migration" {
		t.Fatalf("audit of the pause: %+v, %v", recs, err)
	}
	if out, _, code := run(t, nil, with("resume", "--scope", "aggregatetype=order")...); code != 0 || !strings.Contains(out, "resumed") {
		t.Fatalf("resume: %d %q", code, out)
	}
	if _, stderr, code := run(t, nil, with("resume", "--scope", "aggregatetype=order")...); code == 0 || !strings.Contains(stderr, "not paused") {
		t.Fatalf("second resume: %d %q", code, stderr)
	}
	out, _, _ = run(t, nil, with("status", "--json")...)
	if !strings.Contains(out, `"pauses":[]`) {
		t.Fatalf("status --json after resume: %s", out)
	}

	id := testenv.AddDeadLetters(t, pool, tb, testenv.DeadLetterRow{AggregateType: "order", AggregateID: "42", Type: "OrderPlaced",
		Payload: `{}`, LastError: "refused", Attempts: 1, Held: true})[0]
	out, _, code = run(t, nil, with("held", "list", "--json")...)
	var held []outboxdriver.HeldAggregate
	if code != 0 || json.Unmarshal([]byte(out), &held) != nil || len(held) != 1 || held[0].EventID != id {
		t.Fatalf("held list: %d %s", code, out)
	}
	if out, stderr, code := run(t, nil, with("held", "release", id, "--reason", "order cancelled")...); code != 0 || !strings.Contains(out, "released order/42") {
		t.Fatalf("held release: %d %q %q", code, out, stderr)
	}
	if out, _, _ := run(t, nil, with("held", "list", "--json")...); strings.TrimSpace(out) != "[]" {
		t.Fatalf("held list after release: %s", out)
	}
}
