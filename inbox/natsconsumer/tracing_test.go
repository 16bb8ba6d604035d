package natsconsumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/inboxpgx"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/tracing/tracingtest"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/route"
	"github.com/outboxkit/outbox/sink/natssink"
)

// One trace runs from the writer's span through the relay's publish span
// (PostgreSQL, then JetStream) into the consumer's process span, in which
// the handler runs.
func TestOneTraceFromWriterThroughJetStreamToTheHandler(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := testenv.Context(t, time.Minute)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	tr := tp.Tracer("test")

	obTable := outboxdriver.Table{Schema: f.tbl.Schema, Name: "outbox"}
	drv := outboxpgx.New(f.pool)
	if _, err := drv.Migrate(ctx, obTable, nil); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(drv, &outbox.Config{Schema: obTable.Schema, Table: obTable.Name})
	if err != nil {
		t.Fatal(err)
	}
	const id = "0190a0b0-0000-7000-8000-000000000001"
	wctx, span := tr.Start(ctx, "place order")
	if err := pgx.BeginFunc(wctx, f.pool, func(tx pgx.Tx) error {
		return ob.WriteTx(wctx, tx, outbox.Event{ID: id, AggregateType: "order", AggregateID: "42", Type: "OrderPlaced", Payload: []byte(`{"order":42}`)})
	}); err != nil {
		t.Fatal(err)
	}
	span.End()

	src, err := drv.NewSource(obTable, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	snk, err := natssink.New(f.js, &natssink.Config{Stream: f.stream})
	if err != nil {
		t.Fatal(err)
	}
	router, err := route.New(&route.Config{Replacement: f.stream + ".${routedByValue}"})
	if err != nil {
		t.Fatal(err)
	}
	rl, err := relay.New(src, snk, &relay.Config{Router: router, PollInterval: 100 * time.Millisecond, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	if err := rl.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rl.Stop(context.Background()) })

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
