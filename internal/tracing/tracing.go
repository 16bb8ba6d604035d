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

// SpanContext returns the remote span context the W3C propagator extracts
// from s (what Extract puts into a context: the sampled and random flags
// only, the tracestate parsed, marked remote), or an invalid one when s
// holds no valid traceparent, and the stored tracestate as written. Unlike
// Extract it builds no context: it allocates nothing for a traceparent
// alone, and only the parsed list for a tracestate.
func (s Stored) SpanContext() (sc trace.SpanContext, tracestate string) {
	h := s.Get(Traceparent)
	if h == "" {
		return trace.SpanContext{}, ""
	}
	// The propagator's rules (go.opentelemetry.io/otel/propagation's
	// TraceContext.extract), checked against it by FuzzStoredSpanContext.
	var ver, flags [1]byte
	var scc trace.SpanContextConfig
	if !hexPart(ver[:], &h) || ver[0] > maxVersion || !hexPart(scc.TraceID[:], &h) ||
		!hexPart(scc.SpanID[:], &h) || !hexPart(flags[:], &h) {
		return trace.SpanContext{}, ""
	}
	if ver[0] == 0 && (h != "" || flags[0] > 3) {
		return trace.SpanContext{}, "" // version 00 allows no extra field and no reserved flag
	}
	scc.TraceFlags = trace.TraceFlags(flags[0]) & (trace.FlagsSampled | trace.FlagsRandom)
	tracestate = s.Get(Tracestate)
	scc.TraceState, _ = trace.ParseTraceState(tracestate) // a bad tracestate leaves the traceparent valid
	scc.Remote = true
	if sc = trace.NewSpanContext(scc); !sc.IsValid() {
		return trace.SpanContext{}, ""
	}
	return sc, tracestate
}

// maxVersion is the highest traceparent version the propagator accepts
// (ff is invalid).
const maxVersion = 254

// hexPart decodes the next "-"-separated field of *h, exactly 2*len(dst)
// lower-case hex digits, into dst and moves *h past it.
func hexPart(dst []byte, h *string) bool {
	part, rest, _ := strings.Cut(*h, "-")
	*h = rest
	if len(part) != 2*len(dst) {
		return false
	}
	for i := range dst {
		hi, ok1 := lowerHex(part[2*i])
		lo, ok2 := lowerHex(part[2*i+1])
		if !ok1 || !ok2 {
			return false
		}
		dst[i] = hi<<4 | lo
	}
	return true
}

func lowerHex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// Parent is a span that only carries a remote span context, the parent of
// the spans started in a context that holds it (trace.ContextWithSpan): what
// Extract puts into a context, in one allocation less. It records nothing.
type Parent struct {
	trace.Span // a span that records nothing: every method but SpanContext
	sc         trace.SpanContext
}

// NewParent returns the parent span of sc.
func NewParent(sc trace.SpanContext) Parent {
	return Parent{Span: trace.SpanFromContext(context.Background()), sc: sc}
}

// SpanContext returns the parent's span context.
func (p *Parent) SpanContext() trace.SpanContext { return p.sc }

// TracestateValue returns the tracestate header value of ts: stored, the
// value ts was parsed from, when it is exactly what ts.String() would write
// (a span that kept its parent's tracestate), so that passing a tracestate
// on allocates nothing; otherwise ts.String().
func TracestateValue(ts trace.TraceState, stored string) string {
	rest, same := stored, true
	ts.Walk(func(k, v string) bool {
		if len(rest) != len(stored) {
			if rest == "" || rest[0] != ',' {
				same = false
				return false
			}
			rest = rest[1:]
		}
		n := len(k) + 1 + len(v)
		if len(rest) < n || rest[:len(k)] != k || rest[len(k)] != '=' || rest[len(k)+1:n] != v {
			same = false
			return false
		}
		rest = rest[n:]
		return true
	})
	if same && rest == "" {
		return stored
	}
	return ts.String()
}

// Extract returns ctx with the remote span context carrier holds, if any.
func Extract(ctx context.Context, carrier propagation.TextMapCarrier) context.Context {
	return Propagator.Extract(ctx, carrier)
}

// Traceparent00 returns the W3C traceparent header value of sc, as the
// propagator's Inject writes it (version 00), in one allocation.
func Traceparent00(sc trace.SpanContext) string {
	var b [TraceparentLen]byte
	return string(AppendTraceparent00(b[:0], sc))
}

// TraceparentLen is the length of a version 00 traceparent value.
const TraceparentLen = 55

// AppendTraceparent00 appends the traceparent value of sc (Traceparent00)
// to dst.
func AppendTraceparent00(dst []byte, sc trace.SpanContext) []byte {
	var b [TraceparentLen]byte
	b[0], b[1], b[2] = '0', '0', '-'
	tid, sid := sc.TraceID(), sc.SpanID()
	hex.Encode(b[3:35], tid[:])
	b[35] = '-'
	hex.Encode(b[36:52], sid[:])
	b[52] = '-'
	flags := [1]byte{byte(sc.TraceFlags() & (trace.FlagsSampled | trace.FlagsRandom))}
	hex.Encode(b[53:55], flags[:])
	return append(dst, b[:]...)
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
