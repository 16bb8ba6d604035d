package backoff

import (
	"testing"
	"time"
)

// Every delay lies in the upper half of base doubled per attempt, capped
// at limit.
func TestDelayDoublesWithinItsUpperHalfUpToTheCap(t *testing.T) {
	const base, limit = time.Second, 50 * time.Second
	for _, c := range []struct {
		n    int
		full time.Duration
	}{
		{-3, base}, {0, base}, {1, base}, {2, 2 * time.Second}, {3, 4 * time.Second},
		{6, 32 * time.Second}, {7, limit}, {40, limit}, {1 << 30, limit},
	} {
		for range 200 {
			d := Delay(c.n, base, limit)
			if d < c.full/2 || d > c.full {
				t.Fatalf("Delay(%d) = %v, want within [%v, %v]", c.n, d, c.full/2, c.full)
			}
		}
	}
}

// The jitter spreads delays over the upper half rather than returning one
// value: 200 draws of a one-second delay are not all alike.
func TestDelayIsJittered(t *testing.T) {
	first := Delay(1, time.Second, time.Second)
	for range 200 {
		if Delay(1, time.Second, time.Second) != first {
			return
		}
	}
	t.Fatalf("200 delays all %v", first)
}

// A delay of one nanosecond, the smallest base, stays within [0, 1ns].
func TestDelaySmallestBase(t *testing.T) {
	for range 100 {
		if d := Delay(1, 1, 1); d < 0 || d > 1 {
			t.Fatalf("Delay(1, 1ns, 1ns) = %v", d)
		}
	}
}
