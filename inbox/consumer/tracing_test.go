package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/inbox/inboxpgx"
	"github.com/outboxkit/outbox/internal/testenv"
)

// A message whose handler fails runs in a process span, a child of the
// traceparent it carries (its header name in HTTP's case), that records
// the failure; the log lines about it carry the trace id.
func TestFailingMessageIsTracedAndItsLogLinesCarryTheTraceID(t *testing.T) {
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	tbl.Name = "inbox"
	if _, err := inboxpgx.Migrate(testenv.Context(t, 30*time.Second), pool, tbl); err != nil {
		t.Fatal(err)
	}
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	ib, err := inbox.New(inboxpgx.New(pool), &inbox.Config{Consumer: "c", Schema: tbl.Schema, Table: tbl.Name, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	logs := &testenv.Buffer{}
	eng, err := consumer.New(ib, func(context.Context, pgx.Tx, inbox.Message) error { return errors.New("no such account") },
		&consumer.Config{MaxAttempts: 2, RetryBase: time.Millisecond, RetryMax: time.Millisecond, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer eng.Stop(context.Background())

	const traceID, parent = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	d := newDelivery("k")
	d.msg.Destination = "outbox.event.order"
	d.msg.Headers = map[string]string{"Traceparent": "00-" + traceID + "-" + parent + "-01"}
	if err := eng.Submit(testenv.Context(t, 10*time.Second), d); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.ended:
	case <-time.After(30 * time.Second):
		t.Fatal("the message was neither acknowledged nor released")
	}
	spans := exp.GetSpans().Snapshots()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want one process span per attempt (2)", len(spans))
	}
	for _, s := range spans {
		if s.Name() != "process outbox.event.order" || s.SpanContext().TraceID().String() != traceID || s.Parent().SpanID().String() != parent {
			t.Errorf("span %q trace %s parent %s, want process outbox.event.order in %s under %s", s.Name(), s.SpanContext().TraceID(), s.Parent().SpanID(), traceID, parent)
		}
		if s.Status().Code != codes.Error || s.Status().Description != "no such account" {
			t.Errorf("span status %v, want the handler's error", s.Status())
		}
	}
	for _, what := range []string{"handler failed; retrying", "message dead-lettered"} {
		var line string
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, what) {
				line = l
			}
		}
		if !strings.Contains(line, "trace_id="+traceID) {
			t.Errorf("log line %q lacks trace_id=%s (logs:\n%s)", what, traceID, logs.String())
		}
	}
}
