package ops_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/route"
)

type rig struct {
	pool *pgxpool.Pool
	tb   outboxdriver.Table
	st   *outboxpgx.Driver
	ctx  context.Context
}

func newRig(t *testing.T) *rig {
	t.Helper()
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	st := outboxpgx.New(pool)
	ctx := testenv.Context(t, time.Minute)
	if _, err := st.Migrate(ctx, tb, nil); err != nil {
		t.Fatal(err)
	}
	return &rig{pool, tb, st, ctx}
}

func (r *rig) ops(t *testing.T, cfg *ops.Config) *ops.Ops {
	t.Helper()
	o, err := ops.New(r.st, r.tb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func (r *rig) audit(t *testing.T) []outboxdriver.AuditRecord {
	t.Helper()
	recs, err := r.st.FindAudit(r.ctx, r.tb, outboxdriver.AuditQuery{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

func (r *rig) backlog(t *testing.T) (backlog, dead int64) {
	t.Helper()
	st, err := r.st.Status(r.ctx, r.tb)
	if err != nil {
		t.Fatal(err)
	}
	return st.Backlog, st.DeadLetters
}

var (
	viewer   = ops.Actor{Name: "vera", Role: ops.Viewer}
	operator = ops.Actor{Name: "otto", Role: ops.Operator}
	approver = ops.Actor{Name: "anna", Role: ops.Approver}
)

// A viewer and an approver may read but not act; each refusal is audited
// and changes nothing. An operator's retry and discard are audited with
// role and reason, in the transaction of the change.
func TestRolesAndAudit(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	o := r.ops(t, nil)
	ids := testenv.AddDeadLetters(t, r.pool, r.tb,
		testenv.DeadLetterRow{AggregateType: "order", AggregateID: "1", Type: "OrderPlaced", Payload: `{"n":1}`, LastError: "refused", Held: true},
		testenv.DeadLetterRow{AggregateType: "order", AggregateID: "2", Type: "OrderPlaced", Payload: `{"n":2}`, LastError: "refused"},
	)
	for _, a := range []ops.Actor{viewer, approver, {Name: "eve", Role: "root"}, {Role: ops.Operator}} {
		if _, err := o.Retry(r.ctx, a, ids[:1], ""); !errors.Is(err, ops.ErrDenied) {
			t.Fatalf("%s retried: %v; want ErrDenied", a, err)
		}
		if _, err := o.Discard(r.ctx, a, nil, ""); !errors.Is(err, ops.ErrDenied) {
			t.Fatalf("%s discarded: %v; want ErrDenied", a, err)
		}
	}
	if b, d := r.backlog(t); b != 0 || d != 2 {
		t.Fatalf("after refused actions: backlog %d, dead letters %d; want 0, 2", b, d)
	}
	denied := r.audit(t)
	if len(denied) != 8 {
		t.Fatalf("%d audit rows after 8 refusals: %+v", len(denied), denied)
	}
	for i, d := range denied { // newest first: a discard of all, then a retry of ids[0]
		event := map[int]string{0: "", 1: ids[0]}[i%2]
		if d.Action != ops.ActionDenied || d.EventID != event || !strings.Contains(d.Detail, "dead letters") {
			t.Fatalf("refusal audited as %+v; want the event %q named", d, event)
		}
	}
	if denied[len(denied)-1].Actor != "vera" || denied[len(denied)-1].Role != "viewer" {
		t.Fatalf("first refusal audited as %+v; want vera (viewer)", denied[len(denied)-1])
	}

	for _, a := range []ops.Actor{viewer, operator, approver} {
		if _, err := o.Overview(r.ctx, a); err != nil {
			t.Fatalf("%s: overview: %v", a, err)
		}
		if page, err := o.DeadLetters(r.ctx, a, outboxdriver.DeadLetterQuery{Limit: 10}); err != nil || len(page.DeadLetters) != 2 {
			t.Fatalf("%s: dead letters %+v, %v", a, page, err)
		}
		if _, err := o.Audit(r.ctx, a, outboxdriver.AuditQuery{Limit: 10}); err != nil {
			t.Fatalf("%s: audit: %v", a, err)
		}
	}

	moved, err := o.Retry(r.ctx, operator, ids[:1], "broker fixed")
	if err != nil || len(moved) != 1 || moved[0] != ids[0] {
		t.Fatalf("retry = %v, %v", moved, err)
	}
	gone, err := o.Discard(r.ctx, operator, []string{ids[1], "0190a0a0-0000-7000-8000-000000000000"}, "obsolete")
	if err != nil || len(gone) != 1 || gone[0] != ids[1] {
		t.Fatalf("discard = %v, %v; want only the dead letter that exists", gone, err)
	}
	if b, d := r.backlog(t); b != 1 || d != 0 {
		t.Fatalf("backlog %d, dead letters %d; want 1, 0", b, d)
	}
	recs := r.audit(t)
	want := []struct{ action, id, reason string }{{"discard", ids[1], "obsolete"}, {"retry", ids[0], "broker fixed"}}
	for i, w := range want {
		got := recs[i]
		if got.Action != w.action || got.EventID != w.id || got.Actor != "otto" || got.Role != "operator" || got.Reason != w.reason || got.At.IsZero() {
			t.Fatalf("audit row %d = %+v; want %s of %s by otto (operator) for %q", i, got, w.action, w.id, w.reason)
		}
	}
	// The event's audit: the retry, and the four refused retries before it.
	byEvent, err := o.Audit(r.ctx, viewer, outboxdriver.AuditQuery{EventID: ids[0], Limit: 10})
	if err != nil || len(byEvent) != 5 || byEvent[0].Action != "retry" {
		t.Fatalf("audit of event %s = %+v, %v", ids[0], byEvent, err)
	}
	for _, a := range byEvent[1:] {
		if a.Action != ops.ActionDenied {
			t.Fatalf("audit of event %s: %+v; want the retry and four refusals", ids[0], byEvent)
		}
	}
	if older, err := o.Audit(r.ctx, viewer, outboxdriver.AuditQuery{Before: recs[0].ID, Action: "retry", Limit: 10}); err != nil || len(older) != 1 || older[0].ID != recs[1].ID {
		t.Fatalf("audit before %d = %+v, %v", recs[0].ID, older, err)
	}
}

// Bad input is refused before the database, as an *InputError, and
// changes nothing.
func TestBadInput(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	o := r.ops(t, &ops.Config{MaxPage: 50})
	testenv.AddDeadLetters(t, r.pool, r.tb, testenv.DeadLetterRow{AggregateType: "a", AggregateID: "1", Type: "T", LastError: "x"})
	now := time.Now()
	bad := map[string]error{}
	_, bad["limit 0"] = o.DeadLetters(r.ctx, viewer, outboxdriver.DeadLetterQuery{})
	_, bad["limit over the page"] = o.DeadLetters(r.ctx, viewer, outboxdriver.DeadLetterQuery{Limit: 51})
	_, bad["long filter"] = o.DeadLetters(r.ctx, viewer, outboxdriver.DeadLetterQuery{Limit: 5, ErrorContains: strings.Repeat("x", 300)})
	_, bad["since after until"] = o.DeadLetters(r.ctx, viewer, outboxdriver.DeadLetterQuery{Limit: 5, Since: now, Until: now.Add(-time.Hour)})
	_, bad["bad id"] = o.DeadLetter(r.ctx, viewer, "42")
	_, bad["retry of a bad id"] = o.Retry(r.ctx, operator, []string{"'; DROP TABLE x; --"}, "")
	_, bad["retry of no ids"] = o.Retry(r.ctx, operator, []string{}, "")
	_, bad["long reason"] = o.Discard(r.ctx, operator, nil, strings.Repeat("y", 2000))
	_, bad["audit bad event"] = o.Audit(r.ctx, viewer, outboxdriver.AuditQuery{Limit: 5, EventID: "x"})
	_, bad["audit limit"] = o.Audit(r.ctx, viewer, outboxdriver.AuditQuery{Limit: 1000})
	for what, err := range bad {
		var ie *ops.InputError
		if !errors.As(err, &ie) {
			t.Errorf("%s: %v; want an *ops.InputError", what, err)
		}
	}
	if _, err := o.DeadLetter(r.ctx, viewer, "0190a0a0-0000-7000-8000-000000000000"); !errors.Is(err, ops.ErrNotFound) {
		t.Errorf("unknown dead letter: %v; want ErrNotFound", err)
	}
	if b, d := r.backlog(t); b != 0 || d != 1 {
		t.Fatalf("backlog %d, dead letters %d after bad input; want 0, 1", b, d)
	}
	if recs := r.audit(t); len(recs) != 0 {
		t.Fatalf("bad input left audit rows %+v", recs)
	}
}

// Filters select on each field, and pages follow one another without
// gaps or repeats.
func TestFiltersAndPages(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	o := r.ops(t, nil)
	var rows []testenv.DeadLetterRow
	for i := range 7 {
		typ, errText := "OrderPlaced", "broker said NO"
		if i%2 == 1 {
			typ, errText = "OrderPaid", "timeout"
		}
		rows = append(rows, testenv.DeadLetterRow{AggregateType: "order", AggregateID: string(rune('a' + i)), Type: typ, LastError: errText})
	}
	ids := testenv.AddDeadLetters(t, r.pool, r.tb, rows...)
	list := func(q outboxdriver.DeadLetterQuery) outboxdriver.DeadLetterPage {
		t.Helper()
		p, err := o.DeadLetters(r.ctx, viewer, q)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if p := list(outboxdriver.DeadLetterQuery{Type: "OrderPaid", Limit: 10}); len(p.DeadLetters) != 3 || p.Next != nil {
		t.Fatalf("by type: %+v", p)
	}
	if p := list(outboxdriver.DeadLetterQuery{ErrorContains: "said no", Limit: 10}); len(p.DeadLetters) != 4 {
		t.Fatalf("by error text, ignoring case: %d", len(p.DeadLetters))
	}
	if p := list(outboxdriver.DeadLetterQuery{AggregateID: "c", Limit: 10}); len(p.DeadLetters) != 1 || p.DeadLetters[0].ID != ids[2] {
		t.Fatalf("by aggregate id: %+v", p)
	}
	if p := list(outboxdriver.DeadLetterQuery{ErrorContains: "%", Limit: 10}); len(p.DeadLetters) != 0 {
		t.Fatalf("a %% in the error filter matched %d; want it taken literally", len(p.DeadLetters))
	}
	if p := list(outboxdriver.DeadLetterQuery{Since: time.Now().Add(time.Hour), Limit: 10}); len(p.DeadLetters) != 0 {
		t.Fatalf("since an hour ahead: %d", len(p.DeadLetters))
	}
	var got []string
	q := outboxdriver.DeadLetterQuery{Limit: 3}
	for pages := 0; ; pages++ {
		if pages > 3 {
			t.Fatal("more than 3 pages of 3 for 7 dead letters")
		}
		p := list(q)
		for _, d := range p.DeadLetters {
			got = append(got, d.ID)
		}
		if p.Next == nil {
			break
		}
		c, err := outboxdriver.ParseDeadLetterCursor(p.Next.String())
		if err != nil {
			t.Fatal(err)
		}
		q.After = &c
	}
	if strings.Join(got, ",") != strings.Join(ids, ",") {
		t.Fatalf("pages listed %v; want %v", got, ids)
	}
}

// Sensitive paths are masked in the payload, which keeps its key order.
func TestMaskedPayload(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	o := r.ops(t, &ops.Config{SensitivePaths: []string{"customer.email", "cards.*.number"}})
	ids := testenv.AddDeadLetters(t, r.pool, r.tb,
		testenv.DeadLetterRow{AggregateType: "order", AggregateID: "1", Type: "OrderPlaced", LastError: "x", Headers: `{"tenant":"t1"}`,
			Payload: `{"z":1,"customer":{"name":"Ada","email":"ada@example.com"},"cards":[{"number":"4111","exp":"12/30"},{"number":"5500"}],"a":1.50}`})
	v, err := o.DeadLetter(r.ctx, viewer, ids[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"ada@example.com", "4111", "5500"} {
		if strings.Contains(v.Payload, secret) {
			t.Fatalf("payload shows %q:\n%s", secret, v.Payload)
		}
	}
	if v.Masked != 3 || !strings.Contains(v.Payload, `"email": "***"`) || !strings.Contains(v.Payload, `"a": 1.50`) {
		t.Fatalf("masked %d:\n%s", v.Masked, v.Payload)
	}
	if strings.Index(v.Payload, `"z"`) > strings.Index(v.Payload, `"a"`) {
		t.Fatalf("key order lost:\n%s", v.Payload)
	}
	if v.Headers["tenant"] != "t1" || v.Seq == 0 || v.CreatedAt.IsZero() {
		t.Fatalf("detail %+v", v)
	}
	if _, err := ops.New(r.st, r.tb, &ops.Config{SensitivePaths: []string{"a..b"}}); err == nil {
		t.Fatal("a path with an empty segment was accepted")
	}
}

// A destination filter follows the relays' routing, which the dead-letter
// table does not store: under the default routing by aggregate type, under
// routing by event type with a regex, and with a fixed destination; it
// pages like any filter, combines with the others, matches nothing for a
// destination nothing is routed to, and is refused for a routing column it
// cannot select by.
func TestDeadLettersByDestination(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	var rows []testenv.DeadLetterRow
	for i := range 9 {
		agg, typ := "order", "OrderPlaced"
		switch i % 3 {
		case 1:
			agg, typ = "payment", "PaymentFailed"
		case 2:
			agg, typ = "order", "OrderPaid"
		}
		rows = append(rows, testenv.DeadLetterRow{AggregateType: agg, AggregateID: string(rune('a' + i)), Type: typ, LastError: "x"})
	}
	ids := testenv.AddDeadLetters(t, r.pool, r.tb, rows...)
	pick := func(idx ...int) string {
		var out []string
		for _, i := range idx {
			out = append(out, ids[i])
		}
		return strings.Join(out, ",")
	}
	all := func(o *ops.Ops, q outboxdriver.DeadLetterQuery) string {
		t.Helper()
		var got []string
		for pages := 0; ; pages++ {
			if pages > 9 {
				t.Fatal("more pages than dead letters")
			}
			p, err := o.DeadLetters(r.ctx, viewer, q)
			if err != nil {
				t.Fatalf("%+v: %v", q, err)
			}
			for _, d := range p.DeadLetters {
				got = append(got, d.ID)
			}
			if p.Next == nil {
				return strings.Join(got, ",")
			}
			q.After = p.Next
		}
	}
	byType := &route.Config{RouteBy: "type", Regex: `(?P<entity>[A-Z][a-z]+)[A-Z].*`, Replacement: "events.${entity}"}
	for _, c := range []struct {
		name  string
		route *route.Config
		q     outboxdriver.DeadLetterQuery
		want  string
	}{
		{"default routing", nil, outboxdriver.DeadLetterQuery{Destination: "outbox.event.order", Limit: 2}, pick(0, 2, 3, 5, 6, 8)},
		{"default routing and a type", nil, outboxdriver.DeadLetterQuery{Destination: "outbox.event.order", Type: "OrderPaid", Limit: 2}, pick(2, 5, 8)},
		{"default routing, another", nil, outboxdriver.DeadLetterQuery{Destination: "outbox.event.payment", Limit: 50}, pick(1, 4, 7)},
		{"nothing routed there", nil, outboxdriver.DeadLetterQuery{Destination: "outbox.event.nope", Limit: 50}, ""},
		{"by type, a regex", byType, outboxdriver.DeadLetterQuery{Destination: "events.Order", Limit: 4}, pick(0, 2, 3, 5, 6, 8)},
		{"by type, the aggregate type is no destination", byType, outboxdriver.DeadLetterQuery{Destination: "outbox.event.order", Limit: 4}, ""},
		{"by aggregate id", &route.Config{RouteBy: "aggregateid"}, outboxdriver.DeadLetterQuery{Destination: "outbox.event.e", Limit: 4}, pick(4)},
		{"fixed destination", &route.Config{Destination: "all-events"}, outboxdriver.DeadLetterQuery{Destination: "all-events", Limit: 4}, pick(0, 1, 2, 3, 4, 5, 6, 7, 8)},
	} {
		o := r.ops(t, &ops.Config{Route: c.route})
		if got := all(o, c.q); got != c.want {
			t.Errorf("%s: listed %v; want %v", c.name, got, c.want)
		}
	}
	o := r.ops(t, &ops.Config{Route: &route.Config{RouteBy: "created_at"}})
	_, err := o.DeadLetters(r.ctx, viewer, outboxdriver.DeadLetterQuery{Destination: "outbox.event.x", Limit: 5})
	var input *ops.InputError
	if !errors.As(err, &input) || input.Field != "destination" {
		t.Fatalf("routing by created_at: %v; want an input error on destination", err)
	}
	if _, err := o.DeadLetters(r.ctx, viewer, outboxdriver.DeadLetterQuery{Destination: strings.Repeat("d", 300), Limit: 5}); !errors.As(err, &input) {
		t.Fatalf("a long destination: %v; want an input error", err)
	}
}
