package natssink

import (
	"testing"

	"github.com/outboxkit/outbox/sink"
)

// BenchmarkToNATS measures the building of a NATS message from a routed
// message (subject, data, the "id" and "key" headers, the event's own
// headers and a trace parent), which the sink does for every event. No
// server is involved.
func BenchmarkToNATS(b *testing.B) {
	m := &sink.Message{
		ID:          "0190a5a4-0000-7000-8000-000000000001",
		Destination: "outbox.event.order",
		Key:         []byte("4611686018427387904"),
		Type:        "OrderPlaced",
		Value:       []byte(`{"order_id":4611686018427387904,"customer":"customer-1","total":42.5}`),
		Headers: []sink.Header{
			{Key: "id", Value: "0190a5a4-0000-7000-8000-000000000001"},
			{Key: "tenant", Value: "t1"},
			{Key: "traceparent", Value: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		},
	}
	nm := toNATS(m)
	if nm.Subject != m.Destination || nm.Header.Get("id") != m.ID || nm.Header.Get(KeyHeader) != string(m.Key) {
		b.Fatalf("toNATS: subject %q, headers %v", nm.Subject, nm.Header)
	}
	b.ReportAllocs()
	for b.Loop() {
		toNATS(m)
	}
}
