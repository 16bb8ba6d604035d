package reconcile_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/inbox/inboxpgx"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/reconcile"
)

func setup(t *testing.T) (context.Context, *fixture, outboxdriver.Table) {
	t.Helper()
	ctx := testenv.Context(t, time.Minute)
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	if _, err := outboxpgx.New(pool).Migrate(ctx, tb, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := inboxpgx.Migrate(ctx, pool, outboxdriver.Table{Schema: tb.Schema, Name: "inbox"}); err != nil {
		t.Fatal(err)
	}
	exec := func(sql string) {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`CREATE TABLE ` + tb.Qualified("_orders") + ` (id text PRIMARY KEY, created_at timestamptz NOT NULL DEFAULT now())`)
	return ctx, &fixture{exec}, tb
}

type fixture struct {
	exec func(sql string)
}

func config(tb outboxdriver.Table) *reconcile.Config {
	return &reconcile.Config{
		Checks: []reconcile.Check{{
			Name:     "orders",
			Business: `SELECT id FROM ` + tb.Qualified("_orders") + ` WHERE created_at >= $1 AND created_at < $2`,
			Events:   `SELECT aggregateid FROM ` + tb.Qualified("") + ` WHERE type = 'OrderPlaced' AND created_at >= $1 AND created_at < $2`,
		}},
		Inboxes:       []reconcile.Inbox{{Table: "inbox", Consumer: "billing", AggregateTypes: []string{"order"}}},
		VersionHeader: "aggregateVersion",
	}
}

// A clean outbox reports nothing: events recently written, published and
// recorded by the consumer, versions without a jump.
func TestReconcileCleanReportsNothing(t *testing.T) {
	t.Parallel()
	ctx, p, tb := setup(t)
	p.exec(`INSERT INTO ` + tb.Qualified("_orders") + ` (id) VALUES ('1'), ('2')`)
	p.exec(`INSERT INTO ` + tb.Qualified("") + ` (id, aggregatetype, aggregateid, type, payload, headers, published_at, created_at) VALUES
		('00000000-0000-7000-8000-000000000001', 'order', '1', 'OrderPlaced', '{}', '{"aggregateVersion": "1"}', now() - interval '10 minutes', now() - interval '11 minutes'),
		('00000000-0000-7000-8000-000000000002', 'order', '1', 'OrderPaid', '{}', '{"aggregateVersion": "2"}', NULL, now()),
		('00000000-0000-7000-8000-000000000003', 'order', '2', 'OrderPlaced', '{}', '{"aggregateVersion": "1"}', NULL, now())`)
	p.exec(`INSERT INTO ` + outboxdriver.QuoteIdent(tb.Schema) + `.inbox (consumer, event_id) VALUES ('billing', '00000000-0000-7000-8000-000000000001')`)
	rep, err := reconcile.Run(ctx, testenv.Pool(t), tb, config(tb))
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Findings) != 0 {
		t.Fatalf("findings on a clean outbox: %+v", rep.Findings)
	}
}

// Each kind of problem, planted in a real database, is found with its ids.
func TestReconcileFindsEachKindOfProblem(t *testing.T) {
	t.Parallel()
	ctx, p, tb := setup(t)
	p.exec(`INSERT INTO ` + tb.Qualified("_orders") + ` (id) VALUES ('1'), ('2'), ('3')`)
	p.exec(`INSERT INTO ` + tb.Qualified("") + ` (id, aggregatetype, aggregateid, type, payload, headers, published_at, created_at) VALUES
		('00000000-0000-7000-8000-000000000001', 'order', '1', 'OrderPlaced', '{}', '{"aggregateVersion": "5"}', now() - interval '10 minutes', now() - interval '11 minutes'),
		('00000000-0000-7000-8000-000000000002', 'order', '1', 'OrderPaid', '{}', '{"aggregateVersion": "7"}', NULL, now() - interval '6 minutes'),
		('00000000-0000-7000-8000-000000000003', 'order', '2', 'OrderPlaced', '{}', '{"aggregateVersion": "1"}', NULL, now())`)
	p.exec(`INSERT INTO ` + tb.Qualified("_held") + ` (aggregatetype, aggregateid, seq, event_id, reason, held_at) VALUES
		('order', '9', 1, '00000000-0000-7000-8000-000000000009', 'dead letter', now() - interval '20 minutes')`)
	p.exec(`INSERT INTO ` + tb.Qualified("_dead_letter") + ` (id, aggregatetype, aggregateid, type, payload, seq, created_at, attempts, last_error, dead_lettered_at) VALUES
		('00000000-0000-7000-8000-000000000009', 'order', '9', 'OrderPlaced', '{}', 1, now() - interval '3 hours', 1, 'x', now() - interval '2 hours')`)
	rep, err := reconcile.Run(ctx, testenv.Pool(t), tb, config(tb))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]reconcile.Finding{}
	for _, f := range rep.Findings {
		got[f.Kind] = f
	}
	want := map[string][]string{
		"pending":        {"00000000-0000-7000-8000-000000000002"},
		"held":           {"9"},
		"dead-letter":    {"00000000-0000-7000-8000-000000000009"},
		"missing-event":  {"3"},
		"missing-effect": {"00000000-0000-7000-8000-000000000001"},
		"version-gap":    {"1 (5 to 7)"},
	}
	if len(got) != len(want) || len(rep.Findings) != len(want) {
		t.Fatalf("findings %+v, want one of each of %v", rep.Findings, want)
	}
	for kind, ids := range want {
		if f := got[kind]; !slices.Equal(f.IDs, ids) || f.Count != int64(len(ids)) || f.Detail == "" {
			t.Errorf("%s: %+v, want ids %q", kind, f, ids)
		}
	}
}

// A check whose query fails or runs too long is an error that names it;
// the findings before it are kept.
func TestReconcileBadQueryIsAClearError(t *testing.T) {
	t.Parallel()
	ctx, _, tb := setup(t)
	cfg := &reconcile.Config{Timeout: 200 * time.Millisecond, Checks: []reconcile.Check{
		{Name: "slow", Business: `SELECT pg_sleep(5)::text WHERE $1::timestamptz < $2::timestamptz`, Events: `SELECT ''`},
	}}
	if _, err := reconcile.Run(ctx, testenv.Pool(t), tb, cfg); err == nil || !strings.Contains(err.Error(), "check slow") || !strings.Contains(err.Error(), "statement timeout") {
		t.Fatalf("slow check: %v", err)
	}
	cfg.Checks = []reconcile.Check{{Name: "typo", Business: `SELEC id FROM nowhere`, Events: `SELECT ''`}}
	if _, err := reconcile.Run(ctx, testenv.Pool(t), tb, cfg); err == nil || !strings.Contains(err.Error(), "check typo: business query") {
		t.Fatalf("bad check: %v", err)
	}
}
