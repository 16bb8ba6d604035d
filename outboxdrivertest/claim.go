package outboxdrivertest

import (
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
)

// testAtomicity (G1): a committed Write is claimable, a rolled-back one
// never is.
func (s *suite) testAtomicity(t *testing.T) {
	e := s.newEnv(t, partitions)
	committed := []outbox.Event{ev("a", 0), ev("a", 1), ev("b", 0)}
	e.rollback(ev("a", -1), ev("c", -1))
	e.write(committed[:2]...)
	e.rollback(ev("b", -1))
	e.write(committed[2])
	src := e.source(outboxdriver.SourceConfig{})
	got := e.claim(src, e.leaseAll(src), 100)
	if !sameIDs(ids(got), eventIDs(committed...)) {
		t.Fatalf("claimed %v; want exactly the committed a/0 a/1 b/0, in order (rolled-back events must not exist)", describe(got))
	}
	if st := e.status(); st.Backlog != 3 {
		t.Fatalf("backlog %d, want the 3 committed events", st.Backlog)
	}
}

// testPlainSQLInsert: rows inserted with plain SQL and only the columns of
// the table contract are claimed, with the rest filled in by the database.
func (s *suite) testPlainSQLInsert(t *testing.T) {
	e := s.newEnv(t, partitions)
	type row struct{ id, aggType, aggID, typ, payload string }
	rows := []row{
		{newID(), "order", "42", "OrderPlaced", `{"orderId": 42}`},
		{newID(), "order", "42", "OrderPaid", `{"orderId": 42, "paid": true}`},
		{newID(), "invoice", "7", "InvoiceSent", `{"lines": [1, 2, 3]}`},
	}
	for _, r := range rows {
		if err := s.h.ExecInsert(e.ctx, e.table, r.id, r.aggType, r.aggID, r.typ, r.payload); err != nil {
			t.Fatalf("plain SQL insert: %v", err)
		}
	}
	src := e.source(outboxdriver.SourceConfig{})
	got := e.claim(src, e.leaseAll(src), 10)
	if len(got) != len(rows) {
		t.Fatalf("claimed %d rows inserted by plain SQL, want %d", len(got), len(rows))
	}
	var lastSeq int64
	for i, r := range rows {
		g := got[i]
		if g.ID != r.id || g.AggregateType != r.aggType || g.AggregateID != r.aggID || g.Type != r.typ {
			t.Fatalf("record %d = %s %s/%s %s; want %s %s/%s %s", i, g.ID, g.AggregateType, g.AggregateID, g.Type, r.id, r.aggType, r.aggID, r.typ)
		}
		if !jsonEqual(g.Payload, []byte(r.payload)) {
			t.Fatalf("record %d payload %q, want the JSON %s", i, g.Payload, r.payload)
		}
		if g.Seq <= lastSeq {
			t.Fatalf("record %d seq %d after %d: want a position filled in, growing with insertion order", i, g.Seq, lastSeq)
		}
		lastSeq = g.Seq
		if g.Partition < 0 || g.Partition >= partitions {
			t.Fatalf("record %d partition %d, want one of the %d migrated", i, g.Partition, partitions)
		}
		if g.Attempts != 0 || len(g.Headers) != 0 || g.TraceContext != "" {
			t.Fatalf("record %d attempts %d headers %v trace %q; want 0, none, none", i, g.Attempts, g.Headers, g.TraceContext)
		}
		if g.CreatedAt.IsZero() || time.Since(g.CreatedAt).Abs() > time.Hour {
			t.Fatalf("record %d created_at %v; want the time of the insert (now is %v)", i, g.CreatedAt, time.Now())
		}
	}
	if got[0].Partition != got[1].Partition {
		t.Fatalf("one aggregate in partitions %d and %d; want it in one", got[0].Partition, got[1].Partition)
	}
}

