package ops_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/route"
)

// Above the exact bound, the backlog by destination adds up the estimated
// backlog by kind under routing by aggregate type (marked estimated), and
// is not counted under routing by another column, saying why: that would
// read every event waiting.
func TestInsightDestinationsOnALargeBacklog(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	var rows []outboxdriver.Row
	for i := range ops.OverviewExactUpTo + 200 {
		rows = append(rows, outboxdriver.Row{ID: uuid.Must(uuid.NewV7()).String(), AggregateType: "order", AggregateID: fmt.Sprint(i), Type: "Placed", Payload: []byte(`{}`)})
	}
	if err := r.st.Insert(r.ctx, r.tb, rows); err != nil {
		t.Fatal(err)
	}
	if _, err := r.pool.Exec(r.ctx, `ANALYZE `+r.tb.Qualified("")); err != nil {
		t.Fatal(err)
	}
	in, err := r.ops(t, nil).Insight(r.ctx, viewer, 0)
	if err != nil || len(in.Destinations) != 1 || in.Destinations[0].Destination != "outbox.event.order" || !in.Destinations[0].Estimated || in.Destinations[0].Events <= ops.OverviewExactUpTo {
		t.Fatalf("by aggregate type: %+v, %v; want outbox.event.order, estimated above %d", in.Destinations, err, ops.OverviewExactUpTo)
	}
	in, err = r.ops(t, &ops.Config{Route: &route.Config{RouteBy: "aggregateid"}}).Insight(r.ctx, viewer, 0)
	if err != nil || in.Destinations != nil || !strings.Contains(in.DestinationsNote, "not counted") || !strings.Contains(in.DestinationsNote, "aggregateid") {
		t.Fatalf("by aggregate id: %+v, note %q, %v; want none, and why", in.Destinations, in.DestinationsNote, err)
	}
}
