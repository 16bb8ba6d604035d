// Package outbox writes events into a transactional outbox table in the same
// database transaction as the business change that caused them.
//
// A relay (package relay, or the outbox relay command) later publishes every
// committed event to a broker, at least once, and in commit order per
// aggregate. An event from a transaction that rolled back is never seen.
//
//	ob, err := outbox.New(outboxpgx.New(), &outbox.Config{})
//	...
//	tx, _ := pool.Begin(ctx)
//	tx.Exec(ctx, `INSERT INTO orders ...`)
//	ob.WriteTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "42",
//		Type: "OrderPlaced", Payload: []byte(`{"id":42}`)})
//	tx.Commit(ctx)
package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/propagation"

	"github.com/outboxkit/outbox/outboxdriver"
)

// Event is one fact to publish.
type Event struct {
	// ID identifies the event everywhere (broker de-duplication key, header
	// "id", the consumer's inbox). Leave it empty to get a new UUIDv7.
	ID string
	// AggregateType names the kind of entity ("order"); by default it picks
	// the destination: outbox.event.<aggregatetype>. Required.
	AggregateType string
	// AggregateID identifies the entity; it is the message key and the unit
	// of ordering. Required.
	AggregateID string
	// Type names what happened ("OrderPlaced"). Required.
	Type string
	// Payload is a JSON document. It must be valid JSON; use RawPayload for
	// anything else. Nil with a nil RawPayload stores SQL NULL.
	Payload []byte
	// RawPayload is a payload that is not JSON (protobuf, Avro, text). It is
	// published byte for byte. Set at most one of Payload and RawPayload.
	RawPayload []byte
	// Headers are published as message headers.
	Headers map[string]string
}

// ErrInvalidEvent is wrapped by every error about an event that WriteTx
// refuses before any SQL runs.
var ErrInvalidEvent = errors.New("invalid event")

// MaxHeaderLen bounds a header name; values are bounded only by the broker.
const MaxHeaderLen = 255

// Config configures an Outbox.
type Config struct {
	// Schema holds the outbox table. Defaults to the driver's default:
	// "public" on PostgreSQL, the connection's database on MySQL/MariaDB,
	// "main" on SQLite.
	Schema string
	// Table is the outbox table's name. Defaults to "outbox".
	Table string
}

// Outbox writes events for one outbox table through a driver.
type Outbox[TTx any] struct {
	drv   outboxdriver.Writer[TTx]
	table outboxdriver.Table
	prop  propagation.TraceContext
}

// New returns an Outbox writing through drv. It does no I/O; run Migrate (or
// `outbox migrate`) once to create the table.
func New[TTx any](drv outboxdriver.Writer[TTx], cfg *Config) (*Outbox[TTx], error) {
	if drv == nil {
		return nil, errors.New("outbox: driver is nil")
	}
	if cfg == nil {
		cfg = &Config{}
	}
	t := outboxdriver.Table{Schema: cfg.Schema, Name: cfg.Table}
	if d, ok := drv.(outboxdriver.SchemaDefaulter); ok && t.Schema == "" {
		t.Schema = d.DefaultSchema()
		if t.Schema == "" {
			// The connection's own schema (MySQL's current database): check
			// the table name alone.
			t.Name = cmp.Or(t.Name, outboxdriver.DefaultTable.Name)
			check := outboxdriver.Table{Schema: "current", Name: t.Name}
			if err := check.Validate(); err != nil {
				return nil, fmt.Errorf("outbox: %w", err)
			}
			return &Outbox[TTx]{drv: drv, table: t}, nil
		}
	}
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return &Outbox[TTx]{drv: drv, table: t}, nil
}

// Table returns the outbox table this Outbox writes.
func (o *Outbox[TTx]) Table() outboxdriver.Table { return o.table }

