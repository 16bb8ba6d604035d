package await

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// fakeT records what Eventually reports instead of failing the test.
type fakeT struct {
	testing.TB
	failed string
}

func (f *fakeT) Helper() {}

func (f *fakeT) Fatalf(format string, args ...any) { f.failed = fmt.Sprintf(format, args...) }

// Eventually returns as soon as its condition holds, and does not fail.
func TestEventuallyReturnsOnceTheConditionHolds(t *testing.T) {
	ft := &fakeT{TB: t}
	tries := 0
	start := time.Now()
	Eventually(ft, time.Minute, func() error {
		if tries++; tries < 3 {
			return fmt.Errorf("try %d", tries)
		}
		return nil
	})
	if ft.failed != "" {
		t.Fatalf("Eventually failed the test: %s", ft.failed)
	}
	if tries != 3 {
		t.Fatalf("the condition was tried %d times, want 3 (it held at the third)", tries)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("Eventually returned %s after the condition held at its third try", d)
	}
}

// After the timeout Eventually fails the test naming the timeout and the
// last error of the condition, tried once more at the deadline.
func TestEventuallyFailsWithTheLastError(t *testing.T) {
	ft := &fakeT{TB: t}
	tries := 0
	var last time.Time
	start := time.Now()
	Eventually(ft, 50*time.Millisecond, func() error {
		tries++
		last = time.Now()
		return fmt.Errorf("backlog %d, want 0", tries)
	})
	if d := last.Sub(start); d < 50*time.Millisecond {
		t.Fatalf("the last try was %s after the start, before the timeout of 50ms", d)
	}
	want := fmt.Sprintf("after 50ms: backlog %d, want 0", tries)
	if ft.failed != want {
		t.Fatalf("Eventually failed with %q, want %q", ft.failed, want)
	}
	if tries < 2 {
		t.Fatalf("the condition was tried %d times in 50ms", tries)
	}
}

// Poll tries the condition once even with no time, and its error wraps
// the condition's.
func TestPollWrapsTheLastError(t *testing.T) {
	errNotYet := errors.New("not yet")
	tries := 0
	err := Poll(0, func() error { tries++; return errNotYet })
	if tries != 1 {
		t.Fatalf("the condition was tried %d times with no time, want 1", tries)
	}
	if !errors.Is(err, errNotYet) || !strings.HasPrefix(err.Error(), "after 0s: ") {
		t.Fatalf("Poll = %v, want the timeout and the condition's error", err)
	}
	if err := Poll(0, func() error { return nil }); err != nil {
		t.Fatalf("Poll of a condition that holds = %v", err)
	}
}
