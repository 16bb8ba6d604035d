package inbox

import (
	"context"
	"errors"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// Driver is the seam between an Inbox and a database whose transactions have
// type TTx. Packages inboxpgx (pgx v5) and inboxsql (database/sql:
// PostgreSQL, SQLite, MySQL/MariaDB) implement it. The Inbox validates every
// input first; a driver only runs SQL against a table whose names are valid.
type Driver[TTx any] interface {
	// DefaultSchema is the schema used when Config.Schema is empty. An
	// empty result means the connection's own (MySQL's current database):
	// the table's Schema stays empty and its names unqualified.
	DefaultSchema() string
	// ClaimTx inserts the record (consumer, eventID) into table t within tx
	// and reports whether it was new. It must detect the conflict in the
	// INSERT itself (never check, then insert): when a concurrent
	// transaction holds the same key, it waits for it to end and reports
	// false if that one committed.
	ClaimTx(ctx context.Context, tx TTx, t outboxdriver.Table, consumer, eventID string) (bool, error)
	// AdvanceTx raises the last applied version of key to version within tx
	// if it is lower (or absent) and reports whether it did, in one
	// statement that locks the key's row.
	AdvanceTx(ctx context.Context, tx TTx, t outboxdriver.Table, key VersionKey, version int64) (bool, error)
	// InTx runs fn in a new transaction on the driver's database, commits
	// it when fn returns nil, and rolls it back otherwise (or when fn
	// panics).
	InTx(ctx context.Context, fn func(tx TTx) error) error
	// RecordDeadLetter inserts dl into t's dead-letter table.
	RecordDeadLetter(ctx context.Context, t outboxdriver.Table, dl DeadLetter) error
	// Cleanup deletes at most limit records of consumer older than
	// olderThan by the database clock and returns how many it deleted.
	Cleanup(ctx context.Context, t outboxdriver.Table, consumer string, olderThan time.Duration, limit int) (int, error)
	Admin
}

// Admin is the part of a Driver that reads and changes a consumer's dead
// letters, whatever its transactions' type: what operators use
// (`outbox inbox`, the console) and what a consumer.Engine polls for
// retries. Every method acts on the dead letters of consumer only.
type Admin interface {
	// DeadLetters lists up to limit dead letters of consumer, oldest first.
	DeadLetters(ctx context.Context, t outboxdriver.Table, consumer string, limit int) ([]DeadLetter, error)
	// DeadLetter returns the dead letter id, or an error wrapping
	// ErrNotFound.
	DeadLetter(ctx context.Context, t outboxdriver.Table, consumer string, id int64) (DeadLetter, error)
	// DeadLetterIDs lists the ids of every dead letter, oldest first.
	DeadLetterIDs(ctx context.Context, t outboxdriver.Table, consumer string) ([]int64, error)
	// RequestRetry marks the dead letters ids for retry and returns the
	// ids it found.
	RequestRetry(ctx context.Context, t outboxdriver.Table, consumer string, ids []int64) ([]int64, error)
	// ClaimRetries clears the retry mark of up to limit dead letters
	// marked for retry, oldest first, and returns those whose mark this
	// call cleared: of concurrent callers, one claims each.
	ClaimRetries(ctx context.Context, t outboxdriver.Table, consumer string, limit int) ([]DeadLetter, error)
	// DeleteDeadLetters deletes the dead letters ids and returns the ids
	// it found.
	DeleteDeadLetters(ctx context.Context, t outboxdriver.Table, consumer string, ids []int64) ([]int64, error)
	// Stats counts the dedupe records and dead letters of consumer.
	Stats(ctx context.Context, t outboxdriver.Table, consumer string) (Stats, error)
}

// ErrNotFound is wrapped by the error about a dead letter that does not
// exist.
var ErrNotFound = errors.New("not found")

// Stats summarises one consumer's inbox tables.
type Stats struct {
	Consumer string `json:"consumer"`
	// Processed counts the dedupe records kept (within the retention):
	// the events handled, or skipped as stale.
	Processed int64 `json:"processed"`
	// DeadLetters counts the dead letters; RetryRequested those of them
	// marked for retry and not yet claimed by a running consumer.
	DeadLetters    int64 `json:"dead_letters"`
	RetryRequested int64 `json:"retry_requested"`
	// OldestDeadLetter is when the oldest dead letter was recorded
	// (database clock); zero when there is none.
	OldestDeadLetter time.Time `json:"oldest_dead_letter,omitzero"`
}

// VersionKey identifies the aggregate whose version a consumer guards.
type VersionKey struct {
	Consumer      string
	AggregateType string
	AggregateID   string
}

// DeadLetter is a message a consumer could not handle, as received.
type DeadLetter struct {
	// ID numbers the dead letter in its table.
	ID       int64  `json:"id"`
	Consumer string `json:"consumer"`
	// EventID is the event id as received; it may be empty or not a UUID.
	EventID       string            `json:"event_id"`
	AggregateType string            `json:"aggregatetype"`
	AggregateID   string            `json:"aggregateid"`
	Type          string            `json:"type"`
	Destination   string            `json:"destination"`
	Headers       map[string]string `json:"headers"`
	Payload       []byte            `json:"payload"`
	// Error is the cause's text.
	Error string `json:"error"`
	// DeadLetteredAt is when it was recorded (database clock).
	DeadLetteredAt time.Time `json:"dead_lettered_at"`
	// RetryRequestedAt is when an operator asked for it to be handled
	// again (database clock); zero when nobody did, or once a running
	// consumer claimed it.
	RetryRequestedAt time.Time `json:"retry_requested_at,omitzero"`
}

// Message returns the dead letter as the message it was received as, to be
// handled again.
func (dl DeadLetter) Message() Message {
	return Message{EventID: dl.EventID, AggregateType: dl.AggregateType, AggregateID: dl.AggregateID,
		Type: dl.Type, Destination: dl.Destination, Payload: dl.Payload, Headers: dl.Headers}
}
