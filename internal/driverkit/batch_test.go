package driverkit

import (
	"slices"
	"testing"
)

// TestClashingEvents checks which dead letters' events are kept out of
// the dead-letter table: another seq held under the id, or a second event
// of the batch with one id; not an event held already under its own seq.
func TestClashingEvents(t *testing.T) {
	type ev struct {
		id  string
		seq int64
	}
	again := &ev{"a", 5}                      // read again after a crash: held under its own seq
	reused := &ev{"b", 9}                     // the dead letters hold b under seq 3
	first, second := &ev{"c", 7}, &ev{"c", 8} // two events of the batch with one id
	fresh := &ev{"d", 1}
	byID := map[string][]*ev{"a": {again}, "b": {reused}, "c": {second, first}, "d": {fresh}}
	held := map[string][]int64{"a": {5}, "b": {3}}
	kept, ids, whole := ClashingEvents([]string{"a", "b", "c", "d"}, held, byID, func(e *ev) int64 { return e.seq })
	if len(kept) != 2 || !kept[reused] || !kept[second] {
		t.Errorf("kept %v, want the reused id's event and the second of c", kept)
	}
	if !slices.Equal(ids, []string{"b", "c"}) {
		t.Errorf("ids %v, want [b c]", ids)
	}
	if !slices.Equal(whole, []string{"b"}) {
		t.Errorf("ids all of whose events are kept %v, want [b] (c's first event goes to the dead letters)", whole)
	}
	p := Plan{Hold: []string{"b", "c"}, Flow: []string{"b", "d"}}
	p.DropHoldAndFlow(whole)
	if !slices.Equal(p.Hold, []string{"c"}) || !slices.Equal(p.Flow, []string{"d"}) {
		t.Errorf("after DropHoldAndFlow: hold %v flow %v, want [c] and [d]", p.Hold, p.Flow)
	}
}
