package inbox

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox/internal/tracing"
)

// AttrOutcome is the process span's attribute saying what became of the
// message: processed, duplicate, stale, failed or invalid (Outcome).
const AttrOutcome = attribute.Key("outbox.inbox.outcome")

// processOperation is messaging.operation.name of the inbox's spans.
const processOperation = "process"

// TraceID returns the trace id (32 hex digits) of the message's
// traceparent header, or "" when it has none: put it into your log lines.
func (m *Message) TraceID() string {
	return tracing.TraceID(header(m.Headers, tracing.Traceparent))
}

// headerCarrier reads a message's headers for the propagator, ignoring the
// case of names (HTTP sends "Traceparent").
type headerCarrier map[string]string

func (c headerCarrier) Get(key string) string { return header(c, key) }
func (c headerCarrier) Set(string, string)    {}
func (c headerCarrier) Keys() []string        { return []string{tracing.Traceparent, tracing.Tracestate} }

// startProcess starts the process span of msg: a child of the trace
// context the message carries (the relay's publish span), linked to the
// span of ctx when ctx has one of another trace. It returns ctx unchanged
// and a nil span when tracing is off.
func (ib *Inbox[TTx]) startProcess(ctx context.Context, msg *Message) (context.Context, trace.Span) {
	tr := ib.tracing.Tracer()
	if tr == nil {
		return ctx, nil
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
	cur := trace.SpanContextFromContext(ctx)
	ctx = tracing.Extract(ctx, headerCarrier(msg.Headers))
	if parent := trace.SpanContextFromContext(ctx); cur.IsValid() && parent.TraceID() != cur.TraceID() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: cur}))
	}
	name := processOperation
	attrs := []attribute.KeyValue{
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName(processOperation),
		semconv.MessagingMessageID(msg.EventID),
		semconv.MessagingConsumerGroupName(ib.consumer),
	}
	if msg.System != "" {
		attrs = append(attrs, semconv.MessagingSystemKey.String(msg.System))
	}
	if msg.Destination != "" {
		name += " " + msg.Destination
		attrs = append(attrs, semconv.MessagingDestinationName(msg.Destination))
	}
	opts = append(opts, trace.WithAttributes(attrs...))
	return tr.Start(ctx, name, opts...)
}

// endProcess ends a process span with the message's outcome.
func endProcess(span trace.Span, outcome Outcome, err error) {
	if span == nil {
		return
	}
	span.SetAttributes(AttrOutcome.String(outcome.String()))
	if err != nil {
		span.SetAttributes(semconv.ErrorTypeKey.String(outcome.String()))
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
