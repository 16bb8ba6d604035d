package outboxdriver

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
	// DeliverAt is the earliest time the event may be published (the
	// deliver_at column), or zero for at once.
	DeliverAt time.Time
}

// ErrDelayedMode is returned for a delayed event (Row.DeliverAt) written
// in a mode that keeps no row to wait in the table; it wraps
// ErrInvalidEvent.
var ErrDelayedMode = fmt.Errorf("%w: DeliverAt needs the table write mode (a row that waits in the table for the polling relay)", ErrInvalidEvent)

// ErrNoSlot is wrapped by the error of a PostgreSQL write in message or
// insert + delete mode (outboxpgx.WithMessages, outboxsql.WithMessages,
// their WithInsertDelete) while no replication slot of the table's
// exists: nothing was written, because no relay would ever read it. Create
// the slot first (Migrate in that mode, `outbox migrate --cdc`, or a relay
// with log tailing). outboxpgx.ErrNoSlot and outboxsql.ErrNoSlot are this
// error.
var ErrNoSlot = errors.New("no replication slot relays the table")

// ErrDuplicateID is wrapped by the error of a write that carries an event
// id the outbox table holds already, or the same id twice (package outbox
// re-exports it as outbox.ErrDuplicateID). Nothing of that write is
// stored. An event id names one event: give each event its own, or leave
// Event.ID empty for a new UUIDv7.
var ErrDuplicateID = errors.New("an event with this id is in the outbox table already")

// DuplicateIDError is the error of a write refused by the outbox table's
// key on id; it wraps ErrDuplicateID.
type DuplicateIDError struct {
	// Table is the outbox table.
	Table Table
	// ID is the id the table holds already; "" when the database did
	// not say which of IDs it is.
	ID string
	// IDs are the ids of the write, when ID is "".
	IDs []string
}

func (e *DuplicateIDError) Error() string {
	if e.ID != "" {
		return fmt.Sprintf("event id %s: %v (%s); every event needs an id of its own", e.ID, ErrDuplicateID, e.Table)
	}
	ids := e.IDs
	more := ""
	if len(ids) > 3 {
		ids, more = ids[:3], fmt.Sprintf(" and %d more", len(e.IDs)-3)
	}
	return fmt.Sprintf("one of the event ids %s%s: %v (%s); every event needs an id of its own", strings.Join(ids, ", "), more, ErrDuplicateID, e.Table)
}

func (e *DuplicateIDError) Unwrap() error { return ErrDuplicateID }

// ErrInvalidEvent is wrapped by every error about an event that is refused
// before any SQL runs (package outbox re-exports it as
// outbox.ErrInvalidEvent).
var ErrInvalidEvent = errors.New("invalid event")

// Writer inserts events inside a transaction of type TTx owned by the
// caller: the write path (outbox.Outbox.WriteTx). Every driver is one.
type Writer[TTx any] interface {
	// InsertTx inserts rows into table within tx, in one round trip.
	InsertTx(ctx context.Context, tx TTx, table Table, rows []Row) error
	// DefaultSchema is the schema of a table whose configuration names
	// none: "public" on PostgreSQL, "main" on SQLite, "" (the
	// connection's own database) on MySQL.
	DefaultSchema() string
}

// Pooled is a driver that holds a connection pool of its own: it migrates
// a table and inserts events in transactions of its own
// (outbox.Outbox.Migrate and Write). Every Store is one.
type Pooled interface {
	// Migrate creates or upgrades t and returns the versions applied
	// (none when it is current). It is idempotent and safe to run from
	// several processes at once.
	Migrate(ctx context.Context, t Table, opts *MigrateOptions) ([]int, error)
	// Insert inserts rows into t in a transaction of its own.
	Insert(ctx context.Context, t Table, rows []Row) error
}

// TxMigrator is a driver that can run migrations inside a transaction of
// the caller's (outbox.Outbox.MigrateTx); a database that commits DDL at
// once (MySQL) has none.
type TxMigrator[TTx any] interface {
	MigrateTx(ctx context.Context, tx TTx, t Table, opts *MigrateOptions) ([]int, error)
}

// Queuer is a driver whose client batches statements (outboxpgx:
// *pgx.Batch): QueueInsert queues the INSERT of rows on batch, which must
// be of the driver's batch type (outbox.Outbox.Queue).
type Queuer interface {
	QueueInsert(batch any, table Table, rows []Row) error
}

