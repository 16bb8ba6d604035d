package workload

import (
	"strings"
	"testing"
)

func TestCheckFindsEveryViolation(t *testing.T) {
	res := &Result{IDs: map[string]Payload{
		"1": {"a", 1}, "2": {"a", 2}, "3": {"b", 1},
	}}
	d := func(id, key, body string) Delivery { return Delivery{ID: id, Key: key, Payload: []byte(body)} }
	ok := []Delivery{d("1", "a", `{"agg":"a","v":1}`), d("3", "b", `{"agg":"b","v":1}`), d("2", "a", `{"agg":"a","v":2}`), d("1", "a", `{"agg":"a","v":1}`)}
	if dups, err := Check(res, ok); err != nil || dups != 1 {
		t.Fatalf("clean run: dups=%d err=%v", dups, err)
	}
	cases := map[string][]Delivery{
		"loss":         ok[:2],
		"phantom":      append(ok[:3:3], d("9", "a", `{}`)),
		"commit order": {ok[2], ok[0], ok[1]},
		"differ":       append(ok[:3:3], d("1", "a", `{"agg":"a","v":1,"x":1}`)),
		"has key":      {d("1", "zz", `{"agg":"a","v":1}`), ok[1], ok[2]},
	}
	for want, got := range cases {
		if _, err := Check(res, got); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v", want, err)
		}
	}
}
