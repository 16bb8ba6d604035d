package outboxdriver

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"time"
)

// Retention says what happens to a row once the broker acknowledged it.
type Retention int

const (
	// RetentionDelete deletes published rows when the batch finishes: the
	// table stays small and no cleanup is needed. The default.
	RetentionDelete Retention = iota
	// RetentionKeep sets published_at and keeps the row (for audit); the
	// relay's cleanup deletes it later.
	RetentionKeep
)

// SourceConfig configures a Source.
type SourceConfig struct {
	// Retention of published rows. Defaults to RetentionDelete.
	Retention Retention
	// RelayName identifies this relay in the lease and wake-up registries.
	// Defaults to host-pid-random.
	RelayName string
	// Logger defaults to warnings and errors as text on standard error.
	Logger *slog.Logger
}

// ErrNotMigrated is wrapped by Status (and by a relay's start) for a table
// that does not exist yet.
var ErrNotMigrated = errors.New("outbox table not found: run `outbox migrate` first")

// DeadLetter is one event in the dead-letter table.
type DeadLetter struct {
	ID             string    `json:"id"`
	AggregateType  string    `json:"aggregatetype"`
	AggregateID    string    `json:"aggregateid"`
	Type           string    `json:"type"`
	Attempts       int       `json:"attempts"`
	LastError      string    `json:"last_error"`
	DeadLetteredAt time.Time `json:"dead_lettered_at"`
	// Held is true when the aggregate's later events wait for this one.
	Held bool `json:"held"`
}

