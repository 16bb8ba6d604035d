package relay

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox/internal/tracing"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/sink"
)

// Attributes of the publish span beyond OpenTelemetry's messaging
// conventions (docs/tracing.md).
const (
	// AttrOutcome is what became of the event: one of the Outcome* values.
	AttrOutcome = attribute.Key("outbox.outcome")
	// AttrAttempt is the attempt this publish was, from 1.
	AttrAttempt = attribute.Key("outbox.attempt")
	// AttrPartition is the event's partition.
	AttrPartition = attribute.Key("outbox.partition")
	// AttrAggregateType and AttrEventType are the event's aggregate type
	// and type; the aggregate id is the message key.
	AttrAggregateType = attribute.Key("outbox.aggregate.type")
	AttrEventType     = attribute.Key("outbox.event.type")
)

// Values of AttrOutcome.
const (
	// OutcomePublished: the broker acknowledged the event.
	OutcomePublished = "published"
	// OutcomeRetried: the broker refused it; it is tried again later.
	OutcomeRetried = "retried"
	// OutcomeDeadLettered: it went to the dead-letter table.
	OutcomeDeadLettered = "dead_lettered"
	// OutcomeDeferred: the broker was unreachable; the event is left as it
	// was (no attempt spent) and published again after the back-off.
	OutcomeDeferred = "deferred"
)

// publishOperation is messaging.operation.name of the relay's spans.
const publishOperation = "publish"

// system returns the messaging.system attribute of the relay's sink.
func (r *Relay) system() attribute.KeyValue {
	if s, ok := r.snk.(sink.Systemer); ok && s.System() != "" {
		return semconv.MessagingSystemKey.String(s.System())
	}
	return semconv.MessagingSystemKey.String("unknown")
}

// publishSpans starts the publish spans of one batch. It holds what they
// share, so that a span the sampler drops costs as few allocations per
// event as the SDK allows: its span and the context Start returns, and for
// an event with a stored context the context that holds the parent (plus
// the parsed list of a stored tracestate). The stored contexts are read
// without the propagator's context (tracing.Stored.SpanContext) into
// parents, one allocation per batch; the traceparent values the messages
// carry are written into headers, one buffer per batch; the stored
// tracestate is passed on as written when the span kept it.
type publishSpans struct {
	r       *Relay
	tr      trace.Tracer
	ctx     context.Context
	n       int              // events in the batch: the most spans it starts
	parents []tracing.Parent // referenced by the parent contexts: only appended to
	headers strings.Builder  // its strings stay valid as it grows
	dest    string           // the destination of the last span, and its name
	name    string
}

func (r *Relay) publishSpans(ctx context.Context, tr trace.Tracer, n int) *publishSpans {
	return &publishSpans{r: r, tr: tr, ctx: ctx, n: n}
}

// publishOptions are the start options of every publish span, in a slice
// of their own so that passing them allocates nothing.
var publishOptions = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer)}

