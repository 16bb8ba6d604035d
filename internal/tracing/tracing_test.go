package tracing

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Traceparent00 writes what the W3C propagator writes, sampled or not.
func TestTraceparent00MatchesThePropagator(t *testing.T) {
	for _, flags := range []trace.TraceFlags{0, trace.FlagsSampled, 0xff} {
		sc := trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
			SpanID:  trace.SpanID{0, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7}, TraceFlags: flags,
		})
		c := propagation.MapCarrier{}
		Propagator.Inject(trace.ContextWithSpanContext(context.Background(), sc), c)
		if got := Traceparent00(sc); got != c.Get(Traceparent) {
			t.Errorf("flags %v: %q, the propagator writes %q", flags, got, c.Get(Traceparent))
		}
	}
}

func TestStoredAndTraceID(t *testing.T) {
	s := Stored("traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\ntracestate=a=b")
	if s.Get(Traceparent) != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" || s.Get(Tracestate) != "a=b" || s.Get("x") != "" {
		t.Errorf("Stored.Get: %q %q", s.Get(Traceparent), s.Get(Tracestate))
	}
	if id := TraceID(s.Get(Traceparent)); id != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("TraceID = %q", id)
	}
	for _, bad := range []string{"", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "garbage", "00-xyz-00f067aa0ba902b7-01"} {
		if id := TraceID(bad); id != "" {
			t.Errorf("TraceID(%q) = %q, want none", bad, id)
		}
	}
}

// Stored.SpanContext reads a stored context exactly as the W3C propagator
// extracts it (the seeds are the cases its rules name); it returns the
// stored tracestate as written.
func FuzzStoredSpanContext(f *testing.F) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, seed := range []struct{ traceparent, tracestate string }{
		{tp, ""}, {tp, "a=b,c=d"}, {tp, "a=b, c=d"}, {tp, "bad state"}, {tp, "a=1,a=2"},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", ""},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03", ""},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-04", ""},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", ""},
		{"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff-extra", "x=y"},
		{"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", ""},
		{"fe-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09", ""},
		{"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", ""},
		{"00-00000000000000000000000000000000-00f067aa0ba902b7-01", ""},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", ""},
		{"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", ""},
		{"0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", ""},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", ""},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bg-01", ""},
		{"", "a=b"}, {"garbage", ""},
	} {
		f.Add(seed.traceparent, seed.tracestate)
	}
	f.Fuzz(func(t *testing.T, traceparent, tracestate string) {
		stored := "traceparent=" + traceparent + "\ntracestate=" + tracestate
		if strings.ContainsAny(traceparent+tracestate, "\r\n") {
			return // one stored line per key
		}
		want := trace.SpanContextFromContext(Extract(context.Background(), Stored(stored)))
		got, state := Stored(stored).SpanContext()
		if !got.Equal(want) || got.IsRemote() != want.IsRemote() {
			t.Fatalf("%q: %+v, the propagator extracts %+v", stored, got, want)
		}
		if got.IsValid() && state != Stored(stored).Get(Tracestate) {
			t.Fatalf("%q: tracestate %q, stored %q", stored, state, Stored(stored).Get(Tracestate))
		}
	})
}

// Reading a stored traceparent allocates nothing; a tracestate costs its
// parsed list only.
func TestStoredSpanContextAllocations(t *testing.T) {
	for stored, want := range map[Stored]float64{
		"traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01":                 0,
		"traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\ntracestate=a=b": 1,
	} {
		var sc trace.SpanContext
		if n := testing.AllocsPerRun(100, func() { sc, _ = stored.SpanContext() }); n != want || !sc.IsValid() {
			t.Errorf("%q: %v allocations (valid %v), want %v", stored, n, sc.IsValid(), want)
		}
	}
}

// TracestateValue passes the stored value on when it is what the
// propagator would write, else writes the span's tracestate anew.
func TestTracestateValue(t *testing.T) {
	parse := func(s string) trace.TraceState {
		ts, err := trace.ParseTraceState(s)
		if err != nil {
			t.Fatal(err)
		}
		return ts
	}
	ab := parse("a=1,b=2")
	for _, c := range []struct {
		ts     trace.TraceState
		stored string
	}{
		{ab, "a=1,b=2"}, {ab, "a=1, b=2"}, {ab, "a=1,b=2,"}, {ab, "a=1"}, {ab, "a=1,b=23"}, {ab, ""},
		{parse("b=2,a=1"), "a=1,b=2"}, {parse("a=1"), "a=1,b=2"}, {trace.TraceState{}, "a=1"}, {trace.TraceState{}, ""},
	} {
		got := TracestateValue(c.ts, c.stored)
		if got != c.ts.String() {
			t.Errorf("TracestateValue(%q, %q) = %q, want %q", c.ts.String(), c.stored, got, c.ts.String())
		}
	}
	stored := "a=1,b=2"
	if n := testing.AllocsPerRun(100, func() { _ = TracestateValue(ab, stored) }); n != 0 {
		t.Errorf("passing the stored tracestate on allocates %v times", n)
	}
}

// AppendTraceparent00 appends what Traceparent00 returns.
func TestAppendTraceparent00(t *testing.T) {
	sc, _ := Stored("traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").SpanContext()
	if got := string(AppendTraceparent00([]byte("x"), sc)); got != "x"+Traceparent00(sc) || len(got) != 1+TraceparentLen {
		t.Errorf("AppendTraceparent00 = %q", got)
	}
}
