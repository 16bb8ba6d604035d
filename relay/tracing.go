package relay

import (
	"context"
	"log/slog"
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
		name = r.spanNames.get(m.Destination)
	}
	_, span := tr.Start(ctx, name, publishKind)
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
		sc := span.SpanContext()
		if sc.IsValid() {
			hs = append(hs, sink.Header{Key: tracing.Traceparent, Value: tracing.Traceparent00(sc)})
			if sc.TraceState().Len() > 0 {
				hs = append(hs, sink.Header{Key: tracing.Tracestate, Value: sc.TraceState().String()})
			}
		}
		m.Headers = hs
	}
	return span
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
