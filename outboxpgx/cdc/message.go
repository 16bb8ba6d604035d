package outboxpgx

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/bytedance/sonic"
	"github.com/google/uuid"

	"github.com/outboxkit/outbox/outboxdriver"
)

// Events as logical decoding messages (message mode,
// docs/cdc.md#the-three-write-modes).
//
// A writer in message mode adds no row: each event is one transactional
// logical decoding message,
//
//	SELECT pg_logical_emit_message(true, 'outbox:public.outbox', '{"v":1,"id":"...",...}');
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

// appendMessage appends the content of row's message to b. Strings are
// JSON-encoded; the payload and headers are JSON already (the core
// validated them) and go in as they are, so the payload reaches the broker
// byte for byte.
func appendMessage(b []byte, r *outboxdriver.Row) []byte {
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

// wireMessage is the content of a message as decoded.
type wireMessage struct {
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

// wireDecoder reads the content of a message (valid UTF-8) in one pass,
// in about a quarter of encoding/json's time (the relay decodes every
// message it streams; BenchmarkDecodeMessage). ValidateString refuses
// control characters in strings; what it refuses goes to decodeWire, so
// that the relay accepts and refuses the same contents as with
// encoding/json alone, and decodes them alike (FuzzDecodeMessage
// compares the two).
var wireDecoder = sonic.Config{ValidateString: true}.Froze()

// decodeWire reads the content with encoding/json.
func decodeWire(content []byte) (w wireMessage, err error) {
	d := json.NewDecoder(bytes.NewReader(content))
	if err := d.Decode(&w); err != nil {
		return w, fmt.Errorf("%w: the content is not a JSON object of format version %d (%s)", errMessage, MessageVersion, jsonError(err))
	}
	if d.More() {
		return w, fmt.Errorf("%w: the content holds more than one JSON value", errMessage)
	}
	return w, nil
}

// errMessage is wrapped by every reason a message's content is refused.
var errMessage = errors.New("not an outbox event message")

// decodeMessage reads a message's content into an event. It returns the
// event and nil, or an error (wrapping errMessage) that names what is
// wrong; the event then holds what could be read, for the dead-letter
// table.
//
// The fields may point into content: the caller keeps it (and does not
// change it) as long as the event lives.
func decodeMessage(content []byte) (ev event, err error) {
	var w wireMessage
	if !utf8.Valid(content) || wireDecoder.Unmarshal(content, &w) != nil {
		// encoding/json has the last word on what the fast decoder
		// refuses, and words the reason. It also takes content that is
		// not UTF-8: the fast decoder would change such bytes in the
		// payload, which must reach the broker byte for byte.
		if w, err = decodeWire(content); err != nil {
			return ev, err
		}
	}
	ev.AggregateType, ev.AggregateID, ev.Type = w.AggregateType, w.AggregateID, w.Type
	ev.TraceContext = w.TracingSpanContext
	if u, err := uuid.Parse(w.ID); err == nil {
		ev.ID = u.String()
	}
	switch {
	case w.V == nil:
		return ev, fmt.Errorf("%w: the format version \"v\" is missing", errMessage)
	case *w.V != MessageVersion:
		return ev, fmt.Errorf("%w: format version %d is not known to this relay (it reads version %d)", errMessage, *w.V, MessageVersion)
	case ev.ID == "":
		return ev, fmt.Errorf("%w: \"id\" must be a UUID", errMessage)
	case strings.TrimSpace(w.AggregateType) == "":
		return ev, fmt.Errorf("%w: \"aggregatetype\" is missing or empty", errMessage)
	case strings.TrimSpace(w.AggregateID) == "":
		return ev, fmt.Errorf("%w: \"aggregateid\" is missing or empty", errMessage)
	case strings.TrimSpace(w.Type) == "":
		return ev, fmt.Errorf("%w: \"type\" is missing or empty", errMessage)
	case strings.ContainsRune(w.AggregateType+w.AggregateID+w.Type+w.TracingSpanContext, 0):
		return ev, fmt.Errorf("%w: a NUL character in \"aggregatetype\", \"aggregateid\", \"type\" or \"tracingspancontext\"", errMessage)
	case w.PayloadBase64 != nil && len(w.Payload) > 0 && string(w.Payload) != "null":
		return ev, fmt.Errorf("%w: both \"payload\" and \"payload_base64\" are given", errMessage)
	}
	switch {
	case w.PayloadBase64 != nil:
		raw, err := base64.StdEncoding.DecodeString(*w.PayloadBase64)
		if err != nil {
			return ev, fmt.Errorf("%w: \"payload_base64\" is not standard base64", errMessage)
		}
		ev.RawPayload = raw
	case len(w.Payload) > 0 && string(w.Payload) != "null":
		ev.Payload = w.Payload
	}
	ev.HeadersJSON = w.Headers
	return ev, nil
}

// jsonError describes a JSON decoding error without quoting the content.
func jsonError(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("invalid JSON at byte %d", se.Offset)
	case errors.As(err, &te):
		if te.Field != "" {
			return fmt.Sprintf("field %q holds a JSON %s", te.Field, te.Value)
		}
		return "it is a JSON " + te.Value
	default:
		return "invalid JSON"
	}
}

// messageStatement returns the statement that emits rows as messages of
// table t, in order, and its arguments.
func messageStatement(t outboxdriver.Table, rows []outboxdriver.Row) (string, []any) {
	prefix := MessagePrefix(t)
	if len(rows) == 1 {
		return `SELECT pg_logical_emit_message(true, $1, $2::text)`, []any{prefix, string(appendMessage(nil, &rows[0]))}
	}
	contents := make([]string, len(rows))
	var buf []byte
	for i := range rows {
		buf = appendMessage(buf[:0], &rows[i])
		contents[i] = string(buf)
	}
	return `SELECT pg_logical_emit_message(true, $1, m.c) FROM unnest($2::text[]) WITH ORDINALITY AS m(c, i) ORDER BY m.i`, []any{prefix, contents}
}
