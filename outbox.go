package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

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
	// of ordering. Required, and without CR, LF or NUL: the key reaches
	// every broker unchanged.
	AggregateID string
	// Type names what happened ("OrderPlaced"). Required.
	Type string
	// Payload is a JSON document. It must be valid JSON; use RawPayload for
	// anything else. Nil with a nil RawPayload stores SQL NULL. It is
	// stored and published byte for byte (key order, spacing and number
	// spelling as written) on PostgreSQL, MariaDB and SQLite; MySQL 8
	// stores JSON in a binary form and publishes its own encoding of it.
	Payload []byte
	// RawPayload is a payload that is not JSON (protobuf, Avro, text). It is
	// published byte for byte. Set at most one of Payload and RawPayload.
	RawPayload []byte
	// Headers are published as message headers.
	Headers map[string]string
	// DeliverAt, when not zero, delays the event: the relay publishes it
	// no earlier than this time (the database's clock, at microsecond
	// precision), and the aggregate's later events wait behind it: per
	// aggregate order holds (docs/delayed.md). Other aggregates' events
	// pass. It is stored in the table's deliver_at column (PostgreSQL
	// schema version 12, MySQL 4, SQLite 3), which plain-SQL writers may
	// set too. Only the table write mode
	// and the polling relay delay events: the drivers' message and
	// insert+delete modes refuse a delayed event.
	DeliverAt time.Time
}

// ErrInvalidEvent is wrapped by every error about an event that WriteTx
// refuses before any SQL runs. It is outboxdriver.ErrInvalidEvent, so a
// driver's own refusals (a value too long for its column) match it too.
var ErrInvalidEvent = outboxdriver.ErrInvalidEvent

// ErrDuplicateID is wrapped by the error of WriteTx or Write when an event
// carries an id the outbox table holds already, or two events of the call
// carry the same id: nothing of the call is written. errors.As with a
// *outboxdriver.DuplicateIDError gives the id. (A table partitioned by
// time has no key on id; docs/databases.md, event ids.)
var ErrDuplicateID = outboxdriver.ErrDuplicateID

// MigrateOptions shape what Migrate creates: the partition count, time
// partitions, who wakes an idle relay.
type MigrateOptions = outboxdriver.MigrateOptions

// Table names an outbox table and the schema it lives in (Outbox.Table).
type Table = outboxdriver.Table

// SourceConfig configures the Source a driver makes for the relay
// (drv.NewSource): retention, the relay's name, its logger.
type SourceConfig = outboxdriver.SourceConfig

// Retention says what happens to a row once the broker acknowledged it.
type Retention = outboxdriver.Retention

// The retentions of SourceConfig.Retention.
const (
	// RetentionDelete deletes published rows when the batch finishes (the
	// default).
	RetentionDelete = outboxdriver.RetentionDelete
	// RetentionKeep marks published rows and keeps them (for audit and
	// replay); the relay's cleanup deletes them later.
	RetentionKeep = outboxdriver.RetentionKeep
)

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
	// Contracts, when set, checks every event against its payload
	// contract before anything is written (a *contract.Registry; see
	// docs/contracts.md): an event that breaks its contract, holds a
	// forbidden field, or (unless the registry allows it) has no contract
	// is refused with an error wrapping ErrInvalidEvent. An event without
	// an eventVersion header gets the version of the contract it was
	// checked against. Nil (the default) checks only that Payload is JSON.
	Contracts Contracts
}

// Contracts checks an event's payload against its contract. version is
// the event's eventVersion header, or "" for the latest contract; raw
// says the payload is not JSON (RawPayload). It returns the version the
// event goes out with, or "" when the event has no contract and may
// still be written. With Contracts set, WriteTx leaves checking that a
// Payload is JSON to Check (so that it is parsed once): Check must refuse
// a payload that does not parse unless raw is true. *contract.Registry
// implements it.
type Contracts interface {
	Check(aggregateType, eventType, version string, payload []byte, raw bool) (string, error)
}

// VersionHeader is the header that carries an event's contract version.
const VersionHeader = outboxdriver.VersionHeader

// Outbox writes events for one outbox table through a driver.
type Outbox[TTx any] struct {
	drv   outboxdriver.Writer[TTx]
	table outboxdriver.Table
	prop  propagation.TraceContext
	check Contracts
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
	if t.Schema == "" {
		t.Schema = drv.DefaultSchema()
		if t.Schema == "" {
			// The connection's own schema (MySQL's current database): check
			// the table name alone.
			t.Name = cmp.Or(t.Name, outboxdriver.DefaultTableName)
			check := outboxdriver.Table{Schema: "current", Name: t.Name}
			if err := check.Validate(); err != nil {
				return nil, fmt.Errorf("outbox: %w", err)
			}
			return &Outbox[TTx]{drv: drv, table: t, check: cfg.Contracts}, nil
		}
	}
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return &Outbox[TTx]{drv: drv, table: t, check: cfg.Contracts}, nil
}

// Table returns the outbox table this Outbox writes.
func (o *Outbox[TTx]) Table() Table { return o.table }

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

// Write adds events in a transaction of their own, on the driver's
// connection pool: they are visible to the relay once Write returns nil.
// The driver must hold a pool (outboxpgx.New(pool), outboxsql.New(db),
// ...). Use WriteTx to write events with a business change.
func (o *Outbox[TTx]) Write(ctx context.Context, events ...Event) error {
	ins, ok := o.drv.(outboxdriver.Pooled)
	if !ok {
		return fmt.Errorf("outbox: Write: driver %T writes only inside a transaction (WriteTx)", o.drv)
	}
	if len(events) == 0 {
		return nil
	}
	rows, err := o.rows(ctx, events)
	if err != nil {
		return err
	}
	if err := ins.Insert(ctx, o.table, rows); err != nil {
		return fmt.Errorf("outbox: insert %d event(s) into %s: %w", len(rows), o.table, err)
	}
	return nil
}

