// Package relay publishes committed outbox events to a broker.
//
// Aggregates hash into a fixed number of partitions. Every relay on a table
// registers itself, takes a fair share of the partitions as leases judged by
// the database clock, and relays only those: one batch at a time, claimed in
// insertion order, routed (package route), published through a sink.Sink
// and recorded only after the broker acknowledged. Within a batch, the
// events of one aggregate are published in waves (the next only after the
// previous was acknowledged), so a failed event is never overtaken by a
// later event of its own aggregate; other aggregates flow on.
//
// Pauses (outbox pause) are honoured here, for every source that is an
// outboxdriver.PauseReader: the relay reads them at most once per poll
// interval, before it claims, leaves paused events untouched (their
// aggregates wait, no attempt is spent) and asks a source that is an
// outboxdriver.ClaimExcluder to leave paused aggregate types out of its
// claims.
//
// With a tracer provider (Config.TracerProvider, or the global one once
// the application sets it), every publish is an OpenTelemetry producer
// span, a child of the trace context its writer stored, and the message
// carries that span's traceparent (docs/tracing.md).
//
// The engine never imports a database or broker client: it talks to an
// outboxdriver.Source and a sink.Sink.
package relay