// testRecordFields: a record carries every field written: id, aggregate
// type and id, type, JSON payload, raw payload, no payload, headers and
// the W3C trace context of the writer's context.
func (s *suite) testRecordFields(t *testing.T) {
	e := s.newEnv(t, partitions)
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled,
	})
	ctx := trace.ContextWithSpanContext(e.ctx, sc)
	const wantTrace = "traceparent=00-01020300000000000000000000000000-0405060000000000-01"
	events := []outbox.Event{
		{ID: newID(), AggregateType: "order", AggregateID: "42", Type: "OrderPlaced",
			// Key order, spacing and number spelling a JSON encoder
			// would change: a consumer may verify a signature over these
			// bytes.
			Payload: []byte(`{ "total": 9.50, "items": [{"sku": "a-1", "qty": 2}],  "note": "ünïcødé", "a": 1e2}`),
			Headers: map[string]string{"tenant": "acme", "x-request-id": "r-1"}},
		{ID: newID(), AggregateType: "blob", AggregateID: "7", Type: "Raw", RawPayload: []byte{0, 1, 2, 0xff, '{'}},
		{ID: newID(), AggregateType: "order", AggregateID: "42", Type: "OrderPinged"},
	}
	if err := s.h.Write(ctx, e.table, true, events...); err != nil {
		t.Fatalf("write: %v", err)
	}
	src := e.source(outboxdriver.SourceConfig{})
	got := e.claim(src, e.leaseAll(src), 10)
	if len(got) != 3 {
		t.Fatalf("claimed %d records, want 3", len(got))
	}
	for i, w := range events {
		g := got[i]
		if g.ID != w.ID || g.AggregateType != w.AggregateType || g.AggregateID != w.AggregateID || g.Type != w.Type {
			t.Fatalf("record %d = %s %s/%s %s; want %s %s/%s %s", i, g.ID, g.AggregateType, g.AggregateID, g.Type, w.ID, w.AggregateType, w.AggregateID, w.Type)
		}
		if g.TraceContext != wantTrace {
			t.Fatalf("record %d trace context %q, want %q", i, g.TraceContext, wantTrace)
		}
		if g.Attempts != 0 || g.CreatedAt.IsZero() {
			t.Fatalf("record %d attempts %d created %v; want 0 and a time", i, g.Attempts, g.CreatedAt)
		}
	}
	if s.h.NormalizesJSON {
		if !jsonEqual(got[0].Payload, events[0].Payload) {
			t.Fatalf("JSON payload %q, want the JSON %s", got[0].Payload, events[0].Payload)
		}
	} else if string(got[0].Payload) != string(events[0].Payload) {
		t.Fatalf("JSON payload %q, want %q byte for byte", got[0].Payload, events[0].Payload)
	}
	if fmt.Sprint(got[0].Headers) != fmt.Sprint(events[0].Headers) {
		t.Fatalf("headers %v, want %v", got[0].Headers, events[0].Headers)
	}
	if string(got[1].Payload) != string(events[1].RawPayload) {
		t.Fatalf("raw payload %q, want %q byte for byte", got[1].Payload, events[1].RawPayload)
	}
	if len(got[1].Headers) != 0 {
		t.Fatalf("headers %v of an event written without any", got[1].Headers)
	}
	if got[2].Payload != nil {
		t.Fatalf("payload %q of an event written without one, want nil", got[2].Payload)
	}
	if got[0].Partition != got[2].Partition {
		t.Fatalf("aggregate order/42 in partitions %d and %d", got[0].Partition, got[2].Partition)
	}
}

// testInsert: a driver that holds a pool inserts rows in a transaction of
// its own (outbox.Outbox.Write), in order, and they are claimed like any
// others.
func (s *suite) testInsert(t *testing.T) {
	e := s.newEnv(t, partitions)
	ins := s.h.Store
	rows := []outboxdriver.Row{
		{ID: newID(), AggregateType: "order", AggregateID: "1", Type: "Placed", Payload: []byte(`{"n": 1}`)},
		{ID: newID(), AggregateType: "order", AggregateID: "1", Type: "Paid"},
	}
	if err := ins.Insert(e.ctx, e.table, rows); err != nil {
		t.Fatalf("Insert: %v", err)
	}
	err := ins.Insert(e.ctx, e.table, rows[:1])
	src := e.source(outboxdriver.SourceConfig{})
	got := e.claim(src, e.leaseAll(src), 10)
	if err == nil {
		t.Fatal("Insert of an id that exists succeeded")
	}
	if len(got) != 2 || got[0].ID != rows[0].ID || got[1].ID != rows[1].ID {
		t.Fatalf("claimed %v after Insert, want the two rows in order and nothing of the refused insert", got)
	}
}

