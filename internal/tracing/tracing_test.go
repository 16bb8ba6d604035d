package tracing

import (
	"context"
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
