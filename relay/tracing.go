package relay

import (
	"context"
	"log/slog"
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

var publishKind = trace.WithSpanKind(trace.SpanKindProducer)

// system returns the messaging.system attribute of the relay's sink.
func (r *Relay) system() attribute.KeyValue {
	if s, ok := r.snk.(sink.Systemer); ok && s.System() != "" {
		return semconv.MessagingSystemKey.String(s.System())
	}
	return semconv.MessagingSystemKey.String("unknown")
}

// startPublish starts the publish span of rec, a child of the trace
// context the writer stored with it, and puts that span's traceparent and
// tracestate into m's headers in place of the stored ones. m is nil when
// the event could not be routed.
func (r *Relay) startPublish(ctx context.Context, tr trace.Tracer, rec *outboxdriver.Record, m *sink.Message) trace.Span {
	if rec.TraceContext != "" {
		ctx = tracing.Extract(ctx, tracing.Stored(rec.TraceContext))
	}
	name := publishOperation
	if m != nil {
		name += " " + m.Destination
	}
	ctx, span := tr.Start(ctx, name, publishKind)
	if span.IsRecording() {
		// Attributes only for a span that records: a sampler that samples
		// nothing must cost as little as possible (docs/tracing.md).
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
		m.Headers = hs
		tracing.Propagator.Inject(ctx, headerCarrier{m})
	}
	return span
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

// headerCarrier lets the propagator append headers to a message.
type headerCarrier struct{ m *sink.Message }

func (c headerCarrier) Get(key string) string {
	v, _ := c.m.Header(key)
	return v
}

func (c headerCarrier) Set(key, value string) {
	c.m.Headers = append(c.m.Headers, sink.Header{Key: key, Value: value})
}

func (c headerCarrier) Keys() []string {
	keys := make([]string, len(c.m.Headers))
	for i, h := range c.m.Headers {
		keys[i] = h.Key
	}
	return keys
}
