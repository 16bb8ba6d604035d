// Package outboxdriver is the seam between the outbox core and a database.
//
// A driver implements Writer for the write path (inserting events inside the
// caller's transaction) and Source for the relay (claiming unpublished events
// and recording what became of them). The relay engine only ever talks to a
// Source, so it never imports a database client.
package outboxdriver

import (
	"context"
	"time"
)

// Row is one event ready to be inserted. The core has validated it.
type Row struct {
	// ID is the event id in canonical UUID text form.
	ID            string
	AggregateType string
	AggregateID   string
	Type          string
	// Payload is a JSON document, or nil for SQL NULL. Exactly one of
	// Payload and RawPayload is set for a non-null payload.
	Payload []byte
	// RawPayload holds a payload that is not JSON.
	RawPayload []byte
	// Headers is a JSON object of string values, or nil for none.
	Headers []byte
	// TraceContext is the W3C trace context in the Debezium
	// tracingspancontext format ("traceparent=...\ntracestate=..."), or "".
	TraceContext string
}

// Writer inserts events inside a transaction of type TTx owned by the caller.
type Writer[TTx any] interface {
	// InsertTx inserts rows into table within tx, in one round trip.
	InsertTx(ctx context.Context, tx TTx, table Table, rows []Row) error
}

// Record is one claimed event as the relay sees it.
type Record struct {
	ID            string
	Seq           int64
	AggregateType string
	AggregateID   string
	Type          string
	// Payload is the JSON text of the payload, the raw payload bytes, or nil.
	Payload []byte
	// Headers are the event's own headers.
	Headers map[string]string
	// TraceContext is the stored tracingspancontext, or "".
	TraceContext string
	// CreatedAt is when the row was inserted (database clock).
	CreatedAt time.Time
	// Attempts counts earlier failed publish attempts.
	Attempts int
}

// Failure records a publish that did not succeed.
type Failure struct {
	ID string
	// Err is the cause; its text is stored as last_error.
	Err error
	// Permanent moves the event to the dead-letter table at once.
	Permanent bool
	// RetryAfter delays the next attempt of this event.
	RetryAfter time.Duration
}

// Outcome is what became of a claimed batch.
type Outcome struct {
	// Published lists the ids the broker acknowledged.
	Published []string
	// Failed lists the ids that were not acknowledged, with their cause.
	Failed []Failure
}

// Batch is a set of claimed records. Until Finish or Release, no other relay
// can claim them.
type Batch interface {
	Records() []Record
	// Finish records the outcome and releases the claim. Records in neither
	// list are released untouched and will be claimed again.
	Finish(ctx context.Context, out Outcome) error
	// Release gives the claim up without recording anything. It is safe to
	// call after Finish.
	Release(ctx context.Context)
}

// Source feeds the relay.
type Source interface {
	// Claim claims at most limit committed, unpublished, due records in
	// insertion order. It returns an empty batch when there is nothing to do.
	Claim(ctx context.Context, limit int) (Batch, error)
	// Wait blocks until new events may be available (a wake-up), d has
	// passed, or ctx is done. A spurious return is allowed.
	Wait(ctx context.Context, d time.Duration) error
	// SetIdle tells the source that the relay is caught up and will wait
	// for a wake-up during the next ttl (ttl > 0), or that it is draining
	// (ttl == 0). Writers send wake-ups only while a relay is idle.
	SetIdle(ctx context.Context, ttl time.Duration) error
	// Close releases the source's connections.
	Close() error
}

// Status summarises an outbox table.
type Status struct {
	Backlog              int64
	OldestUnpublishedAge time.Duration
	DeadLetters          int64
	Published            int64
	SchemaVersion        int
	LatestSchemaVersion  int
	Table                Table
}
