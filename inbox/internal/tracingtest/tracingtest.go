// Package tracingtest checks, for the end-to-end tests of the consumers,
// that one trace runs from a writer's span through the relay's publish
// span into the consumer's process span.
package tracingtest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/route"
	"github.com/outboxkit/outbox/sink"
)

// Chain looks in exp for the spans of one event: the writer's span named
// writer, the relay's producer span "publish <destination>" and the
// consumer's consumer span "process <destination>" whose
// messaging.message.id is eventID, and the handler's span named handler.
// It returns a description of what is missing or wrongly linked, or ""
// when each span is the child of the one before, in one trace.
func Chain(exp *tracetest.InMemoryExporter, writer, handler, destination, eventID string) string {
	var w, pub, proc, h []sdktrace.ReadOnlySpan
	for _, s := range exp.GetSpans().Snapshots() {
		switch {
		case s.Name() == writer:
			w = append(w, s)
		case s.Name() == handler:
			h = append(h, s)
		case s.Name() == "publish "+destination && s.SpanKind() == trace.SpanKindProducer && messageID(s) == eventID:
			pub = append(pub, s)
		case s.Name() == "process "+destination && s.SpanKind() == trace.SpanKindConsumer && messageID(s) == eventID:
			proc = append(proc, s)
		}
	}
	if len(w) != 1 || len(pub) != 1 || len(proc) != 1 || len(h) != 1 {
		return fmt.Sprintf("spans: %d writer %q, %d publish, %d process, %d handler %q; want one of each (all: %s)",
			len(w), writer, len(pub), len(proc), len(h), handler, names(exp))
	}
	var problems []string
	link := func(child, parent sdktrace.ReadOnlySpan) {
		if child.Parent().SpanID() != parent.SpanContext().SpanID() || child.SpanContext().TraceID() != parent.SpanContext().TraceID() {
			problems = append(problems, fmt.Sprintf("%q has parent %s in trace %s, want %q (%s in trace %s)",
				child.Name(), child.Parent().SpanID(), child.SpanContext().TraceID(),
				parent.Name(), parent.SpanContext().SpanID(), parent.SpanContext().TraceID()))
		}
	}
	link(pub[0], w[0])
	link(proc[0], pub[0])
	link(h[0], proc[0])
	for _, s := range []sdktrace.ReadOnlySpan{pub[0], proc[0]} {
		if a := attr(s, "messaging.system"); a == "" {
			problems = append(problems, fmt.Sprintf("%q has no messaging.system", s.Name()))
		}
		if a := attr(s, "messaging.destination.name"); a != destination {
			problems = append(problems, fmt.Sprintf("%q has messaging.destination.name %q", s.Name(), a))
		}
	}
	if o := attr(pub[0], "outbox.outcome"); o != "published" {
		problems = append(problems, fmt.Sprintf("publish outcome %q, want published", o))
	}
	if o := attr(proc[0], "outbox.inbox.outcome"); o != "processed" {
		problems = append(problems, fmt.Sprintf("process outcome %q, want processed", o))
	}
	return strings.Join(problems, "; ")
}

// Wait polls Chain until it reports nothing or timeout passes, and returns
// its last report.
func Wait(timeout time.Duration, exp *tracetest.InMemoryExporter, writer, handler, destination, eventID string) string {
	end := time.Now().Add(timeout)
	for {
		p := Chain(exp, writer, handler, destination, eventID)
		if p == "" || time.Now().After(end) {
			return p
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func messageID(s sdktrace.ReadOnlySpan) string { return attr(s, "messaging.message.id") }

func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

func names(exp *tracetest.InMemoryExporter) string {
	var n []string
	for _, s := range exp.GetSpans().Snapshots() {
		n = append(n, s.Name())
	}
	return strings.Join(n, ", ")
}

// WriterAndRelay migrates an outbox table in schema, writes one event
// (aggregate type "order") in a span named writer of tp, committed, and
// starts a relay with tp from that table to snk (routed by router, nil
// for Debezium's default), stopped when the test ends. It returns the
// event's id.
func WriterAndRelay(t *testing.T, pool *pgxpool.Pool, schema string, tp trace.TracerProvider, writer string, snk sink.Sink, router *route.Router) string {
	t.Helper()
	ctx := testenv.Context(t, time.Minute)
	tbl := outboxdriver.Table{Schema: schema, Name: "outbox"}
	drv := outboxpgx.New(pool)
	if _, err := drv.Migrate(ctx, tbl, nil); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(drv, &outbox.Config{Schema: tbl.Schema, Table: tbl.Name})
	if err != nil {
		t.Fatal(err)
	}
	id := uuid.Must(uuid.NewV7()).String()
	wctx, span := tp.Tracer("test").Start(ctx, writer)
	err = pgx.BeginFunc(wctx, pool, func(tx pgx.Tx) error {
		return ob.WriteTx(wctx, tx, outbox.Event{ID: id, AggregateType: "order", AggregateID: "42", Type: "OrderPlaced", Payload: []byte(`{"order":42}`)})
	})
	span.End()
	if err != nil {
		t.Fatal(err)
	}
	src, err := drv.NewSource(tbl, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	rl, err := relay.New(src, snk, &relay.Config{Router: router, PollInterval: 100 * time.Millisecond, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	if err := rl.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rl.Stop(context.Background()) })
	return id
}
