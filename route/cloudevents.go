package route

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/sink"
)

// CloudEventsMode is how a message carries a CloudEvent.
type CloudEventsMode string

// The CloudEvents 1.0 content modes.
const (
	// Binary keeps the payload as the message's value and carries the
	// event's attributes as headers named with the binding's prefix
	// (ce_id, ce_source, ...; content-type for datacontenttype).
	Binary CloudEventsMode = "binary"
	// Structured makes the value the event's JSON envelope (attributes
	// and data), with content-type application/cloudevents+json.
	Structured CloudEventsMode = "structured"
)

// Header prefixes of the CloudEvents protocol bindings for binary mode.
const (
	PrefixKafka = "ce_"          // Kafka protocol binding
	PrefixHTTP  = "ce-"          // HTTP protocol binding (webhooks)
	PrefixNATS  = "ce-"          // NATS protocol binding (headers)
	PrefixAMQP  = "cloudEvents:" // AMQP protocol binding (application properties)
)

// CloudEvents makes every message a CloudEvent 1.0: id is the event id,
// type the event type, subject the aggregate id, time the row's creation
// time, datacontenttype application/json for a JSON payload (else
// application/octet-stream), traceparent and tracestate the stored trace
// context (the Distributed Tracing extension), eventversion the
// eventVersion header, and dataschema the contract's URI when DataSchema
// names one.
type CloudEvents struct {
	// Mode is Binary or Structured. Required.
	Mode CloudEventsMode
	// Source is the event's source, a URI-reference that names the
	// producing context ("/orders-service", "urn:acme:orders"). Required.
	Source string
	// Prefix names the attribute headers in binary mode; use the
	// binding's (PrefixKafka, PrefixHTTP, PrefixNATS, PrefixAMQP).
	// Defaults to "ce-".
	Prefix string
	// DataSchema, when set, returns the URI of an event's contract, or ""
	// (contract.Registry.DataSchema).
	DataSchema func(aggregateType, eventType, version string) string
}

// ContentTypeStructured is the content type of a structured CloudEvent.
const ContentTypeStructured = "application/cloudevents+json"

func (c *CloudEvents) check() error {
	switch c.Mode {
	case Binary, Structured:
	default:
		return fmt.Errorf("route: CloudEvents mode %q: use binary or structured", c.Mode)
	}
	if strings.TrimSpace(c.Source) == "" {
		return errors.New("route: CloudEvents needs a source (a URI-reference naming the producer, e.g. /orders-service)")
	}
	if c.Prefix == "" {
		c.Prefix = PrefixHTTP
	}
	return nil
}

// cloudEvent rewrites m, built from rec, as a CloudEvent.
func (c *CloudEvents) cloudEvent(m sink.Message, rec *outboxdriver.Record) (sink.Message, error) {
	contentType := ""
	switch {
	case len(rec.Payload) == 0:
	case json.Valid(rec.Payload):
		contentType = "application/json"
	default:
		contentType = "application/octet-stream"
	}
	attrs := []sink.Header{
		{Key: "specversion", Value: "1.0"},
		{Key: "id", Value: rec.ID},
		{Key: "source", Value: c.Source},
		{Key: "type", Value: rec.Type},
		{Key: "subject", Value: rec.AggregateID},
	}
	if !rec.CreatedAt.IsZero() {
		attrs = append(attrs, sink.Header{Key: "time", Value: rec.CreatedAt.UTC().Format(time.RFC3339Nano)})
	}
	version := rec.Headers[outboxdriver.VersionHeader]
	if c.DataSchema != nil {
		if ds := c.DataSchema(rec.AggregateType, rec.Type, version); ds != "" {
			attrs = append(attrs, sink.Header{Key: "dataschema", Value: ds})
		}
	}
	if version != "" {
		attrs = append(attrs, sink.Header{Key: "eventversion", Value: version})
	}
	for _, h := range m.Headers {
		if h.Key == "traceparent" || h.Key == "tracestate" {
			attrs = append(attrs, h)
		}
	}
	if c.Mode == Binary {
		for _, a := range attrs {
			m.Headers = append(m.Headers, sink.Header{Key: c.Prefix + a.Key, Value: a.Value})
		}
		if contentType != "" {
			m.Headers = append(m.Headers, sink.Header{Key: "content-type", Value: contentType})
		}
		return m, nil
	}
	env := make(map[string]any, len(attrs)+2)
	for _, a := range attrs {
		env[a.Key] = a.Value
	}
	switch contentType {
	case "application/json":
		env["datacontenttype"] = contentType
		env["data"] = json.RawMessage(rec.Payload)
	case "application/octet-stream":
		env["datacontenttype"] = contentType
		env["data_base64"] = base64.StdEncoding.EncodeToString(rec.Payload)
	}
	if contentType == "application/json" && !utf8.Valid(rec.Payload) {
		return sink.Message{}, fmt.Errorf("route: event %s: the JSON payload is not UTF-8", rec.ID)
	}
	v, err := json.Marshal(env)
	if err != nil {
		return sink.Message{}, fmt.Errorf("route: event %s: CloudEvents envelope: %w", rec.ID, err)
	}
	m.Value = v
	m.Headers = append(m.Headers, sink.Header{Key: "content-type", Value: ContentTypeStructured})
	return m, nil
}
