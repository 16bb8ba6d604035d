package console_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
)

// On every database, a discard is not a publish: with no relay running,
// discarding a failure group between two samples draws no publish rate,
// and the samples say how many were discarded.
func TestChartDiscardIsNotAPublish(t *testing.T) {
	t.Parallel()
	onEveryDB(t, nil, func(t *testing.T, r *rig) {
		var rows []testenv.DeadLetterRow
		for range 3 {
			rows = append(rows, testenv.DeadLetterRow{AggregateType: "order", AggregateID: testenv.Hex(t), Type: "OrderPlaced", Payload: `{}`, LastError: "NO_ROUTE", Attempts: 1})
		}
		r.fx.addDeadLetters(t, r.tb, rows...)
		var events []outboxdriver.Row
		for i := range 5 {
			events = append(events, outboxdriver.Row{ID: uuid.Must(uuid.NewV7()).String(), AggregateType: "order", AggregateID: fmt.Sprint(i), Type: "OrderPlaced", Payload: []byte(`{}`)})
		}
		if err := r.st.Insert(r.ctx, r.tb, events); err != nil {
			t.Fatal(err)
		}
		start := time.Now().Add(-time.Second)
		if err := r.srv.SampleOnce(r.ctx); err != nil {
			t.Fatal(err)
		}
		sampled := time.Now()
		for time.Now().Before(sampled.Add(2 * time.Millisecond)) { // the discard's audit rows after the sample, on a millisecond clock too
			time.Sleep(time.Millisecond)
		}
		gs, err := r.st.FailureGroups(r.ctx, r.tb, 10)
		if err != nil || len(gs) != 1 || gs[0].Count != 3 {
			t.Fatalf("failure groups %+v, %v", gs, err)
		}
		if code, body := r.api("POST", "/api/v1/failure-groups/"+gs[0].Key+"/discard", r.users[ops.Operator].token, map[string]string{"reason": "obsolete"}); code != http.StatusOK {
			t.Fatalf("discard the group: %d %s", code, body)
		}
		if err := r.srv.SampleOnce(r.ctx); err != nil {
			t.Fatal(err)
		}
		ss, err := r.st.Samples(r.ctx, r.tb, start)
		if err != nil || len(ss) != 2 || ss[0].Discarded != 0 || ss[1].Discarded != 3 || ss[1].DeadLetters != 0 || ss[1].Backlog != 5 {
			t.Fatalf("samples %+v, %v; want two, the second counting the 3 discarded", ss, err)
		}
		b := r.browser()
		b.login(r.users[ops.Viewer])
		code, page := b.get("/")
		if p := string(page); code != http.StatusOK || !strings.Contains(p, `peak <span id="peak-rate">0/s</span>`) || !strings.Contains(p, "3 discarded dead letters not counted") {
			t.Fatalf("overview: %d, want a peak publish rate of 0/s and the discards noted\n%s", code, p)
		}
	})
}