// Queue validates events and queues their INSERT on batch, a batch of the
// driver's client that carries the business statements of the same
// transaction (a *pgx.Batch for outboxpgx): the events cost no round trip
// of their own. Send batch inside the transaction and commit as usual; the
// events exist for the relay if and only if that transaction commits. On
// an invalid event nothing is queued and the error wraps ErrInvalidEvent.
func (o *Outbox[TTx]) Queue(ctx context.Context, batch any, events ...Event) error {
	q, ok := o.drv.(outboxdriver.Queuer)
	if !ok {
		return fmt.Errorf("outbox: Queue: driver %T has no batches", o.drv)
	}
	if len(events) == 0 {
		return nil
	}
	rows, err := o.rows(ctx, events)
	if err != nil {
		return err
	}
	return q.QueueInsert(batch, o.table, rows)
}

// Migrate creates or upgrades the outbox table and its companions on the
// driver's pool, and returns the versions it applied (none when the table
// is current). It is idempotent and safe to run from several processes at
// once. opts may be nil.
func (o *Outbox[TTx]) Migrate(ctx context.Context, opts *MigrateOptions) ([]int, error) {
	m, ok := o.drv.(outboxdriver.Pooled)
	if !ok {
		return nil, fmt.Errorf("outbox: Migrate: driver %T has no pool of its own (use MigrateTx)", o.drv)
	}
	return m.Migrate(ctx, o.table, opts)
}

// MigrateTx is Migrate inside the caller's transaction tx: the outbox
// table comes into being with the rest of tx, or not at all. Drivers
// whose database commits DDL at once (MySQL) do not offer it.
func (o *Outbox[TTx]) MigrateTx(ctx context.Context, tx TTx, opts *MigrateOptions) ([]int, error) {
	m, ok := o.drv.(outboxdriver.TxMigrator[TTx])
	if !ok {
		return nil, fmt.Errorf("outbox: MigrateTx: driver %T cannot migrate inside a transaction (use Migrate)", o.drv)
	}
	return m.MigrateTx(ctx, tx, o.table, opts)
}

// rows validates events and turns them into driver rows.
func (o *Outbox[TTx]) rows(ctx context.Context, events []Event) ([]outboxdriver.Row, error) {
	trace := o.traceContext(ctx)
	rows := make([]outboxdriver.Row, len(events))
	var seen map[string]int // ids given by the caller, when several events are
	for i := range events {
		r, err := toRow(&events[i], o.check)
		if err != nil {
			return nil, fmt.Errorf("outbox: event %d: %w", i, err)
		}
		if events[i].ID != "" && len(events) > 1 {
			if seen == nil {
				seen = make(map[string]int, len(events))
			}
			if j, ok := seen[r.ID]; ok {
				return nil, fmt.Errorf("outbox: events %d and %d: %w: %w", j, i, ErrInvalidEvent, &outboxdriver.DuplicateIDError{Table: o.table, ID: r.ID})
			}
			seen[r.ID] = i
		}
		r.TraceContext = trace
		rows[i] = r
	}
	return rows, nil
}

func toRow(e *Event, check Contracts) (outboxdriver.Row, error) {
	invalid := func(format string, args ...any) (outboxdriver.Row, error) {
		return outboxdriver.Row{}, fmt.Errorf("%w: %s", ErrInvalidEvent, fmt.Sprintf(format, args...))
	}
	switch {
	case strings.TrimSpace(e.AggregateType) == "":
		return invalid("AggregateType is empty")
	case outboxdriver.CheckAggregateID(e.AggregateID) != nil:
		return invalid("AggregateID %q: %v", e.AggregateID, outboxdriver.CheckAggregateID(e.AggregateID))
	case strings.TrimSpace(e.Type) == "":
		return invalid("Type is empty")
	case e.Payload != nil && e.RawPayload != nil:
		return invalid("both Payload and RawPayload are set")
	case e.Payload != nil && check == nil && !json.Valid(e.Payload):
		// With contracts, Check parses the payload once and refuses one
		// that is not JSON: no second pass over it here.
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
		DeliverAt:     e.DeliverAt,
	}
	if r.Payload != nil && strings.Contains(string(r.Payload), `\u0000`) {
		return invalid("Payload contains \\u0000, which PostgreSQL jsonb cannot store (use RawPayload)")
	}
	headers := e.Headers
	if check != nil {
		given := e.Headers[VersionHeader]
		v, err := check.Check(e.AggregateType, e.Type, given, e.Payload, e.RawPayload != nil)
		if err != nil {
			return outboxdriver.Row{}, fmt.Errorf("%w: %w", ErrInvalidEvent, err)
		}
		if given == "" && v != "" {
			headers = make(map[string]string, len(e.Headers)+1)
			for k, val := range e.Headers {
				headers[k] = val
			}
			headers[VersionHeader] = v
		}
	}
	if len(headers) > 0 {
		for k := range headers {
			if k == "" || len(k) > MaxHeaderLen {
				return invalid("header name %q must have 1 to %d bytes", k, MaxHeaderLen)
			}
		}
		h, err := json.Marshal(headers)
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
