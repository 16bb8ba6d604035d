package console_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/route"
)

// The overview shows the backlog by destination, routed as the relays
// route (the ops Config's routing), on every database: by aggregate type
// by default; by another column through its values, with the values the
// routing does not match set apart.
func TestBacklogByDestination(t *testing.T) {
	t.Parallel()
	onEveryDB(t, nil, func(t *testing.T, r *rig) {
		var events []outboxdriver.Row
		for i, agg := range []string{"order", "order", "order", "payment", "payment"} {
			events = append(events, outboxdriver.Row{ID: uuid.Must(uuid.NewV7()).String(), AggregateType: agg,
				AggregateID: []string{"acme-1", "acme-2", "globex-1", "acme-3", "nobody"}[i], Type: "Happened", Payload: []byte(`{}`)})
		}
		if err := r.st.Insert(r.ctx, r.tb, events); err != nil {
			t.Fatal(err)
		}
		code, body := r.api("GET", "/api/v1/overview", r.users[ops.Viewer].token, nil)
		var ov struct {
			Destinations []struct {
				Destination string  `json:"destination"`
				Events      int64   `json:"events"`
				Age         float64 `json:"oldest_age_seconds"`
			} `json:"backlog_by_destination"`
		}
		if code != http.StatusOK || json.Unmarshal(body, &ov) != nil || len(ov.Destinations) != 2 ||
			ov.Destinations[0].Destination != "outbox.event.order" || ov.Destinations[0].Events != 3 ||
			ov.Destinations[1].Destination != "outbox.event.payment" || ov.Destinations[1].Events != 2 {
			t.Fatalf("overview API: %d %s; want order 3 and payment 2 by destination", code, body)
		}
		b := r.browser()
		b.login(r.users[ops.Viewer])
		if code, page := b.get("/"); code != http.StatusOK || !strings.Contains(string(page), `<code>outbox.event.order</code></td>
    <td class="num">3</td>`) {
			t.Fatalf("overview page: %d, no backlog by destination\n%s", code, page)
		}

		// Routed by aggregate id, by tenant.
		o, err := ops.New(r.st, r.tb, &ops.Config{Route: &route.Config{RouteBy: "aggregateid", Regex: `(?P<tenant>acme|globex)-.*`, Replacement: "tenant.${tenant}"}})
		if err != nil {
			t.Fatal(err)
		}
		in, err := o.Insight(r.ctx, anna, 0)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, d := range in.Destinations {
			got = append(got, fmt.Sprintf("%s:%v:%d", d.Destination, d.Unroutable, d.Events))
		}
		if strings.Join(got, " ") != "tenant.acme:false:3 :true:1 tenant.globex:false:1" || in.DestinationsNote != "" {
			t.Fatalf("backlog by tenant: %v (note %q)", got, in.DestinationsNote)
		}
	})
}
