package outboxdriver

import (
	"maps"
	"testing"
)

// Headers written by plain SQL may hold any JSON; the relay reads what it
// can and never fails a row over them.
func TestParseHeaders(t *testing.T) {
	for _, c := range []struct {
		col  string
		want map[string]string
	}{
		{``, nil},
		{`{}`, nil},
		{`{"tenant": "acme", "x-request-id": "r-1"}`, map[string]string{"tenant": "acme", "x-request-id": "r-1"}},
		{`{"n": 1, "ok": true, "o": {"a": [1]}, "gone": null}`, map[string]string{"n": "1", "ok": "true", "o": `{"a": [1]}`}},
		{`{"esc": "a\"b\u00e9"}`, map[string]string{"esc": `a"bé`}},
		{`[1, 2]`, nil},
		{`"text"`, nil},
		{`null`, nil},
		{`{"only": null}`, nil},
		{`{not json`, nil},
	} {
		if got := ParseHeaders(c.col); !maps.Equal(got, c.want) {
			t.Errorf("ParseHeaders(%q) = %v, want %v", c.col, got, c.want)
		}
		if got := ParseHeaders([]byte(c.col)); !maps.Equal(got, c.want) {
			t.Errorf("ParseHeaders([]byte(%q)) = %v, want %v", c.col, got, c.want)
		}
	}
}
