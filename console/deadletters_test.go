package console_test

import (
	"html"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/ops"
)

// The list of dead letters shows the informative end of a long error (the
// cause, after the wrapping operations) with its start, not a cut inside
// the boilerplate; the whole error is in the cell's title and on the dead
// letter's page.
func TestDeadLetterListShowsTheCause(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	long := `relay: publish batch of 100 events to amqp://broker.internal.example:5672/orders-vhost: amqpsink: publish to exchange "orders-fulfilment-events" with routing key "outbox.event.order-fulfilment-service-v2": message returned as unroutable (312 NO_ROUTE): no queue is bound to receive it; bind a queue (e.g. with Config.Queues) or fix Config.Route`
	id := testenv.AddDeadLetters(t, r.pool, r.tb, testenv.DeadLetterRow{AggregateType: "order", AggregateID: "1", Type: "OrderPlaced", Payload: `{}`, LastError: long, Attempts: 1})[0]
	b := r.browser()
	b.login(r.users[ops.Viewer])
	code, page := b.get("/dead-letters")
	p := string(page)
	cell := regexp.MustCompile(`<td class="error" title="[^"]*">([^<]*)</td>`).FindStringSubmatch(p)
	if code != http.StatusOK || cell == nil {
		t.Fatalf("the list: %d, no error cell\n%s", code, p)
	}
	shown := html.UnescapeString(cell[1])
	if !strings.Contains(shown, "NO_ROUTE") || !strings.HasPrefix(shown, "relay: publish batch") || !strings.Contains(shown, " … ") || len([]rune(shown)) > 205 {
		t.Fatalf("the list shows the error as %q; want its start, … and the end with NO_ROUTE, at most about 200 characters", shown)
	}
	if !strings.Contains(html.UnescapeString(p), `title="`+long+`"`) {
		t.Fatalf("the whole error is not in the cell's title:\n%s", p)
	}
	if _, page := b.get("/dead-letters/" + id); !strings.Contains(html.UnescapeString(string(page)), long) {
		t.Fatal("the dead letter's page does not show the whole error")
	}
}
