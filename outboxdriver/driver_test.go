package outboxdriver

import (
	"strings"
	"testing"
)

func TestCheckAggregateID(t *testing.T) {
	for id, problem := range map[string]string{
		"42": "", "order 7": "", "agg:3/x.y": "", "é": "",
		"": "empty", "  ": "empty", "a\r\nb": "line break", "a\nb": "line break", "a\rb": "line break", "a\x00b": "NUL",
	} {
		err := CheckAggregateID(id)
		if (problem == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), problem)) {
			t.Errorf("CheckAggregateID(%q) = %v, want %q", id, err, problem)
		}
	}
}
