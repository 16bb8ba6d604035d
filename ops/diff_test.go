package ops_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/ops"
)

// A repair's diff lists each field added, removed and changed, and each
// header, with values masked where the payload is: a changed sensitive
// value is listed without either value.
func TestDiffRepair(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	o := r.ops(t, &ops.Config{SensitivePaths: []string{"customer.email", "cards.*.number"}})
	id := testenv.AddDeadLetters(t, r.pool, r.tb, testenv.DeadLetterRow{AggregateType: "order", AggregateID: "1", Type: "OrderPlaced",
		Payload: `{"orderId":42,"currency":"EUR","customer":{"email":"ada@example.com","name":"Ada"},"cards":[{"number":"4111"}],"lines":[1,2,3]}`,
		Headers: `{"tenant":"t1","trace":"x"}`, LastError: "refused"})[0]
	p := ops.RepairParams{EventID: id,
		Payload: json.RawMessage(`{"orderId":43,"customer":{"email":"bob@example.com","name":"Ada","vip":true},"cards":[{"number":"***"}],"lines":[1,2]}`),
		Headers: map[string]string{"tenant": "t2", "fixed": "yes"}}
	rd, err := o.DiffRepair(r.ctx, viewer, p)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range rd.Changes {
		got = append(got, fmt.Sprintf("%s %s %s: %s -> %s", c.In, c.Kind, c.Path, c.Before, c.After))
	}
	want := []string{
		`payload changed orderId: 42 -> 43`,
		`payload removed currency: "EUR" -> `,
		`payload changed customer.email: "***" -> "***"`,
		`payload added customer.vip:  -> true`,
		`payload changed cards.0.number: "***" -> "***"`,
		`payload removed lines.2: 3 -> `,
		`headers added fixed:  -> "yes"`,
		`headers changed tenant: "t1" -> "t2"`,
		`headers removed trace: "x" -> `,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("changes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if strings.Contains(rd.Proposed, "bob@") || !strings.Contains(rd.Proposed, `"vip": true`) {
		t.Fatalf("proposed payload as shown: %s", rd.Proposed)
	}
	for _, c := range rd.Changes {
		if strings.Contains(c.Before+c.After, "@example.com") || strings.Contains(c.Before+c.After, "4111") {
			t.Fatalf("a sensitive value in the diff: %+v", c)
		}
	}
	// A masked object as a whole: its fields are not listed one by one.
	o2 := r.ops(t, &ops.Config{SensitivePaths: []string{"customer"}})
	rd, err = o2.DiffRepair(r.ctx, viewer, p)
	if err != nil || len(rd.Changes) < 3 || fmt.Sprintf("%+v", rd.Changes[2]) != `{In:payload Path:customer Kind:changed Before:"***" After:"***"}` {
		t.Fatalf("diff with customer masked: %+v, %v; want one change of customer, masked", rd, err)
	}
	for _, c := range rd.Changes {
		if strings.HasPrefix(c.Path, "customer.") {
			t.Fatalf("a change inside a masked object is listed: %+v", c)
		}
	}
	// Gone: ErrNotFound.
	if _, err := o.Discard(r.ctx, operator, []string{id}, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := o.DiffRepair(r.ctx, viewer, p); !errors.Is(err, ops.ErrNotFound) {
		t.Fatalf("diff of a dead letter discarded: %v, want ErrNotFound", err)
	}
}
