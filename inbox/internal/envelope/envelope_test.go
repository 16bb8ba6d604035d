package envelope_test

import (
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
