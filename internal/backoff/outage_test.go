package backoff

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv/await"
)

// clock is a time the test moves by hand.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// record is one logged line: its level, message and attributes as text.
type record struct {
	level slog.Level
	msg   string
	attrs string
}

type recorder struct {
	mu   sync.Mutex
	recs []record
}

// handler records every line in a recorder.
type handler struct{ r *recorder }

func (h handler) Enabled(context.Context, slog.Level) bool { return true }

func (h handler) Handle(_ context.Context, rec slog.Record) error {
	var attrs []string
	rec.Attrs(func(a slog.Attr) bool {
		attrs = append(attrs, a.String())
		return true
	})
	h.r.mu.Lock()
	h.r.recs = append(h.r.recs, record{rec.Level, rec.Message, strings.Join(attrs, " ")})
	h.r.mu.Unlock()
	return nil
}

func (h handler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h handler) WithGroup(string) slog.Handler      { return h }

func newOutage(t *testing.T) (*Outage, *clock, *recorder) {
	t.Helper()
	rec := &recorder{}
	c := &clock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	o := NewOutage(OutageConfig{
		Log:   slog.New(handler{rec}),
		Level: slog.LevelError,
		Down:  "down", Still: "still", Recovered: "recovered",
		Base: 100 * time.Millisecond, Max: time.Second,
	})
	o.now = c.now
	return o, c, rec
}

func (r *recorder) lines() []record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]record(nil), r.recs...)
}

func (r *recorder) msgs() string {
	var b []string
	for _, l := range r.lines() {
		b = append(b, l.msg)
	}
	return strings.Join(b, ",")
}

// An outage of a minute with calls failing ten times a second, then
// answering: one down line, one summary per 30 s, one recovered line with
// the outage's length and failures; the delays grow to Max and stay
// within it.
func TestOutageLogsDownSummariesRecovered(t *testing.T) {
	o, c, rec := newOutage(t)
	o.OK() // no outage: nothing
	if o.Down() || len(rec.lines()) != 0 {
		t.Fatalf("a success outside an outage logged %q", rec.msgs())
	}
	var last time.Duration
	for i := range 600 {
		op := "claim"
		if i%3 == 0 {
			op = "lease upkeep"
		}
		last = o.Fail(op, errors.New("connection refused"))
		if last <= 0 || last > time.Second {
			t.Fatalf("failure %d: delay %v, want within (0, 1s]", i+1, last)
		}
		c.add(100 * time.Millisecond)
	}
	if last < 500*time.Millisecond {
		t.Errorf("after 600 failures the delay is %v, want the cap's upper half [500ms, 1s]", last)
	}
	if got := rec.msgs(); got != "down,still" {
		t.Fatalf("a minute of failures logged %q, want down,still (one summary per 30 s)", got)
	}
	// Answering again: the outage ends after a quiet spell of Settle.
	o.OK()
	c.add(time.Second)
	o.OK()
	if !o.Down() {
		t.Fatal("the outage ended one second after the first success, before Settle (2s)")
	}
	c.add(time.Second)
	o.OK()
	if o.Down() {
		t.Fatal("the outage did not end after a quiet spell of Settle")
	}
	o.OK()
	ls := rec.lines()
	if got := rec.msgs(); got != "down,still,recovered" {
		t.Fatalf("logged %q, want down,still,recovered", got)
	}
	if ls[0].level != slog.LevelError || !strings.Contains(ls[0].attrs, "op=lease upkeep") || !strings.Contains(ls[0].attrs, "err=connection refused") {
		t.Errorf("down line: %v %s", ls[0].level, ls[0].attrs)
	}
	if !strings.Contains(ls[1].attrs, "down_for=30s") || !strings.Contains(ls[1].attrs, "failures=301") {
		t.Errorf("summary line: %s, want down_for=30s failures=301", ls[1].attrs)
	}
	if ls[2].level != slog.LevelWarn || !strings.Contains(ls[2].attrs, "down_for=1m0s") || !strings.Contains(ls[2].attrs, "failures=600") {
		t.Errorf("recovered line: %v %s, want warning, down_for=1m0s (until the first success) failures=600", ls[2].level, ls[2].attrs)
	}
	// A new outage starts anew: a down line, the first delay at Base.
	if d := o.Fail("claim", errors.New("again")); d > 100*time.Millisecond {
		t.Errorf("the first delay of a new outage is %v, want at most Base", d)
	}
	if got := rec.msgs(); got != "down,still,recovered,down" {
		t.Fatalf("logged %q after a new failure", got)
	}
}

