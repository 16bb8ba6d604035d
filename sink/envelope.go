package sink

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"unicode/utf8"
)

// Envelope returns m as one JSON object, for brokers without headers or
// keys (MQTT 3.1.1, Kinesis): {"id", "destination", "key" (or
// "key_base64" when not UTF-8), "headers": [{"key", "value"}...] with the
// id header first unless m has one, "payload" (the JSON value; null when
// empty) or "payload_base64" when the value is not JSON}.
func Envelope(m *Message) ([]byte, error) {
	var b bytes.Buffer
	b.Grow(len(m.Value)*4/3 + 128)
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	str := func(s string) {
		_ = enc.Encode(s)       // a string always encodes
		b.Truncate(b.Len() - 1) // Encode's newline
	}
	b.WriteString(`{"id":`)
	str(m.ID)
	b.WriteString(`,"destination":`)
	str(m.Destination)
	if utf8.Valid(m.Key) {
		b.WriteString(`,"key":`)
		str(string(m.Key))
	} else {
		b.WriteString(`,"key_base64":"`)
		b.WriteString(base64.StdEncoding.EncodeToString(m.Key))
		b.WriteByte('"')
	}
	b.WriteString(`,"headers":[`)
	header := func(k, v string) {
		if b.Bytes()[b.Len()-1] != '[' {
			b.WriteByte(',')
		}
		b.WriteString(`{"key":`)
		str(k)
		b.WriteString(`,"value":`)
		str(v)
		b.WriteByte('}')
	}
	if _, ok := m.Header("id"); !ok {
		header("id", m.ID)
	}
	for _, h := range m.Headers {
		header(h.Key, h.Value)
	}
	b.WriteByte(']')
	switch {
	case len(m.Value) == 0:
		b.WriteString(`,"payload":null`)
	case utf8.Valid(m.Value) && json.Valid(m.Value):
		b.WriteString(`,"payload":`)
		b.Write(m.Value)
	default:
		b.WriteString(`,"payload_base64":"`)
		b.WriteString(base64.StdEncoding.EncodeToString(m.Value))
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}
