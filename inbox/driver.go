package inbox

import (
	"context"
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
	// DeadLetters lists up to limit dead letters of consumer, oldest first.
	DeadLetters(ctx context.Context, t outboxdriver.Table, consumer string, limit int) ([]DeadLetter, error)
	// Cleanup deletes at most limit records of consumer older than
	// olderThan by the database clock and returns how many it deleted.
	Cleanup(ctx context.Context, t outboxdriver.Table, consumer string, olderThan time.Duration, limit int) (int, error)
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
}
