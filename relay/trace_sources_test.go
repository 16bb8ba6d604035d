package relay_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/internal/tracing"
	"github.com/outboxkit/outbox/relay"
)

// The context a writer's span stored with an event reaches the relay from
// either source: the publish span is that span's child, in its trace, and
// the message carries the publish span's traceparent.
func TestPublishSpanContinuesTheWritersTrace(t *testing.T) {
	t.Parallel()
	testenv.ForSources(t, testPublishSpanContinuesTheWritersTrace)
}

func testPublishSpanContinuesTheWritersTrace(t *testing.T, source string) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	e := newEnvFor(t, source)
	e.start(t, nil, relay.Config{TracerProvider: tp})

	ctx, span := tp.Tracer("test").Start(context.Background(), "place order")
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		return e.ob.WriteTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "42", Type: "OrderPlaced", Payload: []byte(`{"order":42}`)})
	})
	span.End()
	if err != nil {
		t.Fatal(err)
	}
	writer := span.SpanContext()

	testenv.WaitStreamMsgs(t, e.stream, 1, 30*time.Second)
	msg := testenv.StreamMessages(t, e.stream)[0]
	var publish sdktrace.ReadOnlySpan
	await.Eventually(t, 10*time.Second, func() error {
		for _, s := range exp.GetSpans().Snapshots() {
			if s.SpanKind() == trace.SpanKindProducer {
				publish = s
			}
		}
		if publish == nil {
			return errors.New("no publish span ended since the message arrived")
		}
		return nil
	})
	if publish.Parent().SpanID() != writer.SpanID() || publish.SpanContext().TraceID() != writer.TraceID() {
		t.Fatalf("publish span: parent %v in trace %v; want the writer's span %v of trace %v",
			publish.Parent().SpanID(), publish.SpanContext().TraceID(), writer.SpanID(), writer.TraceID())
	}
	want := string(tracing.AppendTraceparent00(nil, publish.SpanContext()))
	if got := msg.Header.Get(tracing.Traceparent); got != want {
		t.Fatalf("message traceparent %q, want the publish span's %q", got, want)
	}
}
