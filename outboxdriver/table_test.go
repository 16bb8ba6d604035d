package outboxdriver

import (
	"strings"
	"testing"
)

func TestTableValidate(t *testing.T) {
	good := []Table{{"public", "outbox"}, {"_s", "T1"}, {"s", strings.Repeat("a", MaxTableLen)}}
	for _, tb := range good {
		if err := tb.Validate(); err != nil {
			t.Errorf("%v refused: %v", tb, err)
		}
	}
	bad := []Table{
		{"", "outbox"},
		{"public", ""},
		{"public", `outbox"; DROP TABLE x; --`},
		{"pub lic", "outbox"},
		{"public", "1outbox"},
		{"public", "out-box"},
		{"public", "outbox;"},
		{"sch\x00", "outbox"},
		{"public", "ünïcode"},
		{strings.Repeat("s", 64), "outbox"},
		{"public", strings.Repeat("a", MaxTableLen+1)},
	}
	for _, tb := range bad {
		if err := tb.Validate(); err == nil {
			t.Errorf("%q.%q accepted", tb.Schema, tb.Name)
		}
	}
}

func TestChannelFits(t *testing.T) {
	tb := Table{strings.Repeat("s", 63), strings.Repeat("t", MaxTableLen)}
	if ch := tb.Channel(); len(ch) > 63 {
		t.Fatalf("channel %q longer than 63 bytes", ch)
	}
	if ch := (Table{}).WithDefaults().Channel(); ch != "public.outbox" {
		t.Fatalf("default channel = %q", ch)
	}
}

func FuzzValidateIdent(f *testing.F) {
	for _, s := range []string{"outbox", "a\"b", "", "x;y", "Ω"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if ValidateIdent("x", s) != nil {
			return
		}
		for _, r := range s {
			if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
				t.Fatalf("accepted %q with rune %q", s, r)
			}
		}
		if len(s) > 63 || s[0] >= '0' && s[0] <= '9' {
			t.Fatalf("accepted %q", s)
		}
	})
}
