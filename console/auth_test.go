package console

import (
	"testing"
	"time"

	"github.com/outboxkit/outbox/ops"
)

// The limiter blocks a key after max failures within the window and lets
// it go once the oldest failure is a window old; a success resets it.
func TestLimiterWindow(t *testing.T) {
	now := time.Unix(1000, 0)
	l := newLimiter(func() time.Time { return now }, 3, time.Minute)
	for i := range 3 {
		if l.blocked("ip:a") {
			t.Fatalf("blocked after %d failures", i)
		}
		if got := l.fail("ip:a"); got != (i == 2) {
			t.Fatalf("failure %d reported nowBlocked %v", i+1, got)
		}
		now = now.Add(10 * time.Second)
	}
	if !l.blocked("ip:a") || l.blocked("ip:b") {
		t.Fatal("want ip:a blocked and ip:b not")
	}
	now = now.Add(31 * time.Second) // the first failure is 61s old
	if l.blocked("ip:a") {
		t.Fatal("still blocked once the oldest failure left the window")
	}
	l.fail("ip:a")
	if !l.blocked("ip:a") {
		t.Fatal("not blocked again after a third failure within the window")
	}
	l.reset("ip:a")
	if l.blocked("ip:a") {
		t.Fatal("blocked after reset")
	}
}

// Sessions end when idle or too old, and each sign-in gets a fresh id and
// CSRF token.
func TestSessionsExpire(t *testing.T) {
	now := time.Unix(1000, 0)
	s := newSessions(func() time.Time { return now }, 10*time.Minute, time.Hour)
	a := s.create(ops.Actor{Name: "vera", Role: ops.Viewer})
	b := s.create(ops.Actor{Name: "vera", Role: ops.Viewer})
	if a.id == b.id || a.csrf == b.csrf || len(a.id) < 40 {
		t.Fatalf("sessions %q and %q", a.id, b.id)
	}
	for range 5 { // used every 9 minutes: alive until the hour is up
		now = now.Add(9 * time.Minute)
		if s.get(a.id) == nil {
			t.Fatalf("session ended at %s though used every 9 minutes", now.Sub(time.Unix(1000, 0)))
		}
	}
	if s.get(b.id) != nil {
		t.Fatal("a session idle for 45 minutes is still alive")
	}
	now = now.Add(16 * time.Minute)
	if s.get(a.id) != nil {
		t.Fatal("a session older than the maximum is still alive")
	}
	s.max = 2
	for range 3 {
		s.create(ops.Actor{Name: "x", Role: ops.Viewer})
	}
	if len(s.m) > 2 {
		t.Fatalf("%d sessions kept; the maximum is 2", len(s.m))
	}
}
