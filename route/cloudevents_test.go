package route_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/route"
)

func TestCloudEventsConfigIsChecked(t *testing.T) {
	for _, c := range []struct {
		ce   route.CloudEvents
		want string
	}{
		{route.CloudEvents{Mode: "envelope", Source: "/a"}, `mode "envelope": use binary or structured`},
		{route.CloudEvents{Mode: route.Binary}, "needs a source"},
	} {
		if _, err := route.New(&route.Config{CloudEvents: &c.ce}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.ce, err, c.want)
		}
	}
}

// A payload that is not JSON travels as data_base64 in structured mode,
// and as the value with content-type application/octet-stream in binary
// mode.
func TestCloudEventsCarryNonJSONPayloads(t *testing.T) {
	rec := outboxdriver.Record{ID: "00000000-0000-7000-8000-000000000001", AggregateType: "order", AggregateID: "1", Type: "T",
		Payload: []byte{0xff, 0x00, 0x01}, CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)}
	r, err := route.New(&route.Config{CloudEvents: &route.CloudEvents{Mode: route.Structured, Source: "/s"}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := r.Message(&rec)
	if err != nil {
		t.Fatal(err)
	}
	var e event.Event
	if err := json.Unmarshal(m.Value, &e); err != nil {
		t.Fatalf("%s: %v", m.Value, err)
	}
	if err := e.Validate(); err != nil || string(e.Data()) != string(rec.Payload) || e.DataContentType() != "application/octet-stream" || !e.Time().Equal(rec.CreatedAt) {
		t.Fatalf("structured: %v, data %q, content type %q, time %s", err, e.Data(), e.DataContentType(), e.Time())
	}
	r, err = route.New(&route.Config{CloudEvents: &route.CloudEvents{Mode: route.Binary, Source: "/s", Prefix: route.PrefixKafka}})
	if err != nil {
		t.Fatal(err)
	}
	if m, err = r.Message(&rec); err != nil {
		t.Fatal(err)
	}
	if ct, _ := m.Header("content-type"); ct != "application/octet-stream" || string(m.Value) != string(rec.Payload) {
		t.Fatalf("binary: content-type %q, value %q", ct, m.Value)
	}
	if id, _ := m.Header("ce_id"); id != rec.ID {
		t.Fatalf("binary: ce_id %q", id)
	}
}
