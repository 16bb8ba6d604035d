package inbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/google/uuid"
)

// Headers and conventions of the messages the outbox's sinks send.
const (
	// HeaderID carries the event id (every sink; Debezium's convention).
	HeaderID = "id"
	// HeaderKey carries the aggregate id on brokers without a message key
	// (NATS JetStream).
	HeaderKey = "key"
	// HeaderNatsMsgID is JetStream's de-duplication header; natssink sets
	// it to the event id.
	HeaderNatsMsgID = "Nats-Msg-Id"
	// DestinationPrefix starts the default destination of an event,
	// outbox.event.<aggregatetype>.
	DestinationPrefix = "outbox.event."
)

// NewMessage builds a Message from a delivery as the outbox's sinks send it:
// the event id from the header "id" (or Nats-Msg-Id), the aggregate id from
// the message key (or the header "key" when key is empty, as on NATS), and
// the aggregate type from a destination outbox.event.<aggregatetype>
// (otherwise it stays empty). headers may be nil; payload is kept as is.
func NewMessage(destination string, key []byte, headers map[string]string, payload []byte) Message {
	m := Message{Destination: destination, Headers: headers, Payload: payload}
	m.EventID = header(headers, HeaderID)
	if m.EventID == "" {
		m.EventID = header(headers, HeaderNatsMsgID)
	}
	if len(key) > 0 {
		m.AggregateID = string(key)
	} else {
		m.AggregateID = header(headers, HeaderKey)
	}
	if at, ok := strings.CutPrefix(destination, DestinationPrefix); ok && at != "" {
		m.AggregateType = at
	}
	return m
}

// header returns headers[name], or the value of a header whose name equals
// name ignoring case when there is no exact match (HTTP canonicalises).
func header(headers map[string]string, name string) string {
	if v, ok := headers[name]; ok {
		return v
	}
	for k, v := range headers {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return ""
}

// parsed is a validated message.
type parsed struct {
	eventID string // canonical lower-case UUID
	guarded bool
	version int64
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("inbox: %w: %s", ErrInvalidMessage, fmt.Sprintf(format, args...))
}

// parse validates msg and reads its version.
func (ib *Inbox[TTx]) parse(msg *Message) (parsed, error) {
	var p parsed
	if strings.TrimSpace(msg.EventID) == "" {
		return p, invalid("no event id (the outbox sends it in the header %q)", HeaderID)
	}
	u, err := uuid.Parse(strings.TrimSpace(msg.EventID))
	if err != nil {
		return p, invalid("event id %q is not a UUID", msg.EventID)
	}
	p.eventID = u.String()
	switch {
	case msg.HasVersion:
		p.guarded, p.version = true, msg.Version
	case ib.cfg.VersionHeader != "":
		v, ok := msg.Headers[ib.cfg.VersionHeader]
		if !ok {
			v = header(msg.Headers, ib.cfg.VersionHeader)
		}
		if strings.TrimSpace(v) == "" {
			return p, invalid("event %s has no version header %q", p.eventID, ib.cfg.VersionHeader)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return p, invalid("event %s: version header %q = %q is not an integer", p.eventID, ib.cfg.VersionHeader, v)
		}
		p.guarded, p.version = true, n
	case ib.cfg.VersionField != "":
		n, err := versionField(msg.Payload, ib.cfg.VersionField)
		if err != nil {
			return p, invalid("event %s: %v", p.eventID, err)
		}
		p.guarded, p.version = true, n
	}
	if p.guarded && msg.AggregateID == "" {
		return p, invalid("event %s has a version but no aggregate id to guard it by", p.eventID)
	}
	for _, s := range []string{msg.AggregateType, msg.AggregateID} {
		if strings.IndexByte(s, 0) >= 0 {
			return p, invalid("event %s: a NUL byte in %q", p.eventID, s)
		}
	}
	return p, nil
}

// versionField reads the integer at the dotted path in a JSON payload.
func versionField(payload []byte, path string) (int64, error) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return 0, fmt.Errorf("payload is not JSON, so it has no version field %q", path)
	}
	cur := doc
	for _, part := range strings.Split(path, ".") {
		obj, ok := cur.(map[string]any)
		if !ok {
			return 0, fmt.Errorf("payload has no version field %q", path)
		}
		if cur, ok = obj[part]; !ok {
			return 0, fmt.Errorf("payload has no version field %q", path)
		}
	}
	var s string
	switch v := cur.(type) {
	case json.Number:
		s = v.String()
	case string:
		s = strings.TrimSpace(v)
	case nil:
		return 0, fmt.Errorf("version field %q is null, not an integer", path)
	case bool:
		return 0, fmt.Errorf("version field %q is a boolean, not an integer", path)
	case []any:
		return 0, fmt.Errorf("version field %q is an array, not an integer", path)
	default:
		return 0, fmt.Errorf("version field %q is an object, not an integer", path)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("version field %q = %s is not an integer", path, s)
	}
	return n, nil
}
