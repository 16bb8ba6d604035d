package pgschema

import (
	"encoding/base64"
	"encoding/json"
	"strconv"

	"github.com/outboxkit/outbox/outboxdriver"
)

// Events as logical decoding messages (message mode,
// docs/cdc.md#the-three-write-modes): the contract between the writer that
// emits them (outboxpgx.WithMessages, or plain SQL) and log tailing, which
// decodes them (package outboxpgx/cdc).
//
// A writer in message mode adds no row: each event is one transactional
// logical decoding message,
//
//	SELECT pg_logical_emit_message(true, 'outbox:public.outbox', '{"v":1,"id":"...",...}');
//
// emitted through the table's function _cdc_emit (version 23), which
// refuses while no replication slot of the table's exists.
//
// which PostgreSQL writes to the WAL only, decodes at the transaction's
// commit (in commit order) and never if it rolls back. Only a relay with
// --source cdc reads them. The prefix names the outbox table
// (MessagePrefix); the content is a JSON object of MessageVersion 1:
//
//	v                  1 (required)
//	id                 the event id, a UUID (required)
//	aggregatetype      a non-empty string (required)
//	aggregateid        a non-empty string (required): the message key
//	type               a non-empty string (required)
//	payload            any JSON value, published byte for byte; absent or
//	                   null for none
//	payload_base64     a payload that is not JSON, in standard base64;
//	                   instead of payload
//	headers            an object of header names to string values
//	tracingspancontext W3C trace context, "traceparent=...\ntracestate=..."
//
// Fields not listed are ignored, so that a later version can add some. A
// message with the table's prefix that does not follow the format is
// dead-lettered (with its content as the raw payload), never dropped.

// MessageVersion is the version of the content format of the logical
// decoding messages written in message mode.
const MessageVersion = 1

// MessagePrefix is the prefix of the logical decoding messages that carry
// the events of table t: "outbox:" followed by schema.table.
func MessagePrefix(t outboxdriver.Table) string {
	return "outbox:" + t.WithDefaults().String()
}

// Message is the content of a message as decoded: the format's fields,
// as AppendMessage writes them.
type Message struct {
	V                  *int            `json:"v"`
	ID                 string          `json:"id"`
	AggregateType      string          `json:"aggregatetype"`
	AggregateID        string          `json:"aggregateid"`
	Type               string          `json:"type"`
	Payload            json.RawMessage `json:"payload"`
	PayloadBase64      *string         `json:"payload_base64"`
	Headers            json.RawMessage `json:"headers"`
	TracingSpanContext string          `json:"tracingspancontext"`
}

// AppendMessage appends the content of row's message to b. Strings are
// JSON-encoded; the payload and headers are JSON already (the core
// validated them) and go in as they are, so the payload reaches the broker
// byte for byte.
func AppendMessage(b []byte, r *outboxdriver.Row) []byte {
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, MessageVersion, 10)
	b = appendField(b, "id", r.ID)
	b = appendField(b, "aggregatetype", r.AggregateType)
	b = appendField(b, "aggregateid", r.AggregateID)
	b = appendField(b, "type", r.Type)
	switch {
	case r.Payload != nil:
		b = append(b, `,"payload":`...)
		b = append(b, r.Payload...)
	case r.RawPayload != nil:
		b = append(b, `,"payload_base64":"`...)
		b = base64.StdEncoding.AppendEncode(b, r.RawPayload)
		b = append(b, '"')
	}
	if len(r.Headers) > 0 {
		b = append(b, `,"headers":`...)
		b = append(b, r.Headers...)
	}
	if r.TraceContext != "" {
		b = appendField(b, "tracingspancontext", r.TraceContext)
	}
	return append(b, '}')
}

func appendField(b []byte, name, value string) []byte {
	b = append(b, ',', '"')
	b = append(b, name...)
	b = append(b, '"', ':')
	v, _ := json.Marshal(value) // a string always encodes
	return append(b, v...)
}
