package outboxpgx_test

import (
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

// The console's counts are exact up to the bound and estimates above it,
// marked as such and near the truth; the backlog by kind is estimated
// above ExactUpTo with the oldest age of a kind among the oldest events
// exact; the events waiting behind a held aggregate are not counted on
// such a backlog; Status stays exact.
func TestEstimatesAboveTheBound(t *testing.T) {
	t.Parallel()
	pool, tb := setup(t)
	d := outboxpgx.New(pool)
	ctx := testenv.Context(t, 2*time.Minute)
	n := pgschema.NamesOf(tb)
	const events = outboxpgx.ExactUpTo + 5000
	// The oldest 100 events are "old/Old", an hour old; the rest split
	// between two kinds, a quarter and three quarters.
	if _, err := pool.Exec(ctx, `INSERT INTO `+n.Table+` (id, aggregatetype, aggregateid, type, payload, created_at)
SELECT gen_random_uuid(),
       CASE WHEN g <= 100 THEN 'old' WHEN g % 4 = 0 THEN 'payment' ELSE 'order' END,
       'a-' || (g % 500),
       CASE WHEN g <= 100 THEN 'Old' WHEN g % 4 = 0 THEN 'PaymentCaptured' ELSE 'OrderPlaced' END,
       jsonb_build_object('n', g, 'pad', repeat('x', 200)),
       CASE WHEN g <= 100 THEN now() - interval '1 hour' ELSE now() END
FROM generate_series(1, $1::int) g ORDER BY g`, events); err != nil {
		t.Fatal(err)
	}
	testenv.AddDeadLetters(t, pool, tb, testenv.DeadLetterRow{AggregateType: "order", AggregateID: "a-3", Type: "OrderPlaced", LastError: "x", Held: true})
	if _, err := pool.Exec(ctx, `ANALYZE `+n.Table); err != nil {
		t.Fatal(err)
	}
	near := func(what string, got, want int64) {
		t.Helper()
		if got < want*7/10 || got > want*13/10 {
			t.Errorf("%s: %d; want about %d", what, got, want)
		}
	}

	st, err := d.EstimateStatus(ctx, tb, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Estimated.Backlog || !st.Estimated.PartitionBacklog || st.Estimated.DeadLetters || st.DeadLetters != 1 {
		t.Fatalf("bound 1000: estimated %+v, dead letters %d; want the backlog estimated and the dead letter counted", st.Estimated, st.DeadLetters)
	}
	near("estimated backlog", st.Backlog, events)
	if st.OldestUnpublishedAge < 59*time.Minute {
		t.Errorf("oldest unpublished %s; want the hour of the first event", st.OldestUnpublishedAge)
	}
	var parts int64
	for _, p := range st.Partitions {
		parts += p.Backlog
	}
	near("the partitions' estimated backlogs together", parts, events)

	exact, err := d.EstimateStatus(ctx, tb, 100_000)
	if err != nil {
		t.Fatal(err)
	}
	if exact.Estimated != (outboxdriver.Estimated{}) || exact.Backlog != events {
		t.Fatalf("bound 100000: backlog %d, estimated %+v; want %d exact", exact.Backlog, exact.Estimated, events)
	}
	if full, err := d.Status(ctx, tb); err != nil || full.Backlog != events || full.Estimated != (outboxdriver.Estimated{}) {
		t.Fatalf("Status: %d %+v %v; want %d exact", full.Backlog, full.Estimated, err, events)
	}

	kinds, err := d.Backlog(ctx, tb, 20)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]outboxdriver.KindBacklog{}
	for _, k := range kinds {
		if !k.Estimated {
			t.Errorf("kind %s/%s not marked estimated above ExactUpTo", k.AggregateType, k.Type)
		}
		got[k.AggregateType] = k
	}
	near("order's backlog", got["order"].Backlog, (events-100)*3/4)
	near("payment's backlog", got["payment"].Backlog, (events-100)/4)
	if old := got["old"]; old.Backlog < 100 || old.OldestAge < 59*time.Minute {
		t.Errorf("the kind of the oldest events: %+v; want at least its 100 events and its exact age of an hour", old)
	}
	if kinds[0].AggregateType != "order" {
		t.Errorf("largest kind first: %+v", kinds)
	}

	hs, err := d.HeldAggregates(ctx, tb, 10)
	if err != nil || len(hs) != 1 || hs[0].Waiting != -1 {
		t.Fatalf("held aggregates over a large backlog: %+v, %v; want one, waiting not counted (-1)", hs, err)
	}
}
