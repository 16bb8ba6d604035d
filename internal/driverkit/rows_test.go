package driverkit

import (
	"maps"
	"strings"
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

// A headers column the relay cannot publish as written is reported, so
// that the relay dead-letters the event instead of dropping its headers.
func TestDecodeHeadersReportsWhatCannotBePublished(t *testing.T) {
	for _, c := range []struct {
		col     string
		want    map[string]string
		problem string // in the error; "" for none
	}{
		{``, nil, ""},
		{`{}`, nil, ""},
		{`null`, nil, ""},
		{`{"tenant": "acme", "n": 1}`, map[string]string{"tenant": "acme", "n": "1"}, ""},
		{`[1, 2]`, nil, "a JSON array"},
		{`"text"`, nil, "a JSON string"},
		{`42`, nil, "a JSON number"},
		{`true`, nil, "a JSON boolean"},
		{`{not json`, nil, "not JSON"},
		{`{"only": null}`, nil, `["only"] the value null`},
		{`{"b": null, "tenant": "acme", "a": null}`, map[string]string{"tenant": "acme"}, `["a" "b"] the value null`},
	} {
		h, err := DecodeHeaders(c.col)
		hb, errb := DecodeHeaders([]byte(c.col))
		if !maps.Equal(h, c.want) || !maps.Equal(hb, c.want) {
			t.Errorf("DecodeHeaders(%q) = %v (string), %v ([]byte), want %v", c.col, h, hb, c.want)
		}
		for _, err := range []error{err, errb} {
			switch {
			case c.problem == "" && err != nil:
				t.Errorf("DecodeHeaders(%q): %v, want no error", c.col, err)
			case c.problem != "" && (err == nil || !strings.Contains(err.Error(), c.problem)):
				t.Errorf("DecodeHeaders(%q): error %v, want one saying %q", c.col, err, c.problem)
			}
		}
	}
}
