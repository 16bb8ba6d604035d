package console_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
)

// A request's audit says in words what was requested, and the steps of
// its execution are attributed to the outbox itself (role system), each
// naming who requested and who approved it: the execute, the repair, the
// dead letter's retry and the finish alike.
func TestRequestAuditInWords(t *testing.T) {
	t.Parallel()
	onEveryDB(t, nil, func(t *testing.T, r *rig) {
		op := r.users[ops.Operator].token
		agg := r.keep()
		since := time.Now().Add(-time.Hour).UTC().Truncate(time.Second)
		code, body := r.api("POST", "/api/v1/requests/replay", op, map[string]any{"since": since.Format(time.RFC3339),
			"aggregatetype": "order", "aggregateid": agg, "new_ids": true, "reason": "billing lost events"})
		var replay outboxdriver.Request
		if code != http.StatusCreated || json.Unmarshal(body, &replay) != nil {
			t.Fatalf("replay request: %d %s", code, body)
		}
		recs, err := r.st.FindAudit(r.ctx, r.tb, outboxdriver.AuditQuery{RequestID: replay.ID, Action: "request", Limit: 10})
		if err != nil || len(recs) != 1 {
			t.Fatalf("audit of the replay request: %+v, %v", recs, err)
		}
		for _, want := range []string{"replay requested: events published from " + since.Format(time.RFC3339) + " until ",
			`aggregate type "order"`, `aggregate id "` + agg + `"`, "copies with new ids; expires "} {
			if !strings.Contains(recs[0].Detail, want) {
				t.Errorf("replay request audited as %q; want it to say %q", recs[0].Detail, want)
			}
		}

		id := r.deadLetter()
		req, err := r.op.RequestRepair(r.ctx, otto, ops.RepairParams{EventID: id, Headers: map[string]string{"tenant": "t2"}}, "wrong tenant")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.op.Approve(r.ctx, anna, req.ID, "checked"); err != nil {
			t.Fatal(err)
		}
		e, err := r.op.NewExecutor(nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Execute(r.ctx, req.ID); err != nil {
			t.Fatal(err)
		}
		recs, err = r.st.FindAudit(r.ctx, r.tb, outboxdriver.AuditQuery{RequestID: req.ID, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		var trail []string
		for i := len(recs) - 1; i >= 0; i-- {
			a := recs[i]
			trail = append(trail, a.Action+":"+a.Actor+":"+a.Role)
			if a.Actor == "(outbox)" && (!strings.Contains(a.Detail, "requested by otto") || !strings.Contains(a.Detail, "approved by anna")) && a.Action != "finish" {
				t.Errorf("%s row %q does not name the requester and the approver", a.Action, a.Detail)
			}
		}
		if got, want := strings.Join(trail, " "), "request:otto:operator approve:anna:approver execute:(outbox):system repair:(outbox):system finish:(outbox):system"; got != want {
			t.Errorf("the repair's audit: %s; want %s", got, want)
		}
		if want := "repair requested: dead letter " + id + ", new headers, retried with the same id; expires "; !strings.Contains(recs[len(recs)-1].Detail, want) {
			t.Errorf("repair request audited as %q; want %q", recs[len(recs)-1].Detail, want)
		}
		retry, err := r.st.FindAudit(r.ctx, r.tb, outboxdriver.AuditQuery{EventID: id, Action: "retry", Limit: 10})
		if err != nil || len(retry) != 1 || retry[0].Actor != "(outbox)" || retry[0].Role != "system" ||
			!strings.Contains(retry[0].Reason, req.ID) || !strings.Contains(retry[0].Reason, "requested by otto, approved by anna") {
			t.Fatalf("the repaired dead letter's retry audited as %+v, %v", retry, err)
		}
	})
}
