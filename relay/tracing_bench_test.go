package relay

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/outboxkit/outbox/internal/tracing"
	"github.com/outboxkit/outbox/outboxdriver"
)

// benchBatch is a batch of 500 events over 50 aggregates, each with its
// writer's stored trace context.
func benchBatch() []outboxdriver.Record {
	recs := make([]outboxdriver.Record, 500)
	for i := range recs {
		recs[i] = outboxdriver.Record{ID: fmt.Sprintf("e%d", i), Seq: int64(i + 1), AggregateType: "order",
			AggregateID: fmt.Sprint(i % 50), Type: "Placed", Payload: []byte(`{"n":1}`), TraceContext: writerContext}
	}
	return recs
}

// BenchmarkProcess is the cost of one batch of 500 events through process
// (routing, waves, publish to a sink that acknowledges at once, record)
// with tracing off (the global provider before the application sets one),
// with a no-op provider, and with the SDK sampling nothing or everything
// (spans dropped at the end): the figures of docs/tracing.md. allocs/event
// is allocs/op over the batch's 500 events: compare a case with "off" for
// what tracing adds per event.
func BenchmarkProcess(b *testing.B) {
	never := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	always := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(dropSpans{}))
	for _, c := range []struct {
		name string
		tp   trace.TracerProvider
	}{{"off", nil}, {"noop", noop.NewTracerProvider()}, {"never-sample", never}, {"always-sample", always},
		{"off-no-stored-context", nil}, {"never-sample-no-stored-context", never},
		{"never-sample-no-tracestate", never}} {
		b.Run(c.name, func(b *testing.B) {
			recs := benchBatch()
			for i := range recs {
				switch {
				case strings.HasSuffix(c.name, "no-stored-context"):
					recs[i].TraceContext = "" // written without a span, as the drain benchmark's rows
				case strings.HasSuffix(c.name, "no-tracestate"):
					recs[i].TraceContext, _, _ = strings.Cut(recs[i].TraceContext, "\n")
				}
			}
			src := &fakeSource{}
			r, err := New(src, &msgSink{}, &Config{TracerProvider: c.tp, Logger: discard})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for b.Loop() {
				src.outcomes = src.outcomes[:0]
				r.snk.(*msgSink).msgs = r.snk.(*msgSink).msgs[:0]
				r.process(context.Background(), &fakeBatch{src: src, recs: recs}, recs)
			}
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/event")
			b.ReportMetric(float64(after.Mallocs-before.Mallocs)/float64(b.N*len(recs)), "allocs/event")
		})
	}
}

// BenchmarkSpanShapes compares the two shapes a publish span could take
// for a batch of 500 events: one span per event (a child of the event's
// stored context, its traceparent injected into the event's message), or
// one span per batch with one link per event (the same traceparent in
// every message of the batch). Routing and publishing are left out: only
// the tracing work is measured.
func BenchmarkSpanShapes(b *testing.B) {
	for _, sampled := range []bool{false, true} {
		sampler := sdktrace.NeverSample()
		if sampled {
			sampler = sdktrace.AlwaysSample()
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithSpanProcessor(dropSpans{}))
		tr := tp.Tracer(tracing.ScopeName)
		recs := benchBatch()
		ctx := context.Background()
		b.Run(fmt.Sprintf("per-event/sampled=%v", sampled), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				for i := range recs {
					pctx := tracing.Extract(ctx, tracing.Stored(recs[i].TraceContext))
					sctx, span := tr.Start(pctx, "publish outbox.event.order", trace.WithSpanKind(trace.SpanKindProducer))
					carrier := map[string]string{}
					tracing.Propagator.Inject(sctx, mapCarrier(carrier))
					span.End()
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/event")
		})
		b.Run(fmt.Sprintf("per-batch-links/sampled=%v", sampled), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				links := make([]trace.Link, 0, len(recs))
				for i := range recs {
					pctx := tracing.Extract(ctx, tracing.Stored(recs[i].TraceContext))
					links = append(links, trace.LinkFromContext(pctx))
				}
				sctx, span := tr.Start(ctx, "publish outbox.event.order", trace.WithSpanKind(trace.SpanKindProducer), trace.WithLinks(links...))
				carrier := map[string]string{}
				tracing.Propagator.Inject(sctx, mapCarrier(carrier))
				span.End()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/event")
		})
	}
}

type mapCarrier map[string]string

func (c mapCarrier) Get(k string) string { return c[k] }
func (c mapCarrier) Set(k, v string)     { c[k] = v }
func (c mapCarrier) Keys() []string      { return nil }

// dropSpans is a span processor that drops every span: the cost of
// exporting is the exporter's, not the relay's.
type dropSpans struct{}

func (dropSpans) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (dropSpans) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (dropSpans) Shutdown(context.Context) error                  { return nil }
func (dropSpans) ForceFlush(context.Context) error                { return nil }
