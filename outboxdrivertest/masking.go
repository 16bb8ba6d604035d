package outboxdrivertest

import (
	"strings"
	"testing"

	"github.com/outboxkit/outbox/outboxdriver"
)

// testMasking: the masking stored with the table. A path is stored once
// per scope (a second add changes nothing and writes no audit row), listed
// by aggregate type, event type and path with who stored it, removed
// once; every change writes its audit row in the same transaction; a
// path the Store cannot hold is refused before the database; and text a
// caller chose (quotes, SQL, non-ASCII) is stored as it is.
func (s *suite) testMasking(t *testing.T) {
	e := s.newEnv(t, 2)
	st := s.h.Store
	by := outboxdriver.Acting{Name: "drivertest", Role: "operator", Reason: "conformance"}

	if ps, err := st.MaskPaths(e.ctx, e.table); err != nil || len(ps) != 0 {
		t.Fatalf("MaskPaths on a new table = %v, %v; want none", ps, err)
	}
	hostileType := `Ordér'); DROP TABLE x; --`
	adds := []outboxdriver.MaskPath{
		{Path: "customer.email", Source: outboxdriver.MaskSourceOperator},
		{AggregateType: "order", Path: "card.number", Source: outboxdriver.MaskSourceOperator},
		{AggregateType: "order", Type: hostileType, Path: "card.*.cvc", Source: "contract order/Placed"},
		{Type: "Placed", Path: "customer.email", Source: outboxdriver.MaskSourceOperator}, // same path, another scope
	}
	for _, p := range adds {
		ok, err := st.AddMaskPath(e.ctx, e.table, p, by)
		if err != nil || !ok {
			t.Fatalf("AddMaskPath(%v) = %v, %v; want true", p, ok, err)
		}
	}
	if ok, err := st.AddMaskPath(e.ctx, e.table, outboxdriver.MaskPath{Path: "customer.email", Source: "contract other"}, by); err != nil || ok {
		t.Fatalf("AddMaskPath of a path stored for its scope already = %v, %v; want false and no error", ok, err)
	}
	for _, bad := range []outboxdriver.MaskPath{
		{Path: "", Source: outboxdriver.MaskSourceOperator},
		{Path: "a..b", Source: outboxdriver.MaskSourceOperator},
		{Path: "a.b\x1b[2J", Source: outboxdriver.MaskSourceOperator},
		{Path: strings.Repeat("a", outboxdriver.MaxMaskText+1), Source: outboxdriver.MaskSourceOperator},
		{Path: "a", Source: ""},
		{Path: "a", AggregateType: "x\ny", Source: outboxdriver.MaskSourceOperator},
	} {
		if ok, err := st.AddMaskPath(e.ctx, e.table, bad, by); err == nil || ok {
			t.Errorf("AddMaskPath(%q) = %v, %v; want it refused", bad.Path, ok, err)
		}
	}

	ps, err := st.MaskPaths(e.ctx, e.table)
	if err != nil {
		t.Fatalf("MaskPaths: %v", err)
	}
	want := []outboxdriver.MaskPath{adds[0], adds[3], adds[1], adds[2]} // by aggregate type, type, path
	if len(ps) != len(want) {
		t.Fatalf("MaskPaths = %v; want %v", ps, want)
	}
	for i, p := range ps {
		w := want[i]
		if p.AggregateType != w.AggregateType || p.Type != w.Type || p.Path != w.Path || p.Source != w.Source || p.Actor != by.Name || p.At.IsZero() {
			t.Errorf("MaskPaths[%d] = %+v; want %+v stored by %s with a time", i, p, w, by.Name)
		}
	}

	if ok, err := st.RemoveMaskPath(e.ctx, e.table, outboxdriver.MaskPath{AggregateType: "order", Path: "card.number"}, by); err != nil || !ok {
		t.Fatalf("RemoveMaskPath = %v, %v; want true", ok, err)
	}
	if ok, err := st.RemoveMaskPath(e.ctx, e.table, outboxdriver.MaskPath{AggregateType: "order", Path: "card.number"}, by); err != nil || ok {
		t.Fatalf("RemoveMaskPath of a path no longer stored = %v, %v; want false", ok, err)
	}
	if ps, err := st.MaskPaths(e.ctx, e.table); err != nil || len(ps) != 3 {
		t.Fatalf("MaskPaths after a removal = %v, %v; want 3", ps, err)
	}

	audit, err := st.FindAudit(e.ctx, e.table, outboxdriver.AuditQuery{Limit: 100})
	if err != nil {
		t.Fatalf("FindAudit: %v", err)
	}
	var added, removed int
	for _, r := range audit {
		switch r.Action {
		case "mask-add":
			added++
		case "mask-remove":
			removed++
			if !strings.Contains(r.Detail, "card.number (aggregatetype=order), from operator") || r.Actor != by.Name || r.Role != by.Role || r.Reason != by.Reason {
				t.Errorf("the audit row of a removal = %+v; want the path, its scope and source, and who and why", r)
			}
		}
	}
	if added != len(adds) || removed != 1 {
		t.Errorf("audit rows: %d mask-add, %d mask-remove; want %d and 1 (one per change, none for what changed nothing)", added, removed, len(adds))
	}
}
