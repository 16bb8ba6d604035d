package outboxdriver

import (
	"time"
)

// What a time partition maintenance did or found (TimePartitionChange.Action).
const (
	// PartitionCreated: a partition ahead of now, or the default one, was made.
	PartitionCreated = "created"
	// PartitionDropped: a partition past the window, every event in it
	// published, was dropped.
	PartitionDropped = "dropped"
	// PartitionKept: a partition past the window was not dropped because
	// it holds unpublished events (Detail says how many).
	PartitionKept = "kept"
	// PartitionWaiting: a partition past the window was not dropped yet
	// because some of its events were published within the window (a
	// backlog drained late); it goes once they are older.
	PartitionWaiting = "waiting"
	// PartitionBlocked: a partition ahead could not be made because the
	// default partition holds rows of its range; they are deleted there
	// once published, and the partition is made afterwards.
	PartitionBlocked = "blocked"
	// PartitionBusy: a lock was not granted within the lock timeout (a
	// long transaction on the table); tried again next time.
	PartitionBusy = "busy"
)

// TimePartitionChange is one partition a maintenance acted on or kept.
type TimePartitionChange struct {
	Action    string `json:"action"`
	Partition string `json:"partition"`
	Detail    string `json:"detail,omitempty"`
}

// TimePartitionMaintenance says how a maintenance of a time-partitioned
// outbox table (MigrateOptions.TimePartitions) runs.
type TimePartitionMaintenance struct {
	// KeepFor: a partition is dropped once its range ended at least
	// KeepFor ago, none of its events is unpublished and none was
	// published within KeepFor. Zero or less drops none; partitions ahead
	// are made whatever it is.
	KeepFor time.Duration
	// LockTimeout bounds every wait for a lock on the table: making and
	// dropping a partition lock it exclusively for a moment, and writers
	// queue behind a waiting lock. Defaults to DefaultPartitionLockTimeout.
	LockTimeout time.Duration
	// Actor is who the audit log names for each partition dropped.
	// Defaults to "outbox".
	Actor string
}

// DefaultPartitionLockTimeout is TimePartitionMaintenance.LockTimeout's default.
const DefaultPartitionLockTimeout = 500 * time.Millisecond

// TimePartitionStatus describes a time-partitioned outbox table
// (Status.TimePartitions).
type TimePartitionStatus struct {
	// Unit is "day" or "hour"; Ahead how many units ahead are made.
	Unit  string `json:"unit"`
	Ahead int    `json:"ahead"`
	// Partitions counts the partitions of a range; Oldest and Newest
	// are the start of the first and of the last range.
	Partitions int       `json:"partitions"`
	Oldest     time.Time `json:"oldest,omitzero"`
	Newest     time.Time `json:"newest,omitzero"`
	// DefaultRows counts the rows in the default partition: rows whose
	// created_at had no partition (normally none).
	DefaultRows int64 `json:"default_rows"`
	// MaintainedAt is when a maintenance last ran (zero: never).
	MaintainedAt time.Time `json:"maintained_at,omitzero"`
	// Kept lists the partitions past the window the last maintenance did
	// not drop because they hold unpublished events.
	Kept []KeptPartition `json:"kept,omitempty"`
	// Blocked lists the partitions ahead it could not make.
	Blocked []string `json:"blocked,omitempty"`
}

// KeptPartition is a partition kept for its unpublished events.
type KeptPartition struct {
	Partition   string `json:"partition"`
	Unpublished int64  `json:"unpublished"`
}
