package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// defaultServiceName is the relay's service.name unless OTEL_SERVICE_NAME
// or OTEL_RESOURCE_ATTRIBUTES say otherwise.
const defaultServiceName = "outbox-relay"

// tracerFromEnv builds the relay's tracer provider from the standard
// OTEL_* environment variables (docs/tracing.md): an OTLP exporter
// (http/protobuf, or grpc as OTEL_EXPORTER_OTLP_PROTOCOL says) when OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
// OTEL_EXPORTER_OTLP_ENDPOINT is set, nothing otherwise. The exporter reads
// its own variables (headers, timeout, compression, TLS), the SDK the
// sampler (OTEL_TRACES_SAMPLER) and the batching (OTEL_BSP_*), the
// resource OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES. It returns a nil
// provider when tracing is off, and shutdown, which flushes what is left.
func tracerFromEnv(ctx context.Context, log *slog.Logger) (tp trace.TracerProvider, shutdown func(context.Context) error, err error) {
	off := func(context.Context) error { return nil }
	if v := os.Getenv("OTEL_SDK_DISABLED"); v != "" {
		if disabled, err := strconv.ParseBool(v); err == nil && disabled {
			return nil, off, nil
		}
	}
	switch e := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")); e {
	case "", "otlp":
	case "none":
		return nil, off, nil
	default:
		return nil, nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%s: the relay exports with otlp (or none)", e)
	}
	endpoint := firstEnv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
	if endpoint == "" {
		return nil, off, nil
	}
	var exp sdktrace.SpanExporter
	switch p := firstEnv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"); p {
	case "", "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%s: use http/protobuf (the default) or grpc", p)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: OTLP exporter for %s: %w", endpoint, err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(defaultServiceName)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(),
	)
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: resource from OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	// Export failures go to the relay's log, as one line each.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("tracing: exporting spans failed", "err", err)
	}))
	sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	log.Info("tracing: exporting spans over OTLP", "endpoint", endpoint)
	return sdk, sdk.Shutdown, nil
}

// firstEnv returns the value of the first of names that is set and not
// blank.
func firstEnv(names ...string) string {
	for _, n := range names {
		if v := strings.TrimSpace(os.Getenv(n)); v != "" {
			return v
		}
	}
	return ""
}
