package inbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox/internal/tracing"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Message is one delivered event, as any broker adapter can fill it in.
type Message struct {
	// EventID is the event's id, a UUID: the header "id" the outbox's sinks
	// send. Required.
	EventID string
	// AggregateType is the kind of entity ("order"). Optional; part of the
	// version guard's key.
	AggregateType string
	// AggregateID identifies the entity: the message key. Required only
	// for the version guard.
	AggregateID string
	// Type names what happened ("OrderPlaced"). Optional.
	Type string
	// Destination is the subject or topic the message came from. Optional;
	// kept with a dead letter.
	Destination string
	// System names the broker as OpenTelemetry's messaging.system does
	// ("nats", "kafka"), for the process span. Optional.
	System string
	// Payload is the message body, as received.
	Payload []byte
	// Headers are the message headers, as received.
	Headers map[string]string
	// Version is the event's per-aggregate version, when HasVersion is
	// set. It takes precedence over Config.VersionHeader and
	// Config.VersionField.
	Version int64
	// HasVersion says Version is set.
	HasVersion bool
}

// Result says what HandleTx did with a message that was not refused.
type Result struct {
	// Duplicate is set when this consumer already handled the event (or a
	// concurrent copy of it committed first): fn did not run.
	Duplicate bool
	// Stale is set when the version guard found the event's version not
	// newer than the last applied for its aggregate: fn did not run, the
	// event is recorded as handled, and the version is unchanged.
	Stale bool
	// Version is the event's version when the version guard applied.
	Version int64
}

// Applied reports whether fn ran (neither a duplicate nor stale).
func (r Result) Applied() bool { return !r.Duplicate && !r.Stale }

// ErrInvalidMessage is wrapped by every error about a message that HandleTx
// refuses before any SQL runs: no event id, an event id that is not a UUID,
// a version that is missing or does not parse. Such a message will never
// become valid by redelivery; record it with DeadLetter and acknowledge it.
var ErrInvalidMessage = errors.New("invalid message")

// DefaultRetention is how long dedupe records are kept by default.
//
// A record must outlive every way the same event can come again: the
// broker's redelivery of an unacknowledged message (minutes), the relay's
// retries (up to 20 attempts with backoff capped at 5 minutes: under two
// hours), an outbox dead letter retried by an operator, and a replay. An
// event that comes back after its record was deleted is handled again. Seven
// days covers a dead letter retried after a long weekend; raise it if you
// replay older events.
const DefaultRetention = 7 * 24 * time.Hour

// DefaultTable is the name of the inbox table.
const DefaultTable = "inbox"

// Config configures an Inbox.
type Config struct {
	// Consumer names the consumer: a service or handler that applies each
	// event once. Records are keyed by (Consumer, event id), so two
	// consumers sharing a table each handle every event once. Keep it
	// stable across deployments and the same on every instance. Required.
	Consumer string
	// Schema holds the inbox tables. Defaults to the driver's default
	// schema (public on PostgreSQL, main on SQLite, the connection's
	// current database on MySQL/MariaDB).
	Schema string
	// Table names the inbox table; its companions are <Table>_versions,
	// <Table>_dead_letter and <Table>_migrations. Defaults to "inbox".
	Table string
	// VersionHeader names the header holding the event's per-aggregate
	// version (a decimal integer). Set it, or VersionField, to turn the
	// version guard on.
	VersionHeader string
	// VersionField names the payload's JSON field holding the version (a
	// number or a decimal string); dots reach into nested objects
	// ("meta.version").
	VersionField string
	// Retention is how long Cleanup keeps dedupe records. Defaults to
	// DefaultRetention (7 days).
	Retention time.Duration
	// Metrics receives an observation per handled message. Optional.
	Metrics Metrics
	// TracerProvider makes the process span of every Handle and HandleTx
	// call: a child of the trace context the message carries in its
	// traceparent and tracestate headers (the relay's publish span), in
	// which the handler runs. Nil means otel.GetTracerProvider(), looked up
	// at every call (docs/tracing.md).
	TracerProvider trace.TracerProvider
}

// Outcome is what became of one message.
type Outcome int

const (
	// Processed: fn ran and returned nil.
	Processed Outcome = iota
	// Duplicate: the event was handled before; fn did not run.
	Duplicate
	// Stale: the version guard skipped the event; fn did not run.
	Stale
	// Failed: fn or the database returned an error.
	Failed
	// Invalid: the message was refused (ErrInvalidMessage).
	Invalid
)