// Record is one claimed event as the relay sees it.
type Record struct {
	ID            string
	Seq           int64
	Partition     int
	AggregateType string
	AggregateID   string
	Type          string
	// Payload is the JSON text of the payload, the raw payload bytes, or nil.
	Payload []byte
	// Headers are the event's own headers.
	Headers map[string]string
	// HeadersErr says why the headers column could not be read as headers
	// (see DecodeHeaders), or is nil. The relay dead-letters such an event
	// rather than publish it without the headers its writer meant.
	HeadersErr error
	// TraceContext is the stored tracingspancontext, or "".
	TraceContext string
	// CreatedAt is when the row was inserted (database clock).
	CreatedAt time.Time
	// Attempts counts earlier failed publish attempts.
	Attempts int
}

// CheckAggregateID reports why id cannot be an aggregate id, or nil. The
// aggregate id is the message key, which must reach the broker unchanged:
// it must not be blank, and must hold no CR, LF or NUL (brokers that carry
// the key as a header, NATS among them, cannot hold a line break in one).
// WriteTx refuses such an event; the relay dead-letters such a row written
// by plain SQL.
func CheckAggregateID(id string) error {
	switch {
	case strings.TrimSpace(id) == "":
		return errors.New("the aggregate id is empty")
	case strings.ContainsAny(id, "\r\n"):
		return errors.New("the aggregate id contains a line break (CR or LF)")
	case strings.IndexByte(id, 0) >= 0:
		return errors.New("the aggregate id contains a NUL byte")
	}
	return nil
}

// Failure records a publish that did not succeed.
type Failure struct {
	ID string
	// Err is the cause; its text is stored as last_error.
	Err error
	// DeadLetter moves the event to the dead-letter table (a permanent
	// error, or its last attempt). Otherwise it is retried after RetryAfter.
	DeadLetter bool
	// RetryAfter delays the next attempt of this event.
	RetryAfter time.Duration
	// Hold keeps the event's later events waiting after it was
	// dead-lettered, until an operator retries or discards it. Without
	// it they flow on.
	Hold bool
}

// Outcome is what became of a claimed batch.
type Outcome struct {
	// Published lists the ids the broker acknowledged.
	Published []string
	// Failed lists the ids that were not acknowledged, with their cause.
	Failed []Failure
}

// Batch is a set of claimed records. Until Finish or Release, no other relay
// can claim them, nor any other record of their partitions.
type Batch interface {
	Records() []Record
	// Finish records the outcome and releases the claim. Records in neither
	// list are released untouched and will be claimed again. An event that
	// failed holds back its aggregate's later events until it is published
	// (or, dead-lettered with Hold unset, at once). Finish fails with
	// ErrLeaseLost, recording nothing, when the relay no longer holds a
	// lease the batch was claimed under.
	Finish(ctx context.Context, out Outcome) error
	// Release gives the claim up without recording anything. It is safe to
	// call after Finish.
	Release(ctx context.Context)
	// Pauses is Source.Pauses, read before the records are published: a
	// batch that holds a connection reads on it, so that a relay whose
	// lanes hold every connection of a small pool never waits for one
	// more.
	Pauses(ctx context.Context) ([]Pause, error)
}

// Lease is a partition a relay owns, and the epoch it acquired it at.
type Lease struct {
	Partition int
	Epoch     int64
}

// ErrLeaseLost is wrapped by Finish when the relay no longer holds a lease
// the batch was claimed under: another relay may own the partition now, so
// nothing is recorded.
var ErrLeaseLost = errors.New("lease lost")

