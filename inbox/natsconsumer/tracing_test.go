package natsconsumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/inboxpgx"
	"github.com/outboxkit/outbox/inbox/internal/tracingtest"
	"github.com/outboxkit/outbox/route"
	"github.com/outboxkit/outbox/sink/natssink"
)

// One trace runs from the writer's span through the relay's publish span
// (PostgreSQL, then JetStream) into the consumer's process span, in which
// the handler runs.
func TestOneTraceFromWriterThroughJetStreamToTheHandler(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	tr := tp.Tracer("test")

	snk, err := natssink.New(f.js, &natssink.Config{Stream: f.stream})
	if err != nil {
		t.Fatal(err)
	}
	router, err := route.New(&route.Config{Replacement: f.stream + ".${routedByValue}"})
	if err != nil {
		t.Fatal(err)
	}
	id := tracingtest.WriterAndRelay(t, f.pool, f.tbl.Schema, tp, "place order", snk, router)

	ib, err := inbox.New(inboxpgx.New(f.pool), &inbox.Config{Consumer: "billing", Schema: f.tbl.Schema, Table: f.tbl.Name, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	h := handler(f.tbl.Schema, "billing")
	start(t, f.durable(t, "billing", 0), ib, func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		ctx, span := tr.Start(ctx, "apply order")
		defer span.End()
		return h(ctx, tx, msg)
	}, nil)

	if p := tracingtest.Wait(30*time.Second, exp, "place order", "apply order", f.stream+".order", id); p != "" {
		t.Fatal(p)
	}
}
