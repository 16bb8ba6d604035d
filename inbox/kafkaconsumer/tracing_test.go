package kafkaconsumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/inboxpgx"
	"github.com/outboxkit/outbox/inbox/internal/tracingtest"
	"github.com/outboxkit/outbox/sink/kafkasink"
)

// One trace runs from the writer's span through the relay's publish span
// (PostgreSQL, then Kafka) into the consumer's process span, in which the
// handler runs.
func TestOneTraceFromWriterThroughKafkaToTheHandler(t *testing.T) {
	f := newFixture(t, 1)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	tr := tp.Tracer("test")

	cl, err := kgo.NewClient(kgo.SeedBrokers(f.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	snk, err := kafkasink.New(cl, nil)
	if err != nil {
		t.Fatal(err)
	}
	id := tracingtest.WriterAndRelay(t, f.pool, f.tbl.Schema, tp, "place order", snk, nil)

	ib, err := inbox.New(inboxpgx.New(f.pool), &inbox.Config{Consumer: "billing", Schema: f.tbl.Schema, Table: f.tbl.Name, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	h := f.handler("billing")
	start(t, ib, func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		ctx, span := tr.Start(ctx, "apply order")
		defer span.End()
		return h(ctx, tx, msg)
	}, f.config("billing"))

	if p := tracingtest.Wait(30*time.Second, exp, "place order", "apply order", topic, id); p != "" {
		t.Fatal(p)
	}
}