// String returns processed, duplicate, stale, failed or invalid.
func (o Outcome) String() string {
	switch o {
	case Processed:
		return "processed"
	case Duplicate:
		return "duplicate"
	case Stale:
		return "stale"
	case Failed:
		return "failed"
	case Invalid:
		return "invalid"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Outcomes lists every Outcome, for metrics that export all of them.
func Outcomes() []Outcome { return []Outcome{Processed, Duplicate, Stale, Failed, Invalid} }

// Metrics observes an Inbox. Implementations must be safe for concurrent use;
// package inboxprom has a Prometheus one.
type Metrics interface {
	// Handled is called once per HandleTx (or Handle) call with its outcome
	// and how long it took, handler included. For Handle, Processed is
	// reported after the commit succeeded.
	Handled(consumer string, outcome Outcome, took time.Duration)
}

// DeadLetterMetrics is what a Metrics may implement besides: DeadLettered
// is called once per dead letter recorded. inboxprom's Metrics does.
type DeadLetterMetrics interface {
	DeadLettered(consumer string)
}

// Inbox de-duplicates the messages of one consumer through a driver.
type Inbox[TTx any] struct {
	drv      Driver[TTx]
	table    outboxdriver.Table
	consumer string
	cfg      Config
	tracing  *tracing.Provider
}

// New returns an Inbox for cfg.Consumer writing through drv. It does no I/O;
// migrate the tables once first (inboxpgx.Migrate, inboxsql.Migrate or
// `outbox migrate --inbox`).
func New[TTx any](drv Driver[TTx], cfg *Config) (*Inbox[TTx], error) {
	if drv == nil {
		return nil, errors.New("inbox: driver is nil")
	}
	if cfg == nil {
		return nil, errors.New("inbox: config is nil: Consumer is required")
	}
	c := *cfg
	if strings.TrimSpace(c.Consumer) == "" {
		return nil, errors.New("inbox: Consumer is empty: name the consumer (for example the service name)")
	}
	if strings.IndexByte(c.Consumer, 0) >= 0 || len(c.Consumer) > 200 {
		return nil, fmt.Errorf("inbox: Consumer %q: use 1 to 200 bytes without NUL", c.Consumer)
	}
	if c.VersionHeader != "" && c.VersionField != "" {
		return nil, errors.New("inbox: set at most one of VersionHeader and VersionField")
	}
	if c.VersionField != "" {
		for _, p := range strings.Split(c.VersionField, ".") {
			if p == "" {
				return nil, fmt.Errorf("inbox: VersionField %q has an empty path element", c.VersionField)
			}
		}
	}
	if c.Retention < 0 {
		return nil, fmt.Errorf("inbox: Retention %v is negative", c.Retention)
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.Schema == "" {
		c.Schema = drv.DefaultSchema()
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	t := outboxdriver.Table{Schema: c.Schema, Name: c.Table}
	check := t
	if check.Schema == "" {
		// The driver's default is the connection's own schema (MySQL's
		// current database): check the table name alone.
		check.Schema = "current_database"
	}
	if err := check.Validate(); err != nil {
		return nil, fmt.Errorf("inbox: %w", err)
	}
	return &Inbox[TTx]{drv: drv, table: t, consumer: c.Consumer, cfg: c, tracing: tracing.NewProvider(c.TracerProvider)}, nil
}

// Table returns the inbox table.
func (ib *Inbox[TTx]) Table() outboxdriver.Table { return ib.table }

// Consumer returns the consumer name.
func (ib *Inbox[TTx]) Consumer() string { return ib.consumer }

// Retention returns how long Cleanup keeps dedupe records.
func (ib *Inbox[TTx]) Retention() time.Duration { return ib.cfg.Retention }

// HandleTx handles msg inside the caller's transaction tx: it records
// (consumer, event id) with an INSERT that detects a conflict, and runs
// fn(ctx, tx) only when this is the event's first delivery to this
// consumer (and, with the version guard on, only when its version is newer
// than the last applied for its aggregate, which it then becomes).
//
// A duplicate or stale event returns a Result saying so and a nil error:
// acknowledge it. When a concurrent transaction has recorded the same event
// and not yet ended, HandleTx waits for it; it then reports a duplicate
// (the other committed) or proceeds (the other rolled back).
//
// A message that can never be handled returns an error wrapping
// ErrInvalidMessage before any SQL runs; tx stays usable. Any other error
// (from fn or the database) leaves the record in tx: the caller must roll
// tx back, and the event is handled again on redelivery. Handle does all of
// this for you.
//
// Under REPEATABLE READ or SERIALIZABLE isolation, PostgreSQL reports a
// concurrent copy as a serialization failure instead of waiting; retry the
// transaction as usual.
//
// With tracing on (Config.TracerProvider), the call is a process span, a
// child of the message's traceparent header, and fn's ctx carries it.
func (ib *Inbox[TTx]) HandleTx(ctx context.Context, tx TTx, msg Message, fn func(ctx context.Context, tx TTx) error) (Result, error) {
	start := time.Now()
	ctx, span := ib.startProcess(ctx, &msg)
	res, outcome, err := ib.handleTx(ctx, tx, msg, fn)
	endProcess(span, outcome, err)
	ib.observe(outcome, start)
	return res, err
}

func (ib *Inbox[TTx]) handleTx(ctx context.Context, tx TTx, msg Message, fn func(ctx context.Context, tx TTx) error) (Result, Outcome, error) {
	if fn == nil {
		return Result{}, Invalid, errors.New("inbox: handler is nil")
	}
	p, err := ib.parse(&msg)
	if err != nil {
		return Result{}, Invalid, err
	}
	first, err := ib.drv.ClaimTx(ctx, tx, ib.table, ib.consumer, p.eventID)
	if err != nil {
		return Result{}, Failed, fmt.Errorf("inbox: record event %s for %s in %s: %w", p.eventID, ib.consumer, ib.table, err)
	}
	if !first {
		return Result{Duplicate: true}, Duplicate, nil
	}
	res := Result{}
	if p.guarded {
		res.Version = p.version
		newer, err := ib.drv.AdvanceTx(ctx, tx, ib.table, VersionKey{
			Consumer: ib.consumer, AggregateType: msg.AggregateType, AggregateID: msg.AggregateID,
		}, p.version)
		if err != nil {
			return Result{}, Failed, fmt.Errorf("inbox: version guard for event %s: %w", p.eventID, err)
		}
		if !newer {
			res.Stale = true
			return res, Stale, nil
		}
	}
	if err := fn(ctx, tx); err != nil {
		return Result{}, Failed, err
	}
	return res, Processed, nil
}

// Handle runs HandleTx in a new transaction on the driver's database and
// commits it when HandleTx succeeds (a duplicate or stale event included);
// on any error it rolls back, so nothing is recorded and a redelivery
// handles the event again. fn must not commit or roll back tx.
func (ib *Inbox[TTx]) Handle(ctx context.Context, msg Message, fn func(ctx context.Context, tx TTx) error) (Result, error) {
	start := time.Now()
	var (
		res     Result
		outcome Outcome
	)
	ctx, span := ib.startProcess(ctx, &msg)
	err := ib.drv.InTx(ctx, func(tx TTx) error {
		var err error
		res, outcome, err = ib.handleTx(ctx, tx, msg, fn)
		return err
	})
	if err != nil && outcome != Invalid {
		outcome = Failed
	}
	endProcess(span, outcome, err)
	ib.observe(outcome, start)
	if err != nil {
		return Result{}, err
	}
	return res, nil
}

func (ib *Inbox[TTx]) observe(o Outcome, start time.Time) {
	if ib.cfg.Metrics != nil {
		ib.cfg.Metrics.Handled(ib.consumer, o, time.Since(start))
	}
}

// DeadLetter records msg, as received, with its cause in the dead-letter
// table (<table>_dead_letter) of this consumer, outside any transaction.
// Call it for a message that can never be handled (ErrInvalidMessage, a
// payload the handler cannot decode, a poison message), then acknowledge the
// message so it stops blocking the ones behind it.
func (ib *Inbox[TTx]) DeadLetter(ctx context.Context, msg Message, cause error) error {
	if cause == nil {
		return errors.New("inbox: dead letter without a cause")
	}
	// A message that could not be handled may hold anything: text the
	// database cannot store (NUL, invalid UTF-8) is replaced so that the
	// dead letter itself is never refused. The payload is kept byte for
	// byte.
	dl := DeadLetter{
		Consumer:      ib.consumer,
		EventID:       storable(msg.EventID),
		AggregateType: storable(msg.AggregateType),
		AggregateID:   storable(msg.AggregateID),
		Type:          storable(msg.Type),
		Destination:   storable(msg.Destination),
		Payload:       msg.Payload,
		Error:         storable(cause.Error()),
	}
	if len(msg.Headers) > 0 {
		dl.Headers = make(map[string]string, len(msg.Headers))
		for k, v := range msg.Headers {
			dl.Headers[storable(k)] = storable(v)
		}
	}
	if err := ib.drv.RecordDeadLetter(ctx, ib.table, dl); err != nil {
		return fmt.Errorf("inbox: dead-letter event %q for %s: %w", msg.EventID, ib.consumer, err)
	}
	if m, ok := ib.cfg.Metrics.(DeadLetterMetrics); ok {
		m.DeadLettered(ib.consumer)
	}
	return nil
}

// Admin returns the driver's dead-letter operations, for tools that act
// on this consumer's dead letters outside a handler.
func (ib *Inbox[TTx]) Admin() Admin { return ib.drv }

// ClaimRetries takes up to limit of this consumer's dead letters that an
// operator marked for retry (`outbox inbox dlq retry`), oldest first, and
// clears their mark: of several instances polling at once, one takes each.
// Hand each one's Message to the handler again, then call
// ResolveDeadLetter once it was handled or dead-lettered anew; a dead
// letter claimed and never resolved (its process died) stays, unmarked,
// for the operator to retry again. consumer.Engine does all of this
// (consumer.Config.RetryPoll).
func (ib *Inbox[TTx]) ClaimRetries(ctx context.Context, limit int) ([]DeadLetter, error) {
	if limit <= 0 {
		limit = 100
	}
	dls, err := ib.drv.ClaimRetries(ctx, ib.table, ib.consumer, min(limit, 1000))
	if err != nil {
		return dls, fmt.Errorf("inbox: claim dead letters to retry of %s: %w", ib.consumer, err)
	}
	return dls, nil
}

// ResolveDeadLetter deletes the dead letter id of this consumer: its
// message was handled again (or recorded as a new dead letter).
func (ib *Inbox[TTx]) ResolveDeadLetter(ctx context.Context, id int64) error {
	if _, err := ib.drv.DeleteDeadLetters(ctx, ib.table, ib.consumer, []int64{id}); err != nil {
		return fmt.Errorf("inbox: delete dead letter %d of %s: %w", id, ib.consumer, err)
	}
	return nil
}

// RequestRetry marks the given dead letters of this consumer for retry
// and returns the ids it found; a consumer.Engine running for the consumer
// hands them to its handler again. Operators use `outbox inbox dlq retry`,
// which audits it.
func (ib *Inbox[TTx]) RequestRetry(ctx context.Context, ids ...int64) ([]int64, error) {
	found, err := ib.drv.RequestRetry(ctx, ib.table, ib.consumer, ids)
	if err != nil {
		return found, fmt.Errorf("inbox: request retry of dead letters of %s: %w", ib.consumer, err)
	}
	return found, nil
}

// DeadLetters lists up to limit (at most 1000; 100 when limit <= 0) of this
// consumer's dead letters, oldest first.
func (ib *Inbox[TTx]) DeadLetters(ctx context.Context, limit int) ([]DeadLetter, error) {
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, 1000)
	dls, err := ib.drv.DeadLetters(ctx, ib.table, ib.consumer, limit)
	if err != nil {
		return nil, fmt.Errorf("inbox: list dead letters of %s: %w", ib.consumer, err)
	}
	return dls, nil
}

// Cleanup deletes at most limit of this consumer's dedupe records older than
// olderThan (by the database clock) and returns how many it deleted; call
// it until it returns fewer than limit. olderThan <= 0 means the configured
// Retention; limit <= 0 means 1000. Version-guard state is never deleted:
// it is one row per aggregate, and without it a stale event would be
// applied again.
func (ib *Inbox[TTx]) Cleanup(ctx context.Context, olderThan time.Duration, limit int) (int, error) {
	if olderThan <= 0 {
		olderThan = ib.cfg.Retention
	}
	if limit <= 0 {
		limit = 1000
	}
	n, err := ib.drv.Cleanup(ctx, ib.table, ib.consumer, olderThan, limit)
	if err != nil {
		return n, fmt.Errorf("inbox: cleanup %s for %s: %w", ib.table, ib.consumer, err)
	}
	return n, nil
}

// storable replaces what no database text column stores: invalid UTF-8 and
// NUL bytes become U+FFFD.
func storable(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}
