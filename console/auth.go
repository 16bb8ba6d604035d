package console

import (
	"crypto/subtle"
	"sync"
	"time"

	"github.com/outboxkit/outbox/ops"
)

// session is a signed-in browser. Sessions live in the console's memory:
// a restart signs everybody out.
type session struct {
	id       string
	actor    ops.Actor
	csrf     string
	created  time.Time
	lastSeen time.Time
	// password: signed in with a users-file password, so the session
	// follows the users file when it is reloaded.
	password bool
}

// sessions holds the live sessions.
type sessions struct {
	mu     sync.Mutex
	m      map[string]*session
	now    func() time.Time
	idle   time.Duration
	maxAge time.Duration
	max    int
}

func newSessions(now func() time.Time, idle, maxAge time.Duration) *sessions {
	return &sessions{m: map[string]*session{}, now: now, idle: idle, maxAge: maxAge, max: 10000}
}

// create starts a session for a; a fresh id every time, so an id known
// before the login is worth nothing after it.
func (s *sessions) create(a ops.Actor) *session { return s.start(a, false) }

// start is create, for a user of the users file when password.
func (s *sessions) start(a ops.Actor, password bool) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if len(s.m) >= s.max {
		s.expire(now)
	}
	for len(s.m) >= s.max { // still full: the oldest goes
		var oldest *session
		for _, x := range s.m {
			if oldest == nil || x.lastSeen.Before(oldest.lastSeen) {
				oldest = x
			}
		}
		delete(s.m, oldest.id)
	}
	x := &session{id: randomString(32), actor: a, csrf: randomString(32), created: now, lastSeen: now, password: password}
	s.m[x.id] = x
	return x
}

// get returns the live session id names, and notes its use; nil when
// there is none or it expired.
func (s *sessions) get(id string) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	x := s.m[id]
	if x == nil {
		return nil
	}
	now := s.now()
	if now.Sub(x.lastSeen) > s.idle || now.Sub(x.created) > s.maxAge {
		delete(s.m, id)
		return nil
	}
	x.lastSeen = now
	cp := *x
	return &cp
}

// peek returns the live session id names without noting its use (nil
// when there is none or it expired): for the audit of a refused request.
func (s *sessions) peek(id string) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	x := s.m[id]
	now := s.now()
	if x == nil || now.Sub(x.lastSeen) > s.idle || now.Sub(x.created) > s.maxAge {
		return nil
	}
	cp := *x
	return &cp
}

// setRole changes the role of session id.
func (s *sessions) setRole(id string, r ops.Role) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if x := s.m[id]; x != nil {
		x.actor.Role = r
	}
}

func (s *sessions) delete(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, id)
}

func (s *sessions) expire(now time.Time) {
	for id, x := range s.m {
		if now.Sub(x.lastSeen) > s.idle || now.Sub(x.created) > s.maxAge {
			delete(s.m, id)
		}
	}
}

// sameToken compares secrets in constant time.
func sameToken(a, b string) bool {
	return a != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// limiter counts failures per key (a client address, a user name) and
// blocks a key that failed max times within window, until the oldest of
// those failures is window old.
type limiter struct {
	mu     sync.Mutex
	fails  map[string][]time.Time
	now    func() time.Time
	max    int
	window time.Duration
}

func newLimiter(now func() time.Time, max int, window time.Duration) *limiter {
	return &limiter{fails: map[string][]time.Time{}, now: now, max: max, window: window}
}

// blocked reports whether any of keys is blocked now.
func (l *limiter) blocked(keys ...string) bool { return l.blockedFor(keys...) > 0 }

// blockedFor is how long the longest blocked of keys stays blocked (0:
// none is): until the oldest of the max failures that block it is a
// window old.
func (l *limiter) blockedFor(keys ...string) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	var longest time.Duration
	for _, k := range keys {
		if f := l.recent(k, now); len(f) >= l.max {
			longest = max(longest, f[len(f)-l.max].Add(l.window).Sub(now))
		}
	}
	return longest
}

// fail counts a failure for every key and reports whether one of them is
// blocked by it (it was not before).
func (l *limiter) fail(keys ...string) (nowBlocked bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if len(l.fails) > 100000 { // bound the memory an attacker can fill
		for k := range l.fails {
			l.recent(k, now)
		}
	}
	for _, k := range keys {
		f := append(l.recent(k, now), now)
		l.fails[k] = f
		if len(f) == l.max {
			nowBlocked = true
		}
	}
	return nowBlocked
}

// reset forgets the failures of key (after a success).
func (l *limiter) reset(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.fails, key)
}

// recent drops the failures of k older than the window and returns the
// rest. The caller holds mu.
func (l *limiter) recent(k string, now time.Time) []time.Time {
	f := l.fails[k]
	i := 0
	for i < len(f) && now.Sub(f[i]) >= l.window {
		i++
	}
	f = f[i:]
	if len(f) == 0 {
		delete(l.fails, k)
		return nil
	}
	l.fails[k] = f
	return f
}
