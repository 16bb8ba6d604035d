// Package await is the one wait for a condition in the tests: Eventually
// fails the test when the condition does not come true in time, Poll
// returns the error. It has no dependency beyond the standard library, so
// that the public conformance suites may use it.
package await

import (
	"fmt"
	"testing"
	"time"
)

// The pause between two tries of a condition starts short, so a condition
// that holds soon is seen soon, and doubles up to a cap, so a long wait
// does not load the service it polls.
const (
	pollFirst = time.Millisecond
	pollMax   = 100 * time.Millisecond
)

// Eventually polls cond until it returns nil. When cond still fails once
// timeout has passed, it fails the test with the timeout and the last
// error cond returned, which should say what is still not so (for
// example "backlog 3, want 0").
//
// cond runs on the caller's goroutine and may fail the test itself (with
// t.Fatal) on an error that waiting cannot cure. Eventually calls
// t.Fatalf, so, like t.Fatal, it must be called from the goroutine
// running the test; elsewhere use Poll and report its error.
func Eventually(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	if err := Poll(timeout, cond); err != nil {
		t.Fatalf("%v", err)
	}
}

// Poll calls cond until it returns nil, and then returns nil. Between
// tries it waits 1 ms at first, doubling up to 100 ms. cond is tried at
// least once, and once more when timeout has passed; if that try fails
// too, Poll returns an error that names the timeout and wraps the last
// error cond returned.
//
// Poll is the form for a wait whose timeout is not a failure (the caller
// goes on to check what arrived) or that runs on a goroutine other than
// the test's.
func Poll(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	pause := pollFirst
	for {
		err := cond()
		if err == nil {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("after %s: %w", timeout, err)
		}
		time.Sleep(min(pause, left))
		pause = min(2*pause, pollMax)
	}
}