// Source feeds the relay: it claims committed events of the partitions a
// relay leases, records what became of them, and keeps the relay's
// registration and leases. The relay engine talks to nothing else of the
// database.
type Source interface {
	// Claim claims at most limit committed, unpublished, due records of the
	// leased partitions in insertion order, skipping aggregates held back
	// by an earlier failed event, aggregate types excluded by
	// ExcludeAggregateTypes, and partitions another transaction is
	// relaying (a stale owner). It returns an empty batch when there is
	// nothing to do.
	Claim(ctx context.Context, leases []Lease, limit int) (Batch, error)
	// Heartbeat registers this relay as alive for ttl and returns the
	// number of live relays and of partitions.
	Heartbeat(ctx context.Context, ttl time.Duration) (relays, partitions int, err error)
	// Acquire takes up to n partitions that nobody holds (free, or whose
	// lease expired) for ttl, each with a new epoch. The relay asks for
	// n > 0 only.
	Acquire(ctx context.Context, n int, ttl time.Duration) ([]Lease, error)
	// Renew extends the given leases by ttl and returns those still held.
	// The relay renews only when it holds a lease.
	Renew(ctx context.Context, leases []Lease, ttl time.Duration) ([]Lease, error)
	// Release gives leases up at once. With all set, it also removes the
	// relay's registration (a clean stop).
	Release(ctx context.Context, leases []Lease, all bool) error
	// Cleanup deletes, in the leased partitions, at most limit rows that
	// were published (and kept) longer than olderThan ago, and returns how
	// many it deleted.
	Cleanup(ctx context.Context, leases []Lease, olderThan time.Duration, limit int) (int, error)
	// Wait blocks until new events may be available (a wake-up), d has
	// passed, or ctx is done. A spurious return is allowed.
	Wait(ctx context.Context, d time.Duration) error
	// WakesOnCommit reports whether Wait returns soon after a commit to
	// the table (LISTEN/NOTIFY, a change counter), so that a relay that
	// has caught up can wait the whole poll interval instead of looking
	// again after growing waits.
	WakesOnCommit() bool
	// SetIdle tells the source that the relay is caught up and will wait
	// for a wake-up during the next ttl (ttl > 0), or that it is draining
	// (ttl == 0). Writers send wake-ups only while a relay is idle.
	SetIdle(ctx context.Context, ttl time.Duration) error
	// Pauses reads the pauses in force (one small query); the relay
	// publishes no event a pause stops.
	Pauses(ctx context.Context) ([]Pause, error)
	// ExcludeAggregateTypes leaves whole aggregate types out of the
	// following claims, so that a paused type's backlog does not fill
	// every batch while other types wait behind it; nil excludes none.
	// The relay sets the types it knows to be paused before it claims.
	ExcludeAggregateTypes(types []string)
	// MaintainTimePartitions makes the time partitions ahead of now and
	// drops those past m's window (docs/retention.md); the relay calls it
	// periodically. On a table that is not partitioned by time it does
	// nothing and returns no changes.
	MaintainTimePartitions(ctx context.Context, m TimePartitionMaintenance) ([]TimePartitionChange, error)
	// RelayName is the name this source registers under.
	RelayName() string
	// Close releases the source's connections.
	Close() error
}

// Status summarises an outbox table.
type Status struct {
	Table Table
	// Backlog counts unpublished events.
	Backlog int64
	// OldestUnpublishedAge is the age of the oldest unpublished event, 0
	// when there is none.
	OldestUnpublishedAge time.Duration
	// DeadLetters counts events in the dead-letter table.
	DeadLetters int64
	// Published counts published events still kept in the table.
	Published int64
	// Held counts aggregates whose later events wait for an earlier one.
	Held int64
	// OldestHeldAge is how long the aggregate held longest has been held,
	// 0 when none is.
	OldestHeldAge time.Duration
	// Parked counts the events of held aggregates that log tailing parked
	// in the database (PostgreSQL only); they are not in the backlog
	// unless they are rows of the table.
	Parked int64
	// Delayed counts unpublished events whose DeliverAt (deliver_at) is
	// still ahead; they are in the backlog, and the events of their
	// aggregates written after them wait too.
	Delayed int64
	// Partitions lists every partition's lease.
	Partitions []PartitionStatus
	// SchemaVersion is the applied migration; LatestSchemaVersion the
	// newest this build knows.
	SchemaVersion, LatestSchemaVersion int
	// RelaysFrom is the oldest relay schema version the table works with
	// as the table records it (0: every relay, or not recorded: from
	// schema version 20 on PostgreSQL, 6 on MySQL/MariaDB, 4 on SQLite). A live relay older than it claims nothing
	// (docs/operations.md, Upgrades).
	RelaysFrom int
	// Estimated says which counts are estimates (none, from Status).
	Estimated Estimated
	// Pauses lists the pauses in force.
	Pauses []Pause
	// Slots lists the replication slots that relay the table by log
	// tailing (PostgreSQL only); none when it is polled.
	Slots []SlotStatus
	// TimePartitions describes the table's time partitions; nil when it
	// has none (docs/retention.md).
	TimePartitions *TimePartitionStatus
	// Wakeups says who wakes an idle relay (PostgreSQL): WakeupsTrigger
	// or WakeupsWriters; "" where relays only poll.
	Wakeups string
	// BacklogInWAL says events may wait in the WAL of a log-tailing slot
	// that are not counted (PostgreSQL): in message and insert+delete mode
	// the Backlog counts, beyond the table's rows, the events the slot's
	// streamer decoded and has not published (SlotStatus.Backlog), not
	// those not decoded yet; it is then a lower bound, and the slots'
	// UnconfirmedBytes say how much WAL is not confirmed. Also set for a
	// slot whose streamer recorded no backlog yet.
	BacklogInWAL bool
	// OldestAgeEstimated says OldestUnpublishedAge was taken from a
	// stale record of a slot's streamer (SlotBacklog.OldestEstimated).
	OldestAgeEstimated bool
}