// Store is an outbox database as the engine's tools see it: migrations,
// the relay's Source, status, dead letters, pauses and held aggregates,
// the audit, and requests that need a second person. The command line,
// package ops (under the console) and the conformance suite work through
// it. Every driver that holds a pool is one; the write path is its
// Writer, inside the application's own transaction.
//
// Every change an operator makes (retry, discard, pause, release, a
// request's steps) writes its audit row in the same transaction, with the
// name, role and reason of the Acting given.
type Store interface {
	Pooled

	// MigrateDown reverts t to version target (0 drops its tables) and
	// returns the versions reverted.
	MigrateDown(ctx context.Context, t Table, target int) ([]int, error)
	// LatestVersion is the newest schema version this driver knows.
	LatestVersion() int
	// DefaultSchema is the schema of a table whose configuration names
	// none: "public" on PostgreSQL, "main" on SQLite, "" (the
	// connection's database) on MySQL.
	DefaultSchema() string
	// NewSource returns a relay's view of t.
	NewSource(t Table, cfg *SourceConfig) (Source, error)
	// Close releases what the Store opened itself; a connection pool the
	// caller passed in stays open.
	Close() error

	// Status summarises t; it wraps ErrNotMigrated when t does not exist.
	Status(ctx context.Context, t Table) (Status, error)
	// EstimateStatus is Status with each count exact up to exactUpTo and
	// estimated above it where the database can (from the planner's
	// statistics or a sample of the table); Status.Estimated says which
	// counts are. The console's overview uses it, so that it stays cheap
	// on a backlog of millions.
	EstimateStatus(ctx context.Context, t Table, exactUpTo int64) (Status, error)
	// BacklogBy groups t's unpublished events by column (one of
	// route.ColumnNames: aggregatetype, aggregateid, type, id,
	// created_at, the latter as RFC 3339 with microseconds in UTC). It
	// returns at most limit groups, the largest first, and one more with
	// Rest set holding the others when there are more.
	BacklogBy(ctx context.Context, t Table, column string, limit int) ([]BacklogGroup, error)
	// Backlog lists up to limit groups of unpublished events by aggregate
	// type and event type, largest first; above a bound of events the
	// counts may be estimates (KindBacklog.Estimated).
	Backlog(ctx context.Context, t Table, limit int) ([]KindBacklog, error)
	// Relays lists the registered relays, and on PostgreSQL the
	// log-tailing relays that hold or held a replication slot's lease.
	Relays(ctx context.Context, t Table) ([]RelayStatus, error)
	// RecordSample stores a sample of t now and deletes samples older
	// than keep.
	RecordSample(ctx context.Context, t Table, keep time.Duration) error
	// Samples lists the samples since a time, oldest first.
	Samples(ctx context.Context, t Table, since time.Time) ([]Sample, error)
	// MaintainTimePartitions makes t's time partitions ahead of now and
	// drops those past m's window (docs/retention.md). On a table that is
	// not partitioned by time it does nothing and returns no changes.
	MaintainTimePartitions(ctx context.Context, t Table, m TimePartitionMaintenance) ([]TimePartitionChange, error)

	// FindDeadLetters lists the dead letters of t that q selects.
	FindDeadLetters(ctx context.Context, t Table, q DeadLetterQuery) (DeadLetterPage, error)
	// DeadLetterValues lists up to limit distinct values of column
	// (aggregatetype, aggregateid, type or id) among the dead letters of
	// t that q selects (q's After, Limit and routed values aside): how a
	// destination filter is resolved through the routing.
	DeadLetterValues(ctx context.Context, t Table, q DeadLetterQuery, column string, limit int) ([]string, error)
	// FindRoutedDeadLetters is FindDeadLetters keeping only dead letters
	// whose column holds one of values (none: no dead letter).
	FindRoutedDeadLetters(ctx context.Context, t Table, q DeadLetterQuery, column string, values []string) (DeadLetterPage, error)
	// DeadLetter returns one dead letter of t; it wraps ErrNotFound when
	// there is none with that id.
	DeadLetter(ctx context.Context, t Table, id string) (DeadLetterDetail, error)
	// RetryDeadLetters moves dead letters back into the outbox with their
	// ids and original positions (nil ids: all), audited as by, and
	// returns the ids moved.
	RetryDeadLetters(ctx context.Context, t Table, ids []string, by Acting) ([]string, error)
	// DiscardDeadLetters deletes dead letters for good and releases the
	// aggregates held behind them (nil ids: all), audited as by, and
	// returns the ids deleted.
	DiscardDeadLetters(ctx context.Context, t Table, ids []string, by Acting) ([]string, error)
	// FailureGroups lists up to limit groups of t's dead letters by event
	// type and error class, largest first.
	FailureGroups(ctx context.Context, t Table, limit int) ([]FailureGroup, error)
	// FailureGroupIDs returns the ids of up to limit dead letters of the
	// group key, oldest first (none for a key no group has).
	FailureGroupIDs(ctx context.Context, t Table, key string, limit int) ([]string, error)

	// ListPauses lists the pauses in force on t, oldest first.
	ListPauses(ctx context.Context, t Table) ([]Pause, error)
	// SetPause pauses s; it reports false when s was paused already
	// (nothing is changed then).
	SetPause(ctx context.Context, t Table, s PauseScope, by Acting) (bool, error)
	// LiftPause resumes s; it reports false when s was not paused.
	LiftPause(ctx context.Context, t Table, s PauseScope, by Acting) (bool, error)
	// HeldAggregates lists up to limit held aggregates, longest held
	// first.
	HeldAggregates(ctx context.Context, t Table, limit int) ([]HeldAggregate, error)
	// ReleaseHeld lets the later events of the aggregate held behind the
	// dead letter eventID flow on (the dead letter stays); it wraps
	// ErrNotFound when that dead letter holds no aggregate.
	ReleaseHeld(ctx context.Context, t Table, eventID string, by Acting) (HeldAggregate, error)

	// AppendAudit adds r to the audit table of t: for what is not a change
	// the Store audits itself (a login, a refused request). Its ID and At
	// are set by the database.
	AppendAudit(ctx context.Context, t Table, r AuditRecord) error
	// FindAudit lists the audit rows of t that q selects, newest first.
	FindAudit(ctx context.Context, t Table, q AuditQuery) ([]AuditRecord, error)
	// PruneAudit deletes the audit rows older than before, the audit's one
	// retention command, and records that it did, as by.
	PruneAudit(ctx context.Context, t Table, before time.Time, by Acting) (int64, error)

	// MaskPaths lists the payload paths stored with t as sensitive (its
	// masking), by aggregate type, event type and path; none for a table
	// that predates the masking table. It wraps ErrNotMigrated when t
	// does not exist.
	MaskPaths(ctx context.Context, t Table) ([]MaskPath, error)
	// AddMaskPath stores p (its Actor and At are set from by and the
	// database's clock) and audits it as by, in one transaction; it
	// reports false, writing nothing, when the same path is stored for
	// the same scope already.
	AddMaskPath(ctx context.Context, t Table, p MaskPath, by Acting) (bool, error)
	// RemoveMaskPath deletes the stored path p.Path of p's scope and
	// audits it as by, in one transaction; it reports false, writing
	// nothing, when there is none.
	RemoveMaskPath(ctx context.Context, t Table, p MaskPath, by Acting) (bool, error)

	// CreateRequest stores r (pending) and audits it as by.
	CreateRequest(ctx context.Context, t Table, r Request, by Acting) error
	// GetRequest returns one request; it wraps ErrNotFound.
	GetRequest(ctx context.Context, t Table, id string) (Request, error)
	// ListRequests lists requests, newest first; state "" lists all.
	ListRequests(ctx context.Context, t Table, state string, limit int) ([]Request, error)
	// DecideRequest moves a pending, unexpired request to approved or
	// rejected (to = StateApproved or StateRejected), or a pending,
	// approved or executing one to cancelled (to = StateCancelled); it
	// wraps ErrRequestState when the request is not in such a state and
	// ErrNotFound when there is none.
	DecideRequest(ctx context.Context, t Table, id, to string, by Acting) (Request, error)
	// ExpireRequests marks pending and approved requests past their expiry
	// expired, audited as by, and returns them.
	ExpireRequests(ctx context.Context, t Table, by Acting) ([]string, error)
	// ClaimRequest makes executor the executor of an approved, unexpired
	// request, or of an executing one whose executor has not renewed its
	// heartbeat for stale, with a new epoch; it wraps ErrRequestState when
	// it cannot.
	ClaimRequest(ctx context.Context, t Table, id, executor string, stale time.Duration) (Request, error)
	// SetRequestTotal records how many events an execution found, once.
	SetRequestTotal(ctx context.Context, t Table, id string, total int64) error
	// FinishRequest ends an execution held at epoch: done, or failed with
	// msg.
	FinishRequest(ctx context.Context, t Table, id, executor string, epoch int64, state, msg string) error
	// HasPublished reports whether t keeps any published row.
	HasPublished(ctx context.Context, t Table) (bool, error)
	// PreviewReplay counts the events f selects and returns the first
	// limit of them in their original order.
	PreviewReplay(ctx context.Context, t Table, f ReplayFilter, limit int) (int64, []ReplayEvent, error)
	// RoutedValues lists up to limit distinct values of column among the
	// events f selects.
	RoutedValues(ctx context.Context, t Table, f ReplayFilter, column string, limit int) ([]string, error)
	// ReplayBatch re-enqueues the next events of b in their original
	// order, advances the request's cursor and progress and renews its
	// heartbeat, all in one transaction, and returns how many it
	// re-enqueued and whether any remain.
	ReplayBatch(ctx context.Context, t Table, b ReplayBatch) (n int, more bool, err error)
	// RepairDeadLetter replaces the payload and headers of a dead letter
	// (payload nil keeps it; headers nil keeps them) and moves it back
	// into the outbox with its id, auditing the change with the before and
	// after, in one transaction held at the request's epoch.
	RepairDeadLetter(ctx context.Context, t Table, req, executor string, epoch int64, id string, payload, headers json.RawMessage, by Acting) error
}
