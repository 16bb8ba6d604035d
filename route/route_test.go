package route

import (
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/sink"
)

func rec() *outboxdriver.Record {
	return &outboxdriver.Record{
		ID: "0190a5a4-0000-7000-8000-000000000001", AggregateType: "order", AggregateID: "42",
		Type: "OrderPlaced", Payload: []byte(`{"id":42}`),
		Headers:      map[string]string{"tenant": "t1", "id": "spoofed", "a": "1"},
		TraceContext: "traceparent=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\ntracestate=k=v",
		CreatedAt:    time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	}
}

func TestDebeziumDefaults(t *testing.T) {
	r, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := r.Message(rec())
	if err != nil {
		t.Fatal(err)
	}
	if m.Destination != "outbox.event.order" || string(m.Key) != "42" || m.Type != "OrderPlaced" || string(m.Value) != `{"id":42}` || m.ID != rec().ID {
		t.Fatalf("got %+v", m)
	}
	want := []sink.Header{
		{Key: "id", Value: rec().ID}, {Key: "a", Value: "1"}, {Key: "tenant", Value: "t1"},
		{Key: "traceparent", Value: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, {Key: "tracestate", Value: "k=v"},
	}
	if !reflect.DeepEqual(m.Headers, want) {
		t.Fatalf("headers = %v, want %v", m.Headers, want)
	}
}

func TestCustomRouting(t *testing.T) {
	r, err := New(&Config{RouteBy: "type", Regex: `(?P<entity>[A-Z][a-z]+)(?P<verb>[A-Z][a-z]+)`, Replacement: "events.${entity}.${verb}",
		HeaderColumns: []string{"type:eventType", "aggregatetype", "created_at"}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := r.Message(rec())
	if err != nil {
		t.Fatal(err)
	}
	if m.Destination != "events.Order.Placed" {
		t.Fatalf("destination = %q", m.Destination)
	}
	for k, v := range map[string]string{"eventType": "OrderPlaced", "aggregatetype": "order", "created_at": "2026-01-02T03:04:05.000000Z"} {
		if got, _ := m.Header(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	bad := rec()
	bad.Type = "lowercase"
	if _, err := r.Message(bad); err == nil {
		t.Fatal("a value the regex does not match must fail")
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []Config{
		{RouteBy: "payload"},
		{Regex: "("},
		{HeaderColumns: []string{"nope"}},
		{HeaderColumns: []string{"type:id"}},
	} {
		if _, err := New(&c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// TestDestinationIsTheSameFromTheCache routes more distinct values than
// the router remembers, twice, with a regex that refuses some: every
// destination must be what the regex makes of its value, the first time
// and from memory alike.
func TestDestinationIsTheSameFromTheCache(t *testing.T) {
	r, err := New(&Config{RouteBy: "aggregateid", Regex: `(?P<n>[0-9]+)`, Replacement: "agg.${n}"})
	if err != nil {
		t.Fatal(err)
	}
	for pass := range 2 {
		for i := range maxCached + 100 {
			rec := outboxdriver.Record{AggregateID: strconv.Itoa(i)}
			d, err := r.Destination(&rec)
			if err != nil || d != "agg."+strconv.Itoa(i) {
				t.Fatalf("pass %d: %d -> %q, %v", pass, i, d, err)
			}
			bad := outboxdriver.Record{AggregateID: "x" + strconv.Itoa(i)}
			if _, err := r.Destination(&bad); err == nil {
				t.Fatalf("pass %d: %q routed", pass, bad.AggregateID)
			}
		}
	}
	if n := r.cached.Load(); n != maxCached {
		t.Fatalf("%d destinations remembered, want the bound %d", n, maxCached)
	}
}

func TestFixedDestination(t *testing.T) {
	r, err := New(&Config{Destination: "orders.$all"})
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range []outboxdriver.Record{
		{ID: "1", AggregateType: "order", AggregateID: "1"},
		{ID: "2", AggregateType: "customer", AggregateID: "2"},
		{ID: "3", AggregateType: "", AggregateID: "3"},
	} {
		d, err := r.Destination(&rec)
		if err != nil || d != "orders.$all" {
			t.Fatalf("destination of %s = %q, %v; want orders.$all for every event", rec.AggregateType, d, err)
		}
	}
	if _, err := New(&Config{Destination: "x", RouteBy: "type"}); err == nil {
		t.Fatal("a fixed destination with a route-by column was accepted")
	}
}

// The key must equal the aggregate id: a record whose aggregate id cannot
// be carried unchanged, or whose headers column could not be read, is an
// error (the relay dead-letters it) rather than a message that differs
// from what was written.
func TestRecordThatCannotBeCarriedUnchangedIsAnError(t *testing.T) {
	r, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		edit func(*outboxdriver.Record)
		want string
	}{
		"empty aggregate id": {func(rec *outboxdriver.Record) { rec.AggregateID = "" }, "empty"},
		"CR LF":              {func(rec *outboxdriver.Record) { rec.AggregateID = "4\r\n2" }, "line break"},
		"LF":                 {func(rec *outboxdriver.Record) { rec.AggregateID = "4\n2" }, "line break"},
		"unreadable headers": {func(rec *outboxdriver.Record) {
			rec.Headers, rec.HeadersErr = driverkit.DecodeHeaders(`[1]`)
		}, "JSON array"},
	} {
		rc := rec()
		c.edit(rc)
		m, err := r.Message(rc)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), rc.ID) {
			t.Errorf("%s: Message = key %q, %v; want an error naming the event and saying %q", name, m.Key, err, c.want)
		}
	}
}
