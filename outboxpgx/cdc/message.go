package cdc

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/bytedance/sonic"
	"github.com/google/uuid"

	"github.com/outboxkit/outbox/internal/pgschema"
)

// Decoding the content of a logical decoding message of message mode
// (docs/cdc.md#the-three-write-modes). The format, and the writer's side
// of it, are package pgschema's (pgschema.Message, AppendMessage).

// wireDecoder reads the content of a message (valid UTF-8) in one pass,
// in about a quarter of encoding/json's time (the relay decodes every
// message it streams; BenchmarkDecodeMessage). ValidateString refuses
// control characters in strings; what it refuses goes to decodeWire, so
// that the relay accepts and refuses the same contents as with
// encoding/json alone, and decodes them alike (FuzzDecodeMessage
// compares the two).
var wireDecoder = sonic.Config{ValidateString: true}.Froze()

// decodeWire reads the content with encoding/json.
func decodeWire(content []byte) (w pgschema.Message, err error) {
	d := json.NewDecoder(bytes.NewReader(content))
	if err := d.Decode(&w); err != nil {
		return w, fmt.Errorf("%w: the content is not a JSON object of format version %d (%s)", errMessage, pgschema.MessageVersion, jsonError(err))
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
	var w pgschema.Message
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
	case *w.V != pgschema.MessageVersion:
		return ev, fmt.Errorf("%w: format version %d is not known to this relay (it reads version %d)", errMessage, *w.V, pgschema.MessageVersion)
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
