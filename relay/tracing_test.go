package relay

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/outboxkit/outbox/internal/tracing"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/sink"
)

// msgSink keeps the messages it acknowledges, failing those whose event id
// is in fail.
type msgSink struct {
	fail map[string]error
	msgs []sink.Message
}

func (s *msgSink) Publish(_ context.Context, msgs []sink.Message) []error {
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		errs[i] = s.fail[m.ID]
		s.msgs = append(s.msgs, m)
	}
	return errs
}

func (s *msgSink) Close() error   { return nil }
func (s *msgSink) System() string { return "test" }

// The writer's span: its context is what WriteTx stores.
var (
	writerTrace = trace.TraceID{0xa1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	writerSpan  = trace.SpanID{0xb1, 2, 3, 4, 5, 6, 7, 8}
)

const writerContext = "traceparent=00-a102030405060708090a0b0c0d0e0f10-b102030405060708-01\ntracestate=vendor=x"

// traced runs recs through one batch of a relay with tp and returns the
// messages the sink was given, the log and the batch's outcome.
func traced(t *testing.T, tp trace.TracerProvider, recs []outboxdriver.Record, fail map[string]error) ([]sink.Message, string, outboxdriver.Outcome) {
	t.Helper()
	src := &fakeSource{queue: [][]outboxdriver.Record{recs}}
	snk := &msgSink{fail: fail}
	var logs bytes.Buffer
	r, err := New(src, snk, &Config{TracerProvider: tp, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	b, err := src.Claim(context.Background(), nil, len(recs))
	if err != nil {
		t.Fatal(err)
	}
	r.process(context.Background(), b, b.Records())
	var out outboxdriver.Outcome
	if len(src.outcomes) > 0 {
		out = src.outcomes[0]
	}
	return snk.msgs, logs.String(), out
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]string {
	m := map[attribute.Key]string{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value.String()
	}
	return m
}

// Every event gets a producer span, a child of the context its writer
// stored, with the messaging attributes and its outcome; the message
// carries that span's traceparent (and the writer's tracestate) instead of
// the writer's.
func TestPublishSpanPerEventIsAChildOfTheWriterAndTravelsInTheHeaders(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	recs := records("a1", "b1", "c1", "d1")
	for i := range recs {
		recs[i].TraceContext = writerContext
		recs[i].Partition = 7
	}
	recs[3].TraceContext = "" // written without a span: a root span
	recs[2].AggregateID = "bad\nid"
	msgs, logs, _ := traced(t, tp, recs, map[string]error{"b1": errors.New("nack")})

	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range exp.GetSpans().Snapshots() {
		spans[attrs(s)["messaging.message.id"]] = s
	}
	if len(spans) != 4 {
		t.Fatalf("%d spans, want one per event (4)", len(spans))
	}
	want := map[string]struct{ name, outcome string }{
		"a1": {"publish outbox.event.order", OutcomePublished},
		"b1": {"publish outbox.event.order", OutcomeRetried},
		"c1": {"publish", OutcomeDeadLettered},
		"d1": {"publish outbox.event.order", OutcomePublished},
	}
	for id, w := range want {
		s := spans[id]
		if s == nil {
			t.Fatalf("no span for %s", id)
		}
		a := attrs(s)
		if s.Name() != w.name || a["outbox.outcome"] != w.outcome || s.SpanKind() != trace.SpanKindProducer {
			t.Errorf("%s: span %q kind %v outcome %q, want %q, producer, %q", id, s.Name(), s.SpanKind(), a["outbox.outcome"], w.name, w.outcome)
		}
		if a["messaging.system"] != "test" || a["messaging.operation.type"] != "send" || a["outbox.partition"] != "7" || a["outbox.attempt"] != "1" {
			t.Errorf("%s: attributes %v", id, a)
		}
		if id == "d1" {
			if s.Parent().IsValid() || s.SpanContext().TraceID() == writerTrace {
				t.Errorf("d1 (no stored context): parent %v, want a root span of a new trace", s.Parent())
			}
			continue
		}
		if s.Parent().SpanID() != writerSpan || s.SpanContext().TraceID() != writerTrace || !s.Parent().IsRemote() {
			t.Errorf("%s: parent %v trace %v, want the writer's span %v of trace %v", id, s.Parent().SpanID(), s.SpanContext().TraceID(), writerSpan, writerTrace)
		}
	}
	if a := attrs(spans["a1"]); a["messaging.destination.name"] != "outbox.event.order" {
		t.Errorf("a1: destination %q", a["messaging.destination.name"])
	}
	if spans["b1"].Status().Description != "nack" || spans["c1"].Status().Description == "" {
		t.Errorf("failed spans carry no error: %v, %v", spans["b1"].Status(), spans["c1"].Status())
	}
	for _, m := range msgs {
		sc := spans[m.ID].SpanContext()
		tp, _ := m.Header("traceparent")
		if want := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"; tp != want {
			t.Errorf("%s: traceparent %q, want the publish span's %q", m.ID, tp, want)
		}
		if n := strings.Count(headerNames(m), "traceparent"); n != 1 {
			t.Errorf("%s: %d traceparent headers, want 1: %v", m.ID, n, m.Headers)
		}
		if ts, _ := m.Header("tracestate"); m.ID == "a1" && ts != "vendor=x" {
			t.Errorf("a1: tracestate %q, want the writer's vendor=x", ts)
		}
	}
	// Log lines about an event carry the trace id.
	for _, id := range []string{"b1", "c1"} {
		line := lineWith(logs, "id="+id)
		if want := "trace_id=" + writerTrace.String(); !strings.Contains(line, want) {
			t.Errorf("log line about %s lacks %s: %q", id, want, line)
		}
	}
}

// seenSampler decides as its sampler does, keeping what it was asked
// and, when tracestate is set, writing that tracestate into every span.
type seenSampler struct {
	sdktrace.Sampler
	tracestate string
	seen       []sdktrace.SamplingParameters
}

func (s *seenSampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	s.seen = append(s.seen, p)
	res := s.Sampler.ShouldSample(p)
	if s.tracestate != "" {
		res.Tracestate, _ = trace.ParseTraceState(s.tracestate)
	}
	return res
}

// A publish span the sampler drops still carries the trace on: the message
// has the writer's trace id, a span id of its own with the sampled flag
// off, and the writer's tracestate (or the one the sampler wrote). The
// sampler sees the span's name, kind and the writer's context as a remote
// parent, and no attribute (they are set only on spans that record).
func TestUnsampledPublishSpanCarriesTheTraceOn(t *testing.T) {
	for _, state := range []string{"", "vendor=y,other=z"} {
		exp := tracetest.NewInMemoryExporter()
		sampler := &seenSampler{Sampler: sdktrace.NeverSample(), tracestate: state}
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithSyncer(exp))
		recs := records("a1", "b1", "c1")
		recs[0].TraceContext, recs[1].TraceContext = writerContext, "traceparent=00-a102030405060708090a0b0c0d0e0f10-b102030405060708-00"
		msgs, _, _ := traced(t, tp, recs, nil)
		if n := len(exp.GetSpans()); n != 0 {
			t.Errorf("%d spans exported, want none", n)
		}
		if len(msgs) != 3 || len(sampler.seen) != 3 {
			t.Fatalf("%d messages, the sampler asked %d times, want 3 and 3", len(msgs), len(sampler.seen))
		}
		for i, p := range sampler.seen {
			parent := trace.SpanContextFromContext(p.ParentContext)
			if p.Name != "publish outbox.event.order" || p.Kind != trace.SpanKindProducer || len(p.Attributes) != 0 {
				t.Errorf("sampler asked about %q kind %v attributes %v", p.Name, p.Kind, p.Attributes)
			}
			if wantParent := recs[i].TraceContext != ""; parent.IsValid() != wantParent || wantParent && (parent.SpanID() != writerSpan || !parent.IsRemote() || p.TraceID != writerTrace) {
				t.Errorf("%s: the sampler saw parent %+v, trace %v", recs[i].ID, parent, p.TraceID)
			}
			if i == 0 && (!parent.IsSampled() || parent.TraceState().String() != "vendor=x") {
				t.Errorf("a1: the sampler saw parent flags %v tracestate %q, want the writer's", parent.TraceFlags(), parent.TraceState().String())
			}
		}
		for i, m := range msgs {
			tp, _ := m.Header("traceparent")
			sc, _ := tracing.Stored("traceparent=" + tp).SpanContext()
			if !sc.IsValid() || sc.IsSampled() || sc.SpanID() == writerSpan || strings.Count(headerNames(m), "traceparent") != 1 {
				t.Errorf("%s: traceparent %q, want one of a new unsampled span", m.ID, tp)
			}
			if writer := recs[i].TraceContext != ""; writer != (sc.TraceID() == writerTrace) {
				t.Errorf("%s: traceparent %q: trace of the writer %v, want %v", m.ID, tp, !writer, writer)
			}
			ts, _ := m.Header("tracestate")
			want := state
			if state == "" && i == 0 {
				want = "vendor=x"
			}
			if ts != want {
				t.Errorf("%s: tracestate %q, want %q", m.ID, ts, want)
			}
		}
	}
}

func headerNames(m sink.Message) string {
	var b strings.Builder
	for _, h := range m.Headers {
		b.WriteString(h.Key + " ")
	}
	return b.String()
}

func lineWith(logs, s string) string {
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}

// When nothing of a batch got through, the broker is at fault: the spans
// say deferred, not retried.
func TestPublishSpansOfAnOutageSayDeferred(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	fail := map[string]error{"a1": errors.New("down"), "b1": sink.Unavailable(errors.New("no route"))}
	traced(t, tp, records("a1", "b1"), fail)
	got := exp.GetSpans().Snapshots()
	if len(got) != 2 {
		t.Fatalf("%d spans, want 2", len(got))
	}
	for _, s := range got {
		if a := attrs(s); a["outbox.outcome"] != OutcomeDeferred {
			t.Errorf("%s: outcome %q, want deferred", a["messaging.message.id"], a["outbox.outcome"])
		}
	}
}

// With tracing off (the global provider before the application sets one,
// or a no-op provider) the message carries the writer's own trace context,
// logs still carry its trace id, and resolving the tracer allocates
// nothing.
func TestTracingOffPassesTheWritersContextOn(t *testing.T) {
	for name, tp := range map[string]trace.TracerProvider{"global default": nil, "noop": noop.NewTracerProvider()} {
		recs := records("a1", "b1")
		for i := range recs {
			recs[i].TraceContext = writerContext
		}
		msgs, logs, _ := traced(t, tp, recs, map[string]error{"b1": errors.New("nack")})
		if tp, _ := msgs[0].Header("traceparent"); tp != "00-a102030405060708090a0b0c0d0e0f10-b102030405060708-01" {
			t.Errorf("%s: traceparent %q, want the writer's", name, tp)
		}
		if line := lineWith(logs, "id=b1"); !strings.Contains(line, "trace_id="+writerTrace.String()) {
			t.Errorf("%s: log line lacks the trace id: %q", name, line)
		}
		p := tracing.NewProvider(tp)
		if n := testing.AllocsPerRun(100, func() {
			if p.Tracer() != nil {
				t.Fatal("tracing is on")
			}
		}); n != 0 {
			t.Errorf("%s: resolving the tracer allocates %v times", name, n)
		}
	}
}

// With tracing off, publishing an event allocates nothing beyond what
// routing it does: the work of process per event, less the router's,
// stays below half an allocation (amortised slice growth), where a span,
// a header or an escaping message would add at least one.
func TestTracingOffAddsNoAllocationPerEvent(t *testing.T) {
	for name, tp := range map[string]trace.TracerProvider{"global default": nil, "noop": noop.NewTracerProvider()} {
		if perEvent := allocsPerEvent(t, tp, writerContext); perEvent >= 0.5 {
			t.Errorf("%s: process allocates %.2f times per event beyond routing, want none", name, perEvent)
		}
	}
}

// With the SDK and a sampler that samples nothing, the relay's own work
// allocates nothing per event: what remains is the SDK's span and the
// context it returns (two allocations), and reading the writer's stored
// context (one for the parent's context, one for a tracestate's parsed
// list). An SDK that allocates more per span fails this test too: then
// measure again (docs/tracing.md#cost).
func TestUnsampledPublishSpanAllocationsPerEvent(t *testing.T) {
	never := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	for _, c := range []struct {
		stored string
		want   float64
	}{
		{"", 2},
		{"traceparent=00-a102030405060708090a0b0c0d0e0f10-b102030405060708-01", 3},
		{writerContext, 4},
	} {
		if perEvent := allocsPerEvent(t, never, c.stored); perEvent > c.want+0.25 {
			t.Errorf("stored context %q: process allocates %.2f times per event beyond routing, want at most %v", c.stored, perEvent, c.want)
		}
	}
}

// allocsPerEvent returns the allocations per event of process with tp,
// beyond those of routing the events, over batches of events whose writers
// stored traceContext.
func allocsPerEvent(t *testing.T, tp trace.TracerProvider, traceContext string) float64 {
	t.Helper()
	batch := func(n int) []outboxdriver.Record {
		recs := make([]outboxdriver.Record, n)
		for i := range recs {
			recs[i] = outboxdriver.Record{ID: "e" + strconv.Itoa(i), Seq: int64(i + 1), AggregateType: "order",
				AggregateID: strconv.Itoa(i % 50), Type: "Placed", TraceContext: traceContext}
		}
		return recs
	}
	// own returns the allocations of one process call over n events, less
	// those of routing the n events.
	own := func(n int) float64 {
		recs := batch(n)
		src := &fakeSource{}
		snk := &msgSink{msgs: make([]sink.Message, 0, n)}
		r, err := New(src, snk, &Config{TracerProvider: tp, Logger: discard})
		if err != nil {
			t.Fatal(err)
		}
		all := testing.AllocsPerRun(20, func() {
			src.outcomes, snk.msgs = src.outcomes[:0], snk.msgs[:0]
			r.process(context.Background(), &fakeBatch{src: src, recs: recs}, recs)
		})
		routing := testing.AllocsPerRun(20, func() {
			for i := range recs {
				if _, err := r.cfg.Router.Message(&recs[i]); err != nil {
					t.Fatal(err)
				}
			}
		})
		return all - routing
	}
	return (own(1000) - own(500)) / 500
}
