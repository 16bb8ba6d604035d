package ops_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
)

// The masking stored with the table: an operator stores a path, audited;
// every Ops on the table masks it besides its configured paths (another
// one, as another process, within its refresh); a path stored for another
// aggregate type leaves these events alone; a viewer may not change it;
// a hostile path is refused with a clear error; a reveal of a stored
// path is audited; a removal needs a reason.
func TestStoredMasking(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	o := r.ops(t, &ops.Config{SensitivePaths: []string{"customer.name"}})
	other := r.ops(t, &ops.Config{MaskRefresh: 100 * time.Millisecond})
	ids := testenv.AddDeadLetters(t, r.pool, r.tb,
		testenv.DeadLetterRow{AggregateType: "order", AggregateID: "1", Type: "OrderPlaced", LastError: "x",
			Payload: `{"customer":{"name":"Ada Secret","email":"ada-secret@example.com"},"card":{"number":"4111-SECRET"},"n":7}`})
	show := func(o *ops.Ops) ops.View {
		t.Helper()
		v, err := o.DeadLetter(r.ctx, viewer, ids[0])
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := show(other); !strings.Contains(v.Payload, "ada-secret@example.com") {
		t.Fatalf("before anything is stored, an Ops without paths shows the payload as it is:\n%s", v.Payload)
	}

	if _, err := o.AddMaskPath(r.ctx, viewer, outboxdriver.MaskPath{Path: "customer.email"}, ""); !errors.Is(err, ops.ErrDenied) {
		t.Fatalf("a viewer's AddMaskPath = %v; want ErrDenied", err)
	}
	for _, bad := range []string{"", "a..b", ".a", "customer.email\x1b[2J", "a\nb", strings.Repeat("x", 256)} {
		_, err := o.AddMaskPath(r.ctx, operator, outboxdriver.MaskPath{Path: bad}, "")
		var in *ops.InputError
		if !errors.As(err, &in) || in.Field != "path" {
			t.Errorf("AddMaskPath(%q) = %v; want an InputError on the path", bad, err)
		}
	}
	for _, p := range []outboxdriver.MaskPath{{Path: "customer.email"}, {AggregateType: "invoice", Path: "card.number"}} {
		if ok, err := o.AddMaskPath(r.ctx, operator, p, "GDPR"); err != nil || !ok {
			t.Fatalf("AddMaskPath(%v) = %v, %v", p, ok, err)
		}
	}
	if ps, err := o.MaskPaths(r.ctx, viewer); err != nil || len(ps) != 2 || ps[0].Source != outboxdriver.MaskSourceOperator || ps[0].Actor != operator.Name {
		t.Fatalf("MaskPaths = %+v, %v", ps, err)
	}
	v := show(o)
	if strings.Contains(v.Payload, "ada-secret@example.com") || strings.Contains(v.Payload, "Ada Secret") ||
		!strings.Contains(v.Payload, "4111-SECRET") || v.Masked != 2 {
		t.Fatalf("configured and stored paths masked, the other aggregate type's not: masked %d\n%s", v.Masked, v.Payload)
	}
	if strings.Join(v.Sensitive, ",") != "customer.name,customer.email" {
		t.Fatalf("Sensitive = %v; want the configured path, then the stored one", v.Sensitive)
	}
	// Another Ops, as another process: it sees the path within its refresh.
	await.Eventually(t, 30*time.Second, func() error {
		if v := show(other); strings.Contains(v.Payload, "ada-secret@example.com") {
			return fmt.Errorf("the other Ops still shows the stored path:\n%s", v.Payload)
		}
		return nil
	})

	rv, err := o.Reveal(r.ctx, operator, ids[0], "customer.email", "customer asked for their data")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(rv.Payload, "ada-secret@example.com") || strings.Contains(rv.Payload, "Ada Secret") {
		t.Fatalf("reveal of the stored path:\n%s", rv.Payload)
	}

	p := outboxdriver.MaskPath{Path: "customer.email"}
	if _, err := o.RemoveMaskPath(r.ctx, operator, p, ""); !errors.As(err, new(*ops.InputError)) {
		t.Fatalf("RemoveMaskPath without a reason = %v; want an InputError", err)
	}
	if ok, err := o.RemoveMaskPath(r.ctx, operator, p, "stored by mistake"); err != nil || !ok {
		t.Fatalf("RemoveMaskPath = %v, %v", ok, err)
	}
	if v := show(o); !strings.Contains(v.Payload, "ada-secret@example.com") || strings.Contains(v.Payload, "Ada Secret") {
		t.Fatalf("after the removal the Ops that removed it shows the path at once, the configured one stays masked:\n%s", v.Payload)
	}

	var adds, removes, reveals, denied int
	for _, rec := range r.audit(t) {
		switch rec.Action {
		case "mask-add":
			adds++
		case "mask-remove":
			removes++
			if rec.Actor != operator.Name || rec.Reason != "stored by mistake" || !strings.Contains(rec.Detail, "customer.email (all)") {
				t.Errorf("the removal's audit row: %+v", rec)
			}
		case ops.ActionReveal:
			reveals++
		case ops.ActionDenied:
			denied++
		}
	}
	if adds != 2 || removes != 1 || reveals != 1 || denied != 1 {
		t.Fatalf("audit: %d mask-add, %d mask-remove, %d reveal, %d denied; want 2, 1, 1, 1", adds, removes, reveals, denied)
	}
}

// noMasking is a Store whose masking cannot be read.
type noMasking struct{ outboxdriver.Store }

func (noMasking) MaskPaths(context.Context, outboxdriver.Table) ([]outboxdriver.MaskPath, error) {
	return nil, errors.New("connection reset")
}

// When the masking stored with the table cannot be read, nothing it might
// mask is shown: the payload is hidden whole, a reveal refused, and what
// names no event type (a proposed repair) masked whole.
func TestStoredMaskingUnreadableHidesThePayload(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	o, err := ops.New(noMasking{r.st}, r.tb, nil)
	if err != nil {
		t.Fatal(err)
	}
	ids := testenv.AddDeadLetters(t, r.pool, r.tb,
		testenv.DeadLetterRow{AggregateType: "order", AggregateID: "1", Type: "OrderPlaced", LastError: "x", Payload: `{"email":"ada-secret@example.com"}`})
	v, err := o.DeadLetter(r.ctx, viewer, ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if v.Payload != "" || !strings.Contains(v.PayloadNote, "masking stored with the table could not be read") || v.ID != ids[0] {
		t.Fatalf("view: payload %q, note %q", v.Payload, v.PayloadNote)
	}
	if _, err := o.Reveal(r.ctx, operator, ids[0], "", "asked"); err == nil || !strings.Contains(err.Error(), "connection reset") {
		t.Fatalf("Reveal = %v; want the read's error", err)
	}
	if s := o.MaskJSON(r.ctx, []byte(`{"email":"ada-secret@example.com"}`)); s != `"***"` {
		t.Fatalf("MaskJSON = %q; want the whole value masked", s)
	}
}
