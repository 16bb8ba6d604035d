package main

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxpgx"
)

// otlpServer is an OTLP/HTTP trace receiver: it decodes every export and
// keeps the spans with their resource's service.name.
type otlpServer struct {
	mu      sync.Mutex
	spans   []*tracepb.Span
	service []string // service.name of spans[i]
	bad     []string // requests it could not decode
}

func (s *otlpServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req coltracepb.ExportTraceServiceRequest
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" || proto.Unmarshal(body, &req) != nil {
		s.bad = append(s.bad, r.Method+" "+r.URL.Path+" "+r.Header.Get("Content-Type"))
		http.Error(w, "bad export", http.StatusBadRequest)
		return
	}
	for _, rs := range req.ResourceSpans {
		svc := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.Key == "service.name" {
				svc = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				s.spans = append(s.spans, sp)
				s.service = append(s.service, svc)
			}
		}
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(nil)
}

// find returns the first span named name and its service.name.
func (s *otlpServer) find(name string) (*tracepb.Span, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, sp := range s.spans {
		if sp.Name == name {
			return sp, s.service[i]
		}
	}
	return nil, ""
}

func spanAttr(sp *tracepb.Span, key string) string {
	for _, kv := range sp.Attributes {
		if kv.Key == key {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

// `outbox relay` with OTEL_EXPORTER_OTLP_ENDPOINT exports its publish
// spans over OTLP/HTTP, as children of the writer's span, and flushes the
// spans still queued when it stops: the batch delay here is longer than
// the test, so only the flush at SIGTERM can deliver them.
func TestRelayExportsOTLPAndFlushesAtExit(t *testing.T) {
	t.Parallel()
	recv := &otlpServer{}
	srv := httptest.NewServer(recv)
	defer srv.Close()
	tb, flags := migrated(t)
	st, sinkFlags := natsTarget(t)
	pool := testenv.Pool(t)
	ob, err := outbox.New(outboxpgx.New(pool), &outbox.Config{Schema: tb.Schema, Table: tb.Name})
	if err != nil {
		t.Fatal(err)
	}
	writer := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0xfe, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
		SpanID:  trace.SpanID{0xfe, 1, 2, 3, 4, 5, 6, 7}, TraceFlags: trace.FlagsSampled,
	})
	ctx := trace.ContextWithSpanContext(context.Background(), writer)
	const id = "0190a0b0-0000-7000-8000-0000000000fe"
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return ob.WriteTx(ctx, tx, outbox.Event{ID: id, AggregateType: "order", AggregateID: "7", Type: "OrderPlaced", Payload: []byte(`{}`)})
	}); err != nil {
		t.Fatal(err)
	}
	p := startRelayEnv(t, []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + srv.URL, "OTEL_SERVICE_NAME=relay-under-test", "OTEL_BSP_SCHEDULE_DELAY=600000",
	}, append(flags, sinkFlags...)...)
	testenv.WaitStreamMsgs(t, st, 1, 30*time.Second)
	waitBacklogZero(t, tb, 30*time.Second)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, p.stderr.String())
	}
	name := "publish " + strings.Replace(sinkFlags[len(sinkFlags)-1], "${routedByValue}", "order", 1)
	sp, svc := recv.find(name)
	if sp == nil {
		recv.mu.Lock()
		defer recv.mu.Unlock()
		t.Fatalf("no span %q received (%d spans, undecodable requests %q); relay stderr:\n%s", name, len(recv.spans), recv.bad, p.stderr.String())
	}
	if hex.EncodeToString(sp.TraceId) != writer.TraceID().String() || hex.EncodeToString(sp.ParentSpanId) != writer.SpanID().String() {
		t.Errorf("span %q: trace %x parent %x, want the writer's %s / %s", name, sp.TraceId, sp.ParentSpanId, writer.TraceID(), writer.SpanID())
	}
	if spanAttr(sp, "messaging.system") != "nats" || spanAttr(sp, "messaging.message.id") != id || spanAttr(sp, "outbox.outcome") != "published" {
		t.Errorf("span %q attributes %v", name, sp.Attributes)
	}
	if svc != "relay-under-test" {
		t.Errorf("service.name %q, want OTEL_SERVICE_NAME's relay-under-test", svc)
	}
}

// An OTLP protocol the relay cannot speak is refused at start, in one line.
func TestRelayRefusesAnUnknownOTLPProtocol(t *testing.T) {
	t.Parallel()
	_, flags := migrated(t)
	failsWithOneLine(t, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL=http/json"},
		"OTEL_EXPORTER_OTLP_PROTOCOL=http/json: use http/protobuf (the default) or grpc",
		append([]string{"relay", "--sink", "stdout:"}, flags...)...)
}
