package inbox

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// nopDriver refuses every call: these tests cover what the Inbox decides
// before any SQL runs (the SQL itself is tested on real databases in
// inboxpgx and inboxsql).
type nopDriver struct{}

var errNoSQL = errors.New("no SQL expected")

func (nopDriver) DefaultSchema() string { return "public" }
func (nopDriver) ClaimTx(context.Context, int, outboxdriver.Table, string, string) (bool, error) {
	return false, errNoSQL
}
func (nopDriver) AdvanceTx(context.Context, int, outboxdriver.Table, VersionKey, int64) (bool, error) {
	return false, errNoSQL
}
func (nopDriver) InTx(ctx context.Context, fn func(int) error) error { return fn(0) }
func (nopDriver) RecordDeadLetter(context.Context, outboxdriver.Table, DeadLetter) error {
	return errNoSQL
}
func (nopDriver) DeadLetters(context.Context, outboxdriver.Table, string, int) ([]DeadLetter, error) {
	return nil, errNoSQL
}
func (nopDriver) Cleanup(context.Context, outboxdriver.Table, string, time.Duration, int) (int, error) {
	return 0, errNoSQL
}
func (nopDriver) DeadLetter(context.Context, outboxdriver.Table, string, int64) (DeadLetter, error) {
	return DeadLetter{}, errNoSQL
}
func (nopDriver) DeadLetterIDs(context.Context, outboxdriver.Table, string) ([]int64, error) {
	return nil, errNoSQL
}
func (nopDriver) RequestRetry(context.Context, outboxdriver.Table, string, []int64) ([]int64, error) {
	return nil, errNoSQL
}
func (nopDriver) ClaimRetries(context.Context, outboxdriver.Table, string, int) ([]DeadLetter, error) {
	return nil, errNoSQL
}
func (nopDriver) DeleteDeadLetters(context.Context, outboxdriver.Table, string, []int64) ([]int64, error) {
	return nil, errNoSQL
}
func (nopDriver) Stats(context.Context, outboxdriver.Table, string) (Stats, error) {
	return Stats{}, errNoSQL
}

