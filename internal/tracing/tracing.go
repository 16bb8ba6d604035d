// Package tracing holds what the relay and the inbox share about
// OpenTelemetry: resolving the caller's tracer provider (and telling a
// provider that records nothing, so that tracing off costs nothing per
// event), reading the W3C trace context the outbox stores and sends, and
// the trace id attribute of log lines.
package tracing

import (
	"context"
	"encoding/hex"
	"log/slog"
	"reflect"
	"strings"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of every span the project makes.
const ScopeName = "github.com/outboxkit/outbox"

// Header names of the W3C trace context.
const (
	Traceparent = "traceparent"
	Tracestate  = "tracestate"
)

// Propagator is the W3C trace context propagator the project uses on both
// sides: the relay injects it, the inbox extracts it.
var Propagator propagation.TraceContext

// Provider resolves a configured tracer provider into a tracer. With no
// provider configured it follows otel.GetTracerProvider(), also when the
// application sets the global provider later.
type Provider struct {
	tp    trace.TracerProvider // nil: the global provider
	state atomic.Pointer[resolved]
}

type resolved struct {
	tp     trace.TracerProvider
	tracer trace.Tracer // nil: the provider records nothing
}

// NewProvider returns a Provider for tp; nil means the global provider.
func NewProvider(tp trace.TracerProvider) *Provider { return &Provider{tp: tp} }

// Tracer returns the tracer to make spans with, or nil when the provider
// records nothing (a no-op provider, or the global one before the
// application set one): callers then skip every span and header, at no
// cost. It allocates nothing once the provider has been resolved.
func (p *Provider) Tracer() trace.Tracer {
	tp := p.tp
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if s := p.state.Load(); s != nil && same(s.tp, tp) {
		return s.tracer
	}
	s := &resolved{tp: tp}
	if On(tp) {
		s.tracer = tp.Tracer(ScopeName)
	}
	p.state.Store(s)
	return s.tracer
}

// same reports whether a and b are the same provider, without panicking
// on a provider type that is not comparable.
func same(a, b trace.TracerProvider) bool {
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	return ta == tb && ta.Comparable() && a == b
}

// globalPkg is the package of the global provider otel hands out before
// the application sets one: its spans are no-ops.
const globalPkg = "go.opentelemetry.io/otel/internal/global"

// On reports whether tp can record or propagate anything: false for the
// no-op provider and for the global default before otel.SetTracerProvider.
func On(tp trace.TracerProvider) bool {
	switch tp.(type) {
	case nil, noop.TracerProvider, *noop.TracerProvider:
		return false
	}
	t := reflect.TypeOf(tp)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.PkgPath() != globalPkg
}

// Stored reads the trace context in the outbox's tracingspancontext
// format ("traceparent=...\ntracestate=...", Debezium's), key by key.
type Stored string

// Get returns the value of key, or "".
func (s Stored) Get(key string) string {
	rest := string(s)
	for rest != "" {
		var line string
		line, rest, _ = strings.Cut(rest, "\n")
		k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
		if ok && k == key {
			return v
		}
	}
	return ""
}

// Set does nothing: a stored context is read only.
func (Stored) Set(string, string) {}

// Keys returns the keys the propagator reads.
func (Stored) Keys() []string { return []string{Traceparent, Tracestate} }

// Extract returns ctx with the remote span context carrier holds, if any.
func Extract(ctx context.Context, carrier propagation.TextMapCarrier) context.Context {
	return Propagator.Extract(ctx, carrier)
}

// Traceparent00 returns the W3C traceparent header value of sc, as the
// propagator's Inject writes it (version 00), in one allocation.
func Traceparent00(sc trace.SpanContext) string {
	var b [55]byte
	b[0], b[1], b[2] = '0', '0', '-'
	tid, sid := sc.TraceID(), sc.SpanID()
	hex.Encode(b[3:35], tid[:])
	b[35] = '-'
	hex.Encode(b[36:52], sid[:])
	b[52] = '-'
	flags := [1]byte{byte(sc.TraceFlags() & (trace.FlagsSampled | trace.FlagsRandom))}
	hex.Encode(b[53:55], flags[:])
	return string(b[:])
}

// TraceID returns the trace id of a traceparent value
// ("00-<trace id>-<span id>-<flags>"), or "" when it has none.
func TraceID(traceparent string) string {
	parts := strings.Split(strings.TrimSpace(traceparent), "-")
	if len(parts) < 4 || len(parts[1]) != 32 {
		return ""
	}
	id, err := trace.TraceIDFromHex(parts[1])
	if err != nil || !id.IsValid() {
		return ""
	}
	return parts[1]
}

// LogAttr is the "trace_id" attribute of a log line about an event of
// the trace traceID (hex), or the empty attribute (which slog's handlers
// leave out) when traceID is "".
func LogAttr(traceID string) slog.Attr {
	if traceID == "" {
		return slog.Attr{}
	}
	return slog.String("trace_id", traceID)
}
