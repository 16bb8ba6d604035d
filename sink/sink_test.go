package sink

import (
	"errors"
	"fmt"
	"testing"
)

func TestPermanent(t *testing.T) {
	base := errors.New("too large")
	if Permanent(nil) != nil {
		t.Fatal("Permanent(nil) must be nil")
	}
	p := Permanent(base)
	if !IsPermanent(p) || !errors.Is(p, base) {
		t.Fatalf("Permanent(%v) not recognised or not unwrapped", base)
	}
	if !IsPermanent(fmt.Errorf("publish: %w", p)) {
		t.Fatal("wrapped permanent error not recognised")
	}
	if IsPermanent(base) {
		t.Fatal("plain error reported permanent")
	}
}

func TestMessageHeader(t *testing.T) {
	m := Message{Headers: []Header{{Key: "id", Value: "1"}, {Key: "type", Value: "A"}, {Key: "type", Value: "B"}}}
	if v, ok := m.Header("type"); !ok || v != "A" {
		t.Fatalf("Header(type) = %q, %v; want first value A", v, ok)
	}
	if _, ok := m.Header("missing"); ok {
		t.Fatal("missing header reported present")
	}
}

func TestUnavailable(t *testing.T) {
	base := errors.New("connection refused")
	if Unavailable(nil) != nil {
		t.Fatal("Unavailable(nil) must be nil")
	}
	u := fmt.Errorf("publish: %w", Unavailable(base))
	if !IsUnavailable(u) || !errors.Is(u, base) || IsPermanent(u) {
		t.Fatal("wrapped unavailable error not recognised")
	}
	if IsUnavailable(base) {
		t.Fatal("plain error reported unavailable")
	}
}