// start starts the publish span of rec, a child of the trace context the
// writer stored with it, and puts that span's traceparent and tracestate
// into m's headers in place of the stored ones. m is nil when the event
// could not be routed.
//
// The span's attributes are set after it started, and only when it
// records: a sampler sees the span's name (publish <destination>), kind
// and parent, not its attributes, so a span the sampler drops costs no
// attribute (docs/tracing.md).
func (p *publishSpans) start(rec *outboxdriver.Record, m *sink.Message) trace.Span {
	ctx, tracestate := p.ctx, ""
	if rec.TraceContext != "" {
		var sc trace.SpanContext
		if sc, tracestate = tracing.Stored(rec.TraceContext).SpanContext(); sc.IsValid() {
			if p.parents == nil {
				p.parents = make([]tracing.Parent, 0, p.n)
			}
			p.parents = append(p.parents, tracing.NewParent(sc))
			ctx = trace.ContextWithSpan(ctx, &p.parents[len(p.parents)-1])
		}
	}
	name := publishOperation
	if m != nil {
		if m.Destination != p.dest || p.name == "" {
			p.dest, p.name = m.Destination, p.r.spanNames.get(m.Destination)
		}
		name = p.name
	}
	_, span := p.tr.Start(ctx, name, publishOptions...)
	if span.IsRecording() {
		r := p.r
		attrs := [...]attribute.KeyValue{
			r.sys,
			semconv.MessagingOperationTypeSend,
			semconv.MessagingOperationName(publishOperation),
			semconv.MessagingMessageID(rec.ID),
			AttrAttempt.Int(rec.Attempts + 1),
			AttrPartition.Int(rec.Partition),
			AttrAggregateType.String(rec.AggregateType),
			AttrEventType.String(rec.Type),
			semconv.MessagingDestinationName(""),
		}
		n := len(attrs) - 1
		if m != nil {
			attrs[n] = semconv.MessagingDestinationName(m.Destination)
			n++
		}
		span.SetAttributes(attrs[:n]...)
	}
	if m != nil {
		hs := m.Headers[:0]
		for _, h := range m.Headers {
			if h.Key != tracing.Traceparent && h.Key != tracing.Tracestate {
				hs = append(hs, h)
			}
		}
		if sc := span.SpanContext(); sc.IsValid() {
			hs = append(hs, sink.Header{Key: tracing.Traceparent, Value: p.traceparent(sc)})
			if ts := sc.TraceState(); ts.Len() > 0 {
				hs = append(hs, sink.Header{Key: tracing.Tracestate, Value: tracing.TracestateValue(ts, tracestate)})
			}
		}
		m.Headers = hs
	}
	return span
}

// traceparent returns the traceparent value of sc, written into the
// batch's buffer.
func (p *publishSpans) traceparent(sc trace.SpanContext) string {
	if p.headers.Cap() == 0 {
		p.headers.Grow(p.n * tracing.TraceparentLen)
	}
	at := p.headers.Len()
	var b [tracing.TraceparentLen]byte
	p.headers.Write(tracing.AppendTraceparent00(b[:0], sc))
	return p.headers.String()[at:]
}

// spanNames remembers the publish span's name of each destination, so
// that naming a span costs no allocation; like the router's cache of
// destinations it is bounded.
type spanNames struct {
	mu    sync.RWMutex
	names map[string]string
}

func (c *spanNames) get(dest string) string {
	c.mu.RLock()
	n, ok := c.names[dest]
	c.mu.RUnlock()
	if ok {
		return n
	}
	n = publishOperation + " " + dest
	c.mu.Lock()
	if c.names == nil {
		c.names = map[string]string{}
	}
	if len(c.names) < 4096 {
		c.names[dest] = n
	}
	c.mu.Unlock()
	return n
}

// endPublish ends a publish span with the event's outcome, at the time
// the broker answered.
func endPublish(span trace.Span, outcome string, err error, at time.Time) {
	if span.IsRecording() {
		span.SetAttributes(AttrOutcome.String(outcome))
		if err != nil {
			class := "transient"
			switch {
			case sink.IsPermanent(err):
				class = "permanent"
			case outcome == OutcomeDeferred:
				class = "unavailable"
			}
			span.SetAttributes(semconv.ErrorTypeKey.String(class))
			span.SetStatus(codes.Error, err.Error())
		}
		span.End(trace.WithTimestamp(at))
		return
	}
	span.End()
}

// traceAttr is the trace_id attribute of a log line about rec: the trace
// its publish span belongs to when there is one, else the writer's.
func traceAttr(rec *outboxdriver.Record, span trace.Span) slog.Attr {
	if span != nil && span.SpanContext().HasTraceID() {
		return tracing.LogAttr(span.SpanContext().TraceID().String())
	}
	return tracing.LogAttr(tracing.TraceID(tracing.Stored(rec.TraceContext).Get(tracing.Traceparent)))
}