// Successes between failures (a claim answered from memory while the
// database is down) neither end the outage nor reset its backoff.
func TestOutageSuccessBetweenFailuresDoesNotEndIt(t *testing.T) {
	o, c, rec := newOutage(t)
	for range 100 {
		o.Fail("claim", errors.New("refused"))
		c.add(40 * time.Millisecond)
		o.OK()
		c.add(40 * time.Millisecond)
		o.OK()
	}
	if got := rec.msgs(); got != "down" {
		t.Fatalf("failures with successes between logged %q, want one down line", got)
	}
	if d := o.Fail("claim", errors.New("refused")); d < 500*time.Millisecond {
		t.Fatalf("after 100 failures the delay is %v: the successes between them reset the backoff", d)
	}
}

// End logs a recovery whose quiet spell began, and nothing for an outage
// still failing.
func TestOutageEnd(t *testing.T) {
	o, c, rec := newOutage(t)
	o.Fail("publish", errors.New("disconnected"))
	o.End()
	if got := rec.msgs(); got != "down" {
		t.Fatalf("End during failures logged %q", got)
	}
	c.add(time.Second)
	o.OK()
	o.End()
	if got := rec.msgs(); got != "down,recovered" || o.Down() {
		t.Fatalf("End after a success logged %q (down %v), want down,recovered", got, o.Down())
	}
}

// Concurrent paths: with the race detector, Fail and OK from many
// goroutines.
func TestOutageConcurrent(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	o := NewOutage(OutageConfig{Log: slog.New(slog.NewTextHandler(&lockedWriter{&mu, &buf}, nil)), Down: "d", Still: "s", Recovered: "r",
		Base: time.Millisecond, Max: 10 * time.Millisecond})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				if (i+g)%2 == 0 {
					o.Fail("x", errors.New("e"))
				} else {
					o.OK()
				}
			}
		})
	}
	wg.Wait()
	if !o.Down() {
		t.Fatal("failures up to the end, and no outage")
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// A success followed by no call at all (nothing more to publish) ends the
// outage by itself once Settle has passed.
func TestOutageEndsAfterAQuietSpellWithoutFurtherCalls(t *testing.T) {
	rec := &recorder{}
	o := NewOutage(OutageConfig{Log: slog.New(handler{rec}), Down: "down", Still: "still", Recovered: "recovered",
		Base: time.Millisecond, Max: 10 * time.Millisecond, Settle: 50 * time.Millisecond})
	o.Fail("publish", errors.New("disconnected"))
	o.OK()
	await.Eventually(t, 5*time.Second, func() error {
		if got := rec.msgs(); got != "down,recovered" {
			return fmt.Errorf("logged %q, want down,recovered", got)
		}
		return nil
	})
	// A failure within the spell ends it: its timer is stopped, and one
	// that fired already finds a newer spell (or none) and does nothing.
	o.Fail("publish", errors.New("disconnected"))
	o.OK()
	spell := o.spell
	o.Fail("publish", errors.New("disconnected again"))
	if o.timer != nil || !o.answered.IsZero() {
		t.Fatal("a failure left the quiet spell running")
	}
	o.settled(spell)
	if got := rec.msgs(); got != "down,recovered,down" || !o.Down() {
		t.Fatalf("the timer of a broken quiet spell ended the outage: logged %q", got)
	}
	o.End()
}
