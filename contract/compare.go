package contract

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Change is one breaking difference between two registries.
type Change struct {
	// Contract names the contract (aggregatetype/type/vN).
	Contract string `json:"contract"`
	// Path is the payload location, dot-separated ("" for the whole
	// payload, [] for an array's items).
	Path string `json:"path"`
	// Kind is removed-contract, removed-field, retyped, newly-required,
	// narrowed-enum, closed (additionalProperties false) or changed-ref.
	Kind string `json:"kind"`
	// Detail says what changed, in words.
	Detail string `json:"detail"`
}

func (c Change) String() string {
	at := c.Path
	if at == "" {
		at = "(payload)"
	}
	return fmt.Sprintf("%s %s: %s: %s", c.Contract, at, c.Kind, c.Detail)
}

// Compare returns the breaking changes from old to new: what a consumer
// written against a contract in old would no longer get, or what a
// producer valid under old would now be refused for. Every contract
// version of old must still be in new, with a schema that accepts at
// least what it accepted: no field removed or retyped, no field newly
// required, no enum narrowed, no object closed. Adding versions, optional
// fields, enum values or widening a type (integer to number) is not
// breaking. The comparison reads the schemas' properties, items, type,
// enum, required and additionalProperties; a $ref that changed is
// reported rather than followed.
func Compare(old, new *Registry) []Change {
	var out []Change
	for _, oc := range old.Contracts() {
		nc, _ := new.Lookup(oc.AggregateType, oc.Type, fmt.Sprint(oc.Version))
		if nc == nil {
			out = append(out, Change{Contract: oc.String(), Kind: "removed-contract", Detail: "the contract version is gone from the new registry"})
			continue
		}
		cmp := comparer{contract: oc.String()}
		cmp.schema("", oc.doc, nc.doc)
		out = append(out, cmp.changes...)
	}
	return out
}

type comparer struct {
	contract string
	changes  []Change
}

func (c *comparer) add(path, kind, format string, args ...any) {
	c.changes = append(c.changes, Change{Contract: c.contract, Path: path, Kind: kind, Detail: fmt.Sprintf(format, args...)})
}

func join(path, seg string) string {
	if path == "" {
		return seg
	}
	return path + "." + seg
}

func (c *comparer) schema(path string, oldS, newS any) {
	o, _ := oldS.(map[string]any)
	n, _ := newS.(map[string]any)
	if b, ok := newS.(bool); ok && !b {
		if ob, ok := oldS.(bool); !ok || ob {
			c.add(path, "removed-field", "the new schema accepts nothing here (false)")
		}
		return
	}
	if o == nil || n == nil {
		return // true or absent: accepts anything
	}
	if or, nr := o["$ref"], n["$ref"]; or != nr {
		c.add(path, "changed-ref", "$ref %v became %v; compare the referenced schemas yourself", or, nr)
	}
	ot, nt := types(o), types(n)
	if nt != nil {
		var lost []string
		if ot == nil {
			lost = []string{"any type"}
		}
		for _, t := range ot {
			if !slices.Contains(nt, t) && (t != "integer" || !slices.Contains(nt, "number")) {
				lost = append(lost, t)
			}
		}
		if len(lost) > 0 {
			c.add(path, "retyped", "type %s became %s", typeText(ot), typeText(nt))
		}
	}
	if ne, ok := n["enum"].([]any); ok {
		oe, had := o["enum"].([]any)
		if !had {
			c.add(path, "narrowed-enum", "an enum of %d value(s) now restricts a field that took any value", len(ne))
		} else {
			var gone []string
			for _, v := range oe {
				if !slices.ContainsFunc(ne, func(w any) bool { return jsonText(v) == jsonText(w) }) {
					gone = append(gone, jsonText(v))
				}
			}
			if len(gone) > 0 {
				c.add(path, "narrowed-enum", "enum value(s) %s removed", strings.Join(gone, ", "))
			}
		}
	}
	oreq, nreq := strs(o["required"]), strs(n["required"])
	for _, r := range nreq {
		if !slices.Contains(oreq, r) {
			c.add(join(path, r), "newly-required", "the field is required now; producers that leave it out are refused")
		}
	}
	if ap, ok := n["additionalProperties"].(bool); ok && !ap {
		if oap, ok := o["additionalProperties"].(bool); !ok || oap {
			c.add(path, "closed", "additionalProperties is false now: fields the old schema allowed are refused")
		}
	}
	oprops, _ := o["properties"].(map[string]any)
	nprops, _ := n["properties"].(map[string]any)
	for _, name := range sortedKeys(oprops) {
		np, ok := nprops[name]
		if !ok {
			c.add(join(path, name), "removed-field", "the field is gone from the contract")
			continue
		}
		c.schema(join(path, name), oprops[name], np)
	}
	if oi, ok := o["items"]; ok {
		if ni, ok := n["items"]; ok {
			c.schema(join(path, "[]"), oi, ni)
		}
	}
}

func types(s map[string]any) []string {
	switch t := s["type"].(type) {
	case string:
		return []string{t}
	case []any:
		return strs(t)
	}
	return nil
}

func typeText(ts []string) string {
	if ts == nil {
		return "(any)"
	}
	return strings.Join(ts, "|")
}

func strs(v any) []string {
	a, _ := v.([]any)
	var out []string
	for _, x := range a {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

func sortedKeys(m map[string]any) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}
