package ops

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"

	"github.com/outboxkit/outbox/outboxdriver"
)

// Change is one difference a repair makes: a field of the payload or a
// header added, removed or changed. Values are JSON text as shown to
// users: a value at a sensitive path shows Mask, so a change of a masked
// value is listed without either value.
type Change struct {
	// In is "payload" or "headers".
	In string `json:"in"`
	// Path is the field's dot-separated path in the payload ("" for the
	// payload as a whole; array elements by index), or the header's name.
	Path string `json:"path"`
	// Kind is "added", "removed" or "changed".
	Kind   string `json:"kind"`
	Before string `json:"before,omitempty"`
	After  string `json:"after,omitempty"`
}

// RepairDiff is what a repair request changes in its dead letter, as an
// approver reviews it.
type RepairDiff struct {
	// Proposed is the proposed payload as shown to users: indented, masked
	// with the event's sensitive paths ("" when the payload is kept).
	Proposed string
	// Changes lists the differences, the payload's first (in the order of
	// its fields) and then the headers' (by name); at most MaxChanges.
	Changes []Change
	// More counts the changes past MaxChanges.
	More int
}

// MaxChanges is the most changes a RepairDiff lists.
const MaxChanges = 200

// DiffRepair compares the payload and headers p proposes with those of
// its dead letter now. It wraps ErrNotFound when the dead letter is gone.
func (o *Ops) DiffRepair(ctx context.Context, a Actor, p RepairParams) (RepairDiff, error) {
	var rd RepairDiff
	if err := o.Allow(ctx, a, "view a repair", Read, Subject{Event: p.EventID}); err != nil {
		return rd, err
	}
	id, err := ParseID(p.EventID)
	if err != nil {
		return rd, err
	}
	d, err := o.st.DeadLetter(ctx, o.t, id)
	if err != nil {
		return rd, err
	}
	paths, masks, err := o.sensitiveFor(ctx, d.AggregateType, d.Type)
	if err != nil {
		return rd, err
	}
	add := func(c Change) {
		if len(rd.Changes) < MaxChanges {
			rd.Changes = append(rd.Changes, c)
		} else {
			rd.More++
		}
	}
	if p.Payload != nil {
		rd.Proposed = o.viewMasked(outboxdriver.DeadLetterDetail{Payload: p.Payload}, -1, paths, masks).Payload
		before, errB := decodeTree(json.NewDecoder(bytes.NewReader(d.Payload)), 0)
		after, errA := decodeTree(json.NewDecoder(bytes.NewReader(p.Payload)), 0)
		switch {
		case errA != nil: // checked when proposed: cannot happen
		case d.Payload == nil || errB != nil: // none, or not JSON: replaced whole
			add(Change{In: "payload", Kind: "changed", Before: "(not JSON, or none)", After: shown(after, masks)})
		default:
			diffTree(nil, before, after, masks, add)
		}
	}
	if p.Headers != nil {
		names := make([]string, 0, len(d.Headers)+len(p.Headers))
		for k := range d.Headers {
			names = append(names, k)
		}
		for k := range p.Headers {
			if _, ok := d.Headers[k]; !ok {
				names = append(names, k)
			}
		}
		slices.Sort(names)
		for _, k := range names {
			was, had := d.Headers[k]
			is, has := p.Headers[k]
			switch {
			case had && !has:
				add(Change{In: "headers", Path: k, Kind: "removed", Before: strconv.Quote(was)})
			case !had && has:
				add(Change{In: "headers", Path: k, Kind: "added", After: strconv.Quote(is)})
			case was != is:
				add(Change{In: "headers", Path: k, Kind: "changed", Before: strconv.Quote(was), After: strconv.Quote(is)})
			}
		}
	}
	return rd, nil
}

// diffTree reports to add how b differs from a at path: objects by key (in
// a's order, then b's new keys), arrays by index, anything else by value.
func diffTree(path []string, a, b *jnode, masks [][]string, add func(Change)) {
	at := strings.Join(path, ".")
	if masked(path, masks) { // one change, naming nothing inside
		if compact(a) != compact(b) {
			add(Change{In: "payload", Path: at, Kind: "changed", Before: strconv.Quote(Mask), After: strconv.Quote(Mask)})
		}
		return
	}
	switch {
	case a.kind == '{' && b.kind == '{':
		for i, k := range a.keys {
			if j := slices.Index(b.keys, k); j >= 0 {
				diffTree(append(path[:len(path):len(path)], k), a.vals[i], b.vals[j], masks, add)
			} else {
				p := append(path[:len(path):len(path)], k)
				add(Change{In: "payload", Path: strings.Join(p, "."), Kind: "removed", Before: shownAt(p, a.vals[i], masks)})
			}
		}
		for j, k := range b.keys {
			if !slices.Contains(a.keys, k) {
				p := append(path[:len(path):len(path)], k)
				add(Change{In: "payload", Path: strings.Join(p, "."), Kind: "added", After: shownAt(p, b.vals[j], masks)})
			}
		}
	case a.kind == '[' && b.kind == '[':
		for i := range max(len(a.vals), len(b.vals)) {
			p := append(path[:len(path):len(path)], strconv.Itoa(i))
			switch {
			case i >= len(b.vals):
				add(Change{In: "payload", Path: strings.Join(p, "."), Kind: "removed", Before: shownAt(p, a.vals[i], masks)})
			case i >= len(a.vals):
				add(Change{In: "payload", Path: strings.Join(p, "."), Kind: "added", After: shownAt(p, b.vals[i], masks)})
			default:
				diffTree(p, a.vals[i], b.vals[i], masks, add)
			}
		}
	default:
		if compact(a) != compact(b) {
			add(Change{In: "payload", Path: at, Kind: "changed", Before: shownAt(path, a, masks), After: shownAt(path, b, masks)})
		}
	}
}

// compact is n as one line of JSON, to compare values.
func compact(n *jnode) string {
	var b strings.Builder
	n.write(&b, "")
	var c bytes.Buffer
	if json.Compact(&c, []byte(b.String())) != nil {
		return b.String()
	}
	return c.String()
}

// masked reports whether a sensitive path covers path: the value there is
// shown as Mask.
func masked(path []string, masks [][]string) bool {
	for _, m := range masks {
		if len(m) <= len(path) && matches(m, path[:len(m)]) {
			return true
		}
	}
	return false
}

// shownAt is the value n at path as shown to users, one line: Mask when a
// sensitive path covers path, else n with the sensitive paths below it
// masked.
func shownAt(path []string, n *jnode, masks [][]string) string {
	if masked(path, masks) {
		return strconv.Quote(Mask)
	}
	var below [][]string
	for _, m := range masks {
		if len(m) > len(path) && matches(m[:len(path)], path) {
			below = append(below, m[len(path):])
		}
	}
	return shown(n, below)
}

// shown is n, one line, with the values at masks (relative to n) masked.
func shown(n *jnode, masks [][]string) string {
	cp, err := decodeTree(json.NewDecoder(strings.NewReader(compact(n))), 0)
	if err != nil {
		return compact(n)
	}
	for _, m := range masks {
		cp.mask(m)
	}
	return compact(cp)
}

// matches reports whether the segments of a mask match those of a path
// of the same length (* matches any key or index).
func matches(mask, path []string) bool {
	for i := range mask {
		if mask[i] != "*" && mask[i] != path[i] {
			return false
		}
	}
	return true
}
