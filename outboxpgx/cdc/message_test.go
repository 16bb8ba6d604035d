package cdc

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// What a writer emits, the relay reads back field for field, the payload
// byte for byte.
func TestMessageRoundTrip(t *testing.T) {
	rows := []outboxdriver.Row{
		{ID: "0190a5a4-1111-7000-8000-000000000001", AggregateType: "order", AggregateID: "4\"2", Type: "Placed",
			Payload: []byte("{\"b\": 1,  \"a\": [1.50]}"), Headers: []byte(`{"tenant":"acme"}`), TraceContext: "traceparent=00-01-02-01\ntracestate=x=y"},
		{ID: "0190a5a4-1111-7000-8000-000000000002", AggregateType: "blob", AggregateID: "7", Type: "Raw", RawPayload: []byte{0, 1, 0xff}},
		{ID: "0190a5a4-1111-7000-8000-000000000003", AggregateType: "x", AggregateID: "y", Type: "Empty"},
	}
	for _, r := range rows {
		ev, err := decodeMessage(pgschema.AppendMessage(nil, &r))
		if err != nil {
			t.Fatalf("decode %s: %v", r.ID, err)
		}
		if ev.ID != r.ID || ev.AggregateType != r.AggregateType || ev.AggregateID != r.AggregateID || ev.Type != r.Type ||
			string(ev.Payload) != string(r.Payload) || string(ev.RawPayload) != string(r.RawPayload) ||
			string(ev.HeadersJSON) != string(r.Headers) || ev.TraceContext != r.TraceContext {
			t.Fatalf("decoded %+v from %+v", ev, r)
		}
	}
}

// Content that is not a version-1 outbox event is refused with a reason
// that names the problem.
func TestMessageRefusals(t *testing.T) {
	for content, want := range map[string]string{
		`not json`: "not a JSON object",
		`[1]`:      "not a JSON object",
		`{"id":"0190a5a4-1111-7000-8000-000000000001","aggregatetype":"a","aggregateid":"b","type":"c"}`:                            `"v" is missing`,
		`{"v":2,"id":"0190a5a4-1111-7000-8000-000000000001","aggregatetype":"a","aggregateid":"b","type":"c"}`:                      "version 2",
		`{"v":1,"id":"nope","aggregatetype":"a","aggregateid":"b","type":"c"}`:                                                      "UUID",
		`{"v":1,"id":"0190a5a4-1111-7000-8000-000000000001","aggregateid":"b","type":"c"}`:                                          "aggregatetype",
		`{"v":1,"id":"0190a5a4-1111-7000-8000-000000000001","aggregatetype":"a","aggregateid":" ","type":"c"}`:                      "aggregateid",
		`{"v":1,"id":"0190a5a4-1111-7000-8000-000000000001","aggregatetype":"a","aggregateid":"b"}`:                                 `"type"`,
		`{"v":1,"id":"0190a5a4-1111-7000-8000-000000000001","aggregatetype":"a","aggregateid":"b\u0000","type":"c"}`:                "NUL",
		`{"v":1,"id":"0190a5a4-1111-7000-8000-000000000001","aggregatetype":"a","aggregateid":"b","type":"c","payload_base64":"!"}`: "base64",
		`{"v":1,"id":"0190a5a4-1111-7000-8000-000000000001","aggregatetype":"a","aggregateid":"b","type":"c"} {}`:                   "more than one",
	} {
		_, err := decodeMessage([]byte(content))
		if !errors.Is(err, errMessage) || !strings.Contains(err.Error(), want) {
			t.Errorf("decodeMessage(%s) = %v, want an error about %q", content, err, want)
		}
	}
}