// Estimated says which counts of a Status are estimates
// (Store.EstimateStatus).
type Estimated struct {
	Backlog, Published, DeadLetters, Held, PartitionBacklog bool
}

// SlotStatus is a log-tailing replication slot as the database sees it.
type SlotStatus struct {
	Slot, Publication string
	// Exists is false when the slot is missing (not made yet, or lost).
	Exists bool
	// Active says a relay streams the slot now.
	Active bool
	// LagBytes is the WAL the slot retains: the server's current WAL
	// position minus the slot's restart LSN.
	LagBytes int64
	// ConfirmedLSN is the position up to which the slot's relay confirmed
	// every event done ("" when none yet).
	ConfirmedLSN string
	// WALStatus is PostgreSQL's wal_status of the slot: reserved,
	// extended, unreserved or lost.
	WALStatus string
	// Owner is the relay that holds the slot's lease ("" when nobody).
	Owner string
	// UnconfirmedBytes is the WAL past the slot's confirmed LSN: the
	// server's current WAL position minus confirmed_flush_lsn. Events not
	// decoded yet are in it, and whatever else the database wrote.
	UnconfirmedBytes int64
	// Backlog is what the slot's streamer last recorded of the events it
	// decoded and has not yet published or dead-lettered; nil when no
	// streamer recorded one (schema version 22).
	Backlog *SlotBacklog
}

// SlotBacklog is the backlog of a log-tailing slot as its streamer last
// recorded it, about every second while it streams (docs/cdc.md).
type SlotBacklog struct {
	// Mode is the streamer's CDC mode: table, message or insert-delete.
	Mode string
	// Events counts the events decoded and not yet published or
	// dead-lettered that are not rows of the table (a row is counted in
	// the table's backlog): logical decoding messages, and in
	// insert-delete mode also rows. Events not decoded yet are not
	// counted.
	Events int64
	// OldestCommit is the commit time of the oldest transaction with such
	// an event; zero when there is none.
	OldestCommit time.Time
	// OldestAge is the age of that oldest event when read; 0 when none is
	// pending. When the record is stale and none was pending, it is the
	// record's age, OldestEstimated set: events written since may have
	// waited that long.
	OldestAge       time.Duration
	OldestEstimated bool
	// RecordedAt is when the streamer recorded it (the database's clock),
	// RecordAge how long ago that was when read.
	RecordedAt time.Time
	RecordAge  time.Duration
	// Stale says the record is older than a few record intervals: the
	// streamer stopped, or cannot reach the database.
	Stale bool
}

// PartitionStatus is one partition's lease as the database sees it.
type PartitionStatus struct {
	Partition int
	Owner     string // "" when nobody holds it
	Epoch     int64
	// ExpiresIn is how long the lease still runs (negative: expired).
	ExpiresIn time.Duration
	// Backlog counts the partition's unpublished events.
	Backlog int64
}

// VersionHeader is the header that carries an event's contract version
// (the articles' eventVersion): the writer sets it from the event's
// contract, the relay for rows written without it (package contract).
const VersionHeader = "eventVersion"