// WriteTx adds events to the caller's transaction tx in one round trip. They
// become visible to the relay when tx commits, and never if it rolls back.
// Every event is validated first: on an invalid one nothing is written and
// the error wraps ErrInvalidEvent. An event without an ID gets a new UUIDv7;
// the W3C trace context of ctx, if any, is stored with each event.
func (o *Outbox[TTx]) WriteTx(ctx context.Context, tx TTx, events ...Event) error {
	if len(events) == 0 {
		return nil
	}
	rows, err := o.rows(ctx, events)
	if err != nil {
		return err
	}
	if err := o.drv.InsertTx(ctx, tx, o.table, rows); err != nil {
		return fmt.Errorf("outbox: insert %d event(s) into %s: %w", len(rows), o.table, err)
	}
	return nil
}

// Rows validates events and turns them into the rows WriteTx would insert
// (ids generated, trace context of ctx attached). Drivers use it to offer
// other ways of sending them, such as queueing the INSERT in a batch.
func (o *Outbox[TTx]) Rows(ctx context.Context, events ...Event) ([]outboxdriver.Row, error) {
	return o.rows(ctx, events)
}

// rows validates events and turns them into driver rows.
func (o *Outbox[TTx]) rows(ctx context.Context, events []Event) ([]outboxdriver.Row, error) {
	trace := o.traceContext(ctx)
	rows := make([]outboxdriver.Row, len(events))
	for i := range events {
		r, err := toRow(&events[i])
		if err != nil {
			return nil, fmt.Errorf("outbox: event %d: %w", i, err)
		}
		r.TraceContext = trace
		rows[i] = r
	}
	return rows, nil
}

func toRow(e *Event) (outboxdriver.Row, error) {
	invalid := func(format string, args ...any) (outboxdriver.Row, error) {
		return outboxdriver.Row{}, fmt.Errorf("%w: %s", ErrInvalidEvent, fmt.Sprintf(format, args...))
	}
	switch {
	case strings.TrimSpace(e.AggregateType) == "":
		return invalid("AggregateType is empty")
	case strings.TrimSpace(e.AggregateID) == "":
		return invalid("AggregateID is empty")
	case strings.TrimSpace(e.Type) == "":
		return invalid("Type is empty")
	case e.Payload != nil && e.RawPayload != nil:
		return invalid("both Payload and RawPayload are set")
	case e.Payload != nil && !json.Valid(e.Payload):
		return invalid("Payload is not valid JSON (use RawPayload for other formats)")
	}
	for _, s := range []string{e.AggregateType, e.AggregateID, e.Type} {
		if strings.IndexByte(s, 0) >= 0 {
			return invalid("a NUL byte in %q", s)
		}
	}
	id := e.ID
	if id == "" {
		u, err := uuid.NewV7()
		if err != nil {
			return outboxdriver.Row{}, fmt.Errorf("generate event id: %w", err)
		}
		id = u.String()
	} else {
		u, err := uuid.Parse(id)
		if err != nil {
			return invalid("ID %q is not a UUID", id)
		}
		id = u.String()
	}
	r := outboxdriver.Row{
		ID:            id,
		AggregateType: e.AggregateType,
		AggregateID:   e.AggregateID,
		Type:          e.Type,
		Payload:       e.Payload,
		RawPayload:    e.RawPayload,
	}
	if r.Payload != nil && json.Valid(r.Payload) && strings.Contains(string(r.Payload), `\u0000`) {
		return invalid("Payload contains \\u0000, which PostgreSQL jsonb cannot store (use RawPayload)")
	}
	if len(e.Headers) > 0 {
		for k := range e.Headers {
			if k == "" || len(k) > MaxHeaderLen {
				return invalid("header name %q must have 1 to %d bytes", k, MaxHeaderLen)
			}
		}
		h, err := json.Marshal(e.Headers)
		if err != nil {
			return outboxdriver.Row{}, err
		}
		r.Headers = h
	}
	return r, nil
}

// traceContext renders the W3C trace context of ctx in Debezium's
// tracingspancontext format, or "" when ctx carries no valid span.
func (o *Outbox[TTx]) traceContext(ctx context.Context) string {
	carrier := propagation.MapCarrier{}
	o.prop.Inject(ctx, carrier)
	tp := carrier.Get("traceparent")
	if tp == "" {
		return ""
	}
	s := "traceparent=" + tp
	if ts := carrier.Get("tracestate"); ts != "" {
		s += "\ntracestate=" + ts
	}
	return s
}