// FuzzDecodeMessage: any content decodes to an event or a refusal, never
// a panic; an accepted event has what routing needs. What the fast
// decoder accepts, encoding/json accepts too, with every field the same.
func FuzzDecodeMessage(f *testing.F) {
	f.Add([]byte(`{"v":1,"id":"0190a5a4-1111-7000-8000-000000000001","aggregatetype":"a","aggregateid":"b","type":"c","payload":{"x":1},"headers":{"h":"v"}}`))
	f.Add([]byte(`{"v":1,"payload_base64":"AAE="}`))
	f.Add([]byte(`{`))
	f.Add([]byte(`{"v":1,"V":2,"ID":"0190a5a4-1111-7000-8000-000000000001","aggregatetype":"a\ud800","aggregateid":"b\u00e9","type":"c\t","payload": [1, 2.50e3, "x"] , "headers":null}`))
	f.Add([]byte("{\"v\":1,\"type\":\"\xff\",\"payload\":\"\x01\"}"))
	f.Add([]byte(`{"v":1.0,"payload":{"a":{"b":[[[]]]}}} `))
	f.Add([]byte(`{"v":1} {"v":2}`))
	f.Add([]byte(`{"\u0076":99999999999999999999,"v":null,"id":"x","id":"0190a5a4-1111-7000-8000-000000000001","payload":1e400,"headers":-0}`))
	f.Add([]byte(`{"v":1,"payload":"\u0000\ud83d\ude00\\","tracingspancontext":"a\nb","payload_base64":null}`))
	f.Fuzz(func(t *testing.T, content []byte) {
		var fast pgschema.Message
		if utf8.Valid(content) && wireDecoder.Unmarshal(content, &fast) == nil {
			std, err := decodeWire(content)
			if err != nil {
				t.Fatalf("the fast decoder accepted what encoding/json refuses (%v): %q", err, content)
			}
			if fast.V == nil != (std.V == nil) || fast.V != nil && *fast.V != *std.V ||
				fast.PayloadBase64 == nil != (std.PayloadBase64 == nil) || fast.PayloadBase64 != nil && *fast.PayloadBase64 != *std.PayloadBase64 ||
				fast.ID != std.ID || fast.AggregateType != std.AggregateType || fast.AggregateID != std.AggregateID || fast.Type != std.Type ||
				string(fast.Payload) != string(std.Payload) || string(fast.Headers) != string(std.Headers) || fast.TracingSpanContext != std.TracingSpanContext {
				t.Fatalf("the decoders differ on %q:\nfast %+v\nstd  %+v", content, fast, std)
			}
		}
		ev, err := decodeMessage(content)
		if err != nil {
			return
		}
		if ev.ID == "" || strings.TrimSpace(ev.AggregateID) == "" || strings.TrimSpace(ev.AggregateType) == "" || strings.TrimSpace(ev.Type) == "" {
			t.Fatalf("accepted an event without what routing needs: %+v", ev)
		}
	})
}

// Default slot names are valid, distinct for distinct tables, and short
// enough.
func TestDefaultSlot(t *testing.T) {
	seen := map[string]outboxdriver.Table{}
	for _, tb := range []outboxdriver.Table{
		{}, {Schema: "app", Name: "outbox"}, {Schema: "App", Name: "outbox"}, {Schema: "app", Name: "Outbox"},
		{Schema: strings.Repeat("s", 63), Name: strings.Repeat("t", 51)}, {Schema: strings.Repeat("s", 63), Name: strings.Repeat("t", 50)},
	} {
		s := DefaultSlot(tb)
		if _, _, err := pgschema.SlotNames(tb, s, ""); err != nil {
			t.Errorf("DefaultSlot(%v) = %q: not a valid slot name", tb, s)
		}
		if other, ok := seen[s]; ok {
			t.Errorf("DefaultSlot(%v) = DefaultSlot(%v) = %q", tb, other, s)
		}
		seen[s] = tb
	}
	if s := DefaultSlot(outboxdriver.Table{}); s != "outbox_public_outbox" {
		t.Errorf("DefaultSlot(public.outbox) = %q", s)
	}
}

// The failures of slot commands an operator must act on say what to do,
// on one line.
func TestSlotErrorsSayWhatToDo(t *testing.T) {
	for code, want := range map[string]string{
		"55000": "wal_level = logical",
		"42501": "ALTER ROLE",
		"53400": "max_replication_slots",
		"55006": "is busy",
	} {
		msg := "logical decoding requires wal_level >= logical"
		err := slotError(&pgconn.PgError{Code: code, Message: msg}, "s")
		if !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("slotError(%s) = %q, want one line about %q", code, err, want)
		}
	}
}

// BenchmarkDecodeMessage: what the relay spends on a message's content,
// with the fast decoder and with encoding/json alone.
func BenchmarkDecodeMessage(b *testing.B) {
	r := outboxdriver.Row{ID: "0190f5a2-7c4e-7b3a-9d2e-5f6a7b8c9d0e", AggregateType: "order", AggregateID: "order-17", Type: "OrderPlaced",
		Payload: []byte(`{"sku": "sku-1234", "total": 42.5, "customer": "customer-17", "order_id": 198001, "quantity": 1}`)}
	content := pgschema.AppendMessage(nil, &r)
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeMessage(content); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeWire(content); err != nil {
				b.Fatal(err)
			}
		}
	})
}
