package contract_test

import (
	"strings"
	"testing"

	"github.com/outboxkit/outbox/contract"
)

func TestCompareFindsBreakingChangesOnly(t *testing.T) {
	const index = `{"contracts": [{"aggregatetype": "order", "type": "OrderPlaced", "version": 1, "schema": "s.json"}]}`
	const base = `{"type": "object", "required": ["id"], "properties": {
		"id": {"type": "integer"},
		"status": {"type": "string", "enum": ["new", "paid"]},
		"note": {"type": "string"},
		"lines": {"type": "array", "items": {"type": "object", "properties": {"qty": {"type": "integer"}}}}}}`
	cases := []struct {
		name, schema string
		index        string // "" for the same index
		want         []string
	}{
		{"unchanged", base, "", nil},
		{"optional field added", strings.Replace(base, `"note":`, `"extra": {"type": "string"}, "note":`, 1), "", nil},
		{"enum value added", strings.Replace(base, `["new", "paid"]`, `["new", "paid", "shipped"]`, 1), "", nil},
		{"integer widened to number", strings.Replace(base, `"id": {"type": "integer"}`, `"id": {"type": "number"}`, 1), "", nil},
		{"requirement dropped", strings.Replace(base, `"required": ["id"]`, `"required": []`, 1), "", nil},
		{"new version added", base, `{"contracts": [{"aggregatetype": "order", "type": "OrderPlaced", "version": 1, "schema": "s.json"}, {"aggregatetype": "order", "type": "OrderPlaced", "version": 2, "schema": "s.json"}]}`, nil},
		{"field removed", strings.Replace(base, `"note": {"type": "string"},`, ``, 1), "", []string{"note: removed-field"}},
		{"field retyped", strings.Replace(base, `"note": {"type": "string"}`, `"note": {"type": "integer"}`, 1), "", []string{"note: retyped"}},
		{"number narrowed to integer", strings.Replace(base, `"qty": {"type": "integer"}`, `"qty": {"type": "string"}`, 1), "", []string{"lines.[].qty: retyped"}},
		{"field newly required", strings.Replace(base, `"required": ["id"]`, `"required": ["id", "note"]`, 1), "", []string{"note: newly-required"}},
		{"enum narrowed", strings.Replace(base, `["new", "paid"]`, `["new"]`, 1), "", []string{`status: narrowed-enum: enum value(s) "paid" removed`}},
		{"enum imposed", strings.Replace(base, `"note": {"type": "string"}`, `"note": {"type": "string", "enum": ["a"]}`, 1), "", []string{"note: narrowed-enum"}},
		{"object closed", strings.Replace(base, `"type": "object", "required"`, `"type": "object", "additionalProperties": false, "required"`, 1), "", []string{"(payload): closed"}},
		{"contract removed", base, `{"contracts": [{"aggregatetype": "order", "type": "OrderPlaced", "version": 2, "schema": "s.json"}]}`, []string{"order/OrderPlaced/v1 (payload): removed-contract"}},
	}
	old := load(t, writeRegistry(t, map[string]string{"contracts.json": index, "s.json": base}))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			idx := c.index
			if idx == "" {
				idx = index
			}
			n := load(t, writeRegistry(t, map[string]string{"contracts.json": idx, "s.json": c.schema}))
			got := contract.Compare(old, n)
			if len(got) != len(c.want) {
				t.Fatalf("Compare: %q; want %d change(s) %q", got, len(c.want), c.want)
			}
			for i, w := range c.want {
				if !strings.Contains(got[i].String(), w) {
					t.Errorf("change %d: %q, want it to say %q", i, got[i], w)
				}
			}
		})
	}
}