// testClaimOrderLimitPartitions: Claim returns records in insertion order,
// never more than limit, and only of the leased partitions.
func (s *suite) testClaimOrderLimitPartitions(t *testing.T) {
	e := s.newEnv(t, partitions)
	var written []outbox.Event
	for tx := range 10 {
		var batch []outbox.Event
		for k := range 3 {
			n := tx*3 + k
			batch = append(batch, ev(fmt.Sprint("agg-", n%6), n/6))
		}
		e.write(batch...)
		written = append(written, batch...)
	}
	want := eventIDs(written...)
	src := e.source(outboxdriver.SourceConfig{})
	leases := e.leaseAll(src)
	for _, limit := range []int{1, 10, 29} {
		got := e.claim(src, leases, limit)
		if !sameIDs(ids(got), want[:limit]) {
			t.Fatalf("claim of %d = %v; want the first %d written, in insertion order", limit, describe(got), limit)
		}
	}
	all := e.claim(src, leases, 1000)
	if !sameIDs(ids(all), want) {
		t.Fatalf("claim of 1000 = %v; want all %d written, in insertion order", describe(all), len(want))
	}
	for i := 1; i < len(all); i++ {
		if all[i].Seq <= all[i-1].Seq {
			t.Fatalf("seq %d follows %d: claims must be in seq order", all[i].Seq, all[i-1].Seq)
		}
	}
	// Only the leased partitions: lease just agg-0's.
	p := all[0].Partition
	var one []outboxdriver.Lease
	for _, l := range leases {
		if l.Partition == p {
			one = append(one, l)
		}
	}
	var inP []string
	for _, r := range all {
		if r.Partition == p {
			inP = append(inP, r.ID)
		}
	}
	got := e.claim(src, one, 1000)
	if !sameIDs(ids(got), inP) {
		t.Fatalf("claim under the lease of partition %d = %v; want exactly that partition's %d records, in order", p, describe(got), len(inP))
	}
	if got := e.claim(src, nil, 10); len(got) != 0 {
		t.Fatalf("claim without leases = %v; want an empty batch", describe(got))
	}
}

// testClaimExcludesBusyPartitions: while a batch is open, no other claim,
// of the same Source or another one of the same relay, returns records of
// the partitions that batch holds; records of other partitions stay
// claimable.
func (s *suite) testClaimExcludesBusyPartitions(t *testing.T) {
	e := s.newEnv(t, partitions)
	var first []outbox.Event
	for n := range 5 {
		first = append(first, ev("busy", n))
	}
	e.write(first...)
	var others []outbox.Event
	for n := range 16 {
		others = append(others, ev(fmt.Sprint("other-", n), 0))
	}
	e.write(others...)
	name := "relay-busy"
	a := e.source(outboxdriver.SourceConfig{RelayName: name})
	leases := e.leaseAll(a)
	// Claim the busy aggregate's partition alone: a batch may hold every
	// partition it was claimed under, and the others must stay claimable.
	peek := e.claim(a, leases, 1)
	if len(peek) != 1 {
		t.Fatalf("claimed %v, want busy/0", describe(peek))
	}
	var mine []outboxdriver.Lease
	for _, l := range leases {
		if l.Partition == peek[0].Partition {
			mine = append(mine, l)
		}
	}
	held := e.open(a, mine, 5)
	if !sameIDs(ids(held.Records()), eventIDs(first...)) {
		t.Fatalf("first claim = %v, want busy/0..4", describe(held.Records()))
	}
	busy := map[int]bool{held.Records()[0].Partition: true}
	check := func(what string, recs []outboxdriver.Record) {
		t.Helper()
		for _, r := range recs {
			if busy[r.Partition] {
				t.Fatalf("%s claimed %s of partition %d while another batch holds that partition", what, describe([]outboxdriver.Record{r}), r.Partition)
			}
		}
	}
	second := e.open(a, leases, 100)
	check("a second claim of the same source", second.Records())
	if len(second.Records()) == 0 && !s.h.SingleRelay {
		t.Fatalf("a second claim found nothing; want the events of the %d aggregates outside the busy partition", len(others))
	}
	for _, r := range second.Records() {
		busy[r.Partition] = true
	}
	b := e.source(outboxdriver.SourceConfig{RelayName: name})
	check("another source's claim", e.claim(b, leases, 100))
	second.Release(e.ctx)
	busy = map[int]bool{held.Records()[0].Partition: true}
	got := e.claim(b, leases, 100)
	check("another source's claim", got)
	if len(got) == 0 && !s.h.SingleRelay {
		t.Fatal("another source's claim found nothing after the second batch was released")
	}
	held.Release(e.ctx)
	if got := e.claim(b, leases, 100); len(got) != len(first)+len(others) {
		t.Fatalf("after every batch was released a claim found %d records, want all %d (released untouched)", len(got), len(first)+len(others))
	}
}
