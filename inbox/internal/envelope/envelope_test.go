package envelope_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/outboxkit/outbox/inbox/internal/envelope"
	"github.com/outboxkit/outbox/sink"
)

// TestRoundTrip encodes messages with sink.Envelope and reads them back.
func TestRoundTrip(t *testing.T) {
	for _, m := range []sink.Message{
		{ID: "e1", Destination: "outbox.event.order", Key: []byte("42"), Value: []byte(`{"a":1}`), Headers: []sink.Header{{Key: "t", Value: "x"}, {Key: "t", Value: "y"}}},
		{ID: "e2", Destination: "d", Key: []byte{0xff, 0}, Value: []byte{0, 1, 2}},
		{ID: "e3", Destination: "d", Key: []byte("k")},
	} {
		b, err := sink.Envelope(&m)
		if err != nil {
			t.Fatal(err)
		}
		got := envelope.Message("fallback", b)
		if got.EventID != m.ID || got.AggregateID != string(m.Key) || got.Destination != m.Destination || string(got.Payload) != string(m.Value) {
			t.Errorf("%s: got %+v", m.ID, got)
		}
		for _, h := range m.Headers {
			if got.Headers[h.Key] != "x" {
				t.Errorf("%s: header %s = %q, want the first value", m.ID, h.Key, got.Headers[h.Key])
			}
		}
	}
	for _, raw := range []string{"not json", `{"destination":"d"}`, `{"id":"e","payload_base64":"%%"}`} {
		got := envelope.Message("topic", []byte(raw))
		if got.EventID != "" || string(got.Payload) != raw || got.Destination != "topic" {
			t.Errorf("%q: got %+v, want no event id and the data as received", raw, got)
		}
	}
}

// FuzzMessage reads arbitrary bytes: it never panics, a message without an
// event id keeps the data as its payload, and an envelope sink.Envelope
// made from the bytes reads back to them.
func FuzzMessage(f *testing.F) {
	f.Add([]byte(`{"id":"e","destination":"d","key":"k","headers":[{"key":"a","value":"b"}],"payload":{"x":1}}`))
	f.Add([]byte(`{"id":"e","key_base64":"/w==","payload_base64":"AAE="}`))
	f.Add([]byte("not json"))
	f.Fuzz(func(t *testing.T, data []byte) {
		got := envelope.Message("fallback", data)
		if got.EventID == "" && string(got.Payload) != string(data) {
			t.Fatalf("no event id, payload %q, want the data %q", got.Payload, data)
		}
		m := sink.Message{ID: "id", Destination: "d", Key: data, Value: data}
		b, err := sink.Envelope(&m)
		if err != nil {
			t.Fatal(err)
		}
		back := envelope.Message("fallback", b)
		if back.EventID != "id" || back.AggregateID != string(data) || string(back.Payload) != string(data) && !jsonSpace(data) {
			t.Fatalf("round trip of %q: %+v", data, back)
		}
	})
}

// jsonSpace reports whether data is JSON with white space around it, which
// the envelope does not keep.
func jsonSpace(data []byte) bool {
	return json.Valid(data) && len(bytes.TrimSpace(data)) != len(data)
}