func TestNewValidates(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  *Config
		want string
	}{
		{"nil config", nil, "Consumer is required"},
		{"no consumer", &Config{}, "Consumer is empty"},
		{"NUL in consumer", &Config{Consumer: "a\x00"}, "without NUL"},
		{"both version sources", &Config{Consumer: "c", VersionHeader: "v", VersionField: "v"}, "at most one"},
		{"empty path element", &Config{Consumer: "c", VersionField: "meta..v"}, "empty path element"},
		{"negative retention", &Config{Consumer: "c", Retention: -time.Second}, "negative"},
		{"hostile table", &Config{Consumer: "c", Table: `inbox"; DROP TABLE x`}, "not a valid identifier"},
		{"hostile schema", &Config{Consumer: "c", Schema: "a-b"}, "not a valid identifier"},
		{"long table", &Config{Consumer: "c", Table: strings.Repeat("t", 60)}, "too long"},
	} {
		_, err := New[int](nopDriver{}, c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: New = %v, want an error mentioning %q", c.name, err, c.want)
		}
	}
	if _, err := New[int](nil, &Config{Consumer: "c"}); err == nil {
		t.Error("New(nil driver) succeeded")
	}
	ib, err := New[int](nopDriver{}, &Config{Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	if ib.Table() != (outboxdriver.Table{Schema: "public", Name: "inbox"}) || ib.Retention() != DefaultRetention || ib.Consumer() != "c" {
		t.Fatalf("defaults: table %v, retention %v, consumer %q", ib.Table(), ib.Retention(), ib.Consumer())
	}
}

func TestNewMessage(t *testing.T) {
	// NATS JetStream as natssink sends it: headers id, key, Nats-Msg-Id.
	m := NewMessage("outbox.event.order", nil, map[string]string{"id": "A", "key": "42", "Nats-Msg-Id": "A"}, []byte(`{}`))
	if m.EventID != "A" || m.AggregateID != "42" || m.AggregateType != "order" || m.Destination != "outbox.event.order" || string(m.Payload) != "{}" {
		t.Fatalf("NATS message: %+v", m)
	}
	// Kafka as kafkasink sends it: the key is the record key.
	m = NewMessage("outbox.event.customer", []byte("7"), map[string]string{"id": "B", "key": "ignored"}, nil)
	if m.EventID != "B" || m.AggregateID != "7" || m.AggregateType != "customer" {
		t.Fatalf("Kafka message: %+v", m)
	}
	// Only the JetStream de-duplication header; a custom route.
	m = NewMessage("billing.orders", nil, map[string]string{"Nats-Msg-Id": "C"}, nil)
	if m.EventID != "C" || m.AggregateType != "" {
		t.Fatalf("custom route: %+v", m)
	}
	// HTTP canonicalises header names.
	m = NewMessage("", nil, map[string]string{"Id": "D"}, nil)
	if m.EventID != "D" {
		t.Fatalf("canonical header: %+v", m)
	}
}

func TestVersionField(t *testing.T) {
	for payload, want := range map[string]int64{
		`{"v": 3}`:                3,
		`{"v": "12"}`:             12,
		`{"v": -1}`:               -1,
		`{"v": 9007199254740993}`: 9007199254740993, // beyond float64's integers
	} {
		got, err := versionField([]byte(payload), "v")
		if err != nil || got != want {
			t.Errorf("versionField(%s) = %d, %v; want %d", payload, got, err, want)
		}
	}
	if got, err := versionField([]byte(`{"a": {"b": {"v": 5}}}`), "a.b.v"); err != nil || got != 5 {
		t.Errorf("nested: %d, %v", got, err)
	}
	for _, payload := range []string{``, `[]`, `{"a": 1}`, `{"v": 1e3}`, `{"v": null}`, `{"v": true}`, `{"a": []}`} {
		if _, err := versionField([]byte(payload), "v"); err == nil {
			t.Errorf("versionField(%s) succeeded", payload)
		}
	}
}

func TestOutcomeString(t *testing.T) {
	var names []string
	for _, o := range Outcomes() {
		names = append(names, o.String())
	}
	if got := strings.Join(names, ","); got != "processed,duplicate,stale,failed,invalid" {
		t.Fatalf("outcomes %s", got)
	}
}

func TestStorable(t *testing.T) {
	if got := storable("a\x00b\xffc"); got != "a\uFFFDb\uFFFDc" {
		t.Fatalf("storable = %q", got)
	}
}

func TestHandleRefusesNilHandler(t *testing.T) {
	ib, err := New[int](nopDriver{}, &Config{Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ib.HandleTx(context.Background(), 0, Message{EventID: "0190a5c8-3a1e-7c3e-9a2b-8f2d4c6e0a42"}, nil); err == nil {
		t.Fatal("HandleTx with a nil handler succeeded")
	}
}

func FuzzParse(f *testing.F) {
	ib, err := New[int](nopDriver{}, &Config{Consumer: "c", VersionField: "meta.version"})
	if err != nil {
		f.Fatal(err)
	}
	f.Add("0190a5c8-3a1e-7c3e-9a2b-8f2d4c6e0a42", "42", []byte(`{"meta": {"version": 3}}`))
	f.Add("urn:uuid:0190a5c8-3a1e-7c3e-9a2b-8f2d4c6e0a42", "", []byte(`{"meta": {"version": "x"}}`))
	f.Fuzz(func(t *testing.T, id, agg string, payload []byte) {
		m := Message{EventID: id, AggregateID: agg, Payload: payload}
		p, err := ib.parse(&m)
		if err != nil {
			if !errors.Is(err, ErrInvalidMessage) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("parse error %q is not a one-line ErrInvalidMessage", err)
			}
			return
		}
		if len(p.eventID) != 36 || !p.guarded || agg == "" {
			t.Fatalf("accepted %+v as %+v", m, p)
		}
	})
}
