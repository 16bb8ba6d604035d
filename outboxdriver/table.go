package outboxdriver

import (
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"
)

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// longestSuffix is the longest suffix added to the table name to name the
// tables, indexes and functions that belong to it ("_dead_letter").
const longestSuffix = len("_dead_letter")

// MaxTableLen is the longest table name accepted: derived names such as
// <table>_dead_letter must still fit PostgreSQL's 63-byte identifiers.
const MaxTableLen = 63 - longestSuffix

// Table names the outbox table and the schema it lives in.
type Table struct {
	Schema string
	Name   string
}

// The default outbox table: public.outbox (on PostgreSQL; MySQL uses the
// connection's database and SQLite "main" as the schema).
const (
	DefaultSchema    = "public"
	DefaultTableName = "outbox"
)

// ValidateIdent reports whether s is a safe SQL identifier: a letter or
// underscore, then up to 62 letters, digits or underscores. what names the
// setting in the error.
func ValidateIdent(what, s string) error {
	if s == "" {
		return fmt.Errorf("%s must not be empty", what)
	}
	if !identRE.MatchString(s) {
		return fmt.Errorf("%s %q is not a valid identifier: use a letter or underscore, then letters, digits or underscores, at most 63 in all", what, s)
	}
	return nil
}

// Validate checks schema and table name.
func (t Table) Validate() error {
	if err := ValidateIdent("schema", t.Schema); err != nil {
		return err
	}
	if err := ValidateIdent("table", t.Name); err != nil {
		return err
	}
	if len(t.Name) > MaxTableLen {
		return fmt.Errorf("table %q is too long: at most %d characters, so that %s_dead_letter fits PostgreSQL's 63-byte names", t.Name, MaxTableLen, t.Name)
	}
	return nil
}

// WithDefaults fills an empty schema with DefaultSchema and an empty name
// with DefaultTableName.
func (t Table) WithDefaults() Table {
	if t.Schema == "" {
		t.Schema = DefaultSchema
	}
	if t.Name == "" {
		t.Name = DefaultTableName
	}
	return t
}

// QuoteIdent quotes a validated identifier for SQL.
func QuoteIdent(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// Qualified returns "schema"."name" for the table, or for the table's
// companion named name+suffix.
func (t Table) Qualified(suffix string) string {
	return QuoteIdent(t.Schema) + "." + QuoteIdent(t.Name+suffix)
}

// Channel is the LISTEN/NOTIFY channel of the table: "schema.name", or a
// hash of it when that would exceed PostgreSQL's 63-byte channel names.
func (t Table) Channel() string {
	ch := t.Schema + "." + t.Name
	if len(ch) <= 63 {
		return ch
	}
	h := fnv.New64a()
	h.Write([]byte(ch))
	return fmt.Sprintf("outbox_%016x", h.Sum64())
}

// String returns schema.name.
func (t Table) String() string { return t.Schema + "." + t.Name }

// Partitioning bounds: aggregates hash into a fixed number of partitions,
// set when the table is first migrated.
const (
	DefaultPartitions = 64
	MaxPartitions     = 4096
)

// MigrateOptions shape what a migration creates. They matter only for the
// migrations that run in that call.
type MigrateOptions struct {
	// Partitions is the fixed number of partitions aggregates hash into;
	// it bounds how many relays share a table. Defaults to
	// DefaultPartitions, at most MaxPartitions. Set when the table is
	// first migrated.
	Partitions int
	// TimePartitions, "day" or "hour", creates the outbox table
	// partitioned by created_at in UTC days or hours, so that published
	// events are removed by dropping whole partitions (docs/retention.md).
	// PostgreSQL only; set when the table is first migrated: an existing
	// table is not converted.
	TimePartitions string
	// TimePartitionsAhead is how many days or hours ahead of now
	// partitions are made. Defaults to 7 days or 48 hours.
	TimePartitionsAhead int
	// Wakeups chooses who wakes an idle relay on PostgreSQL: "trigger"
	// (the table's notify trigger checks on every INSERT; every writer is
	// covered) or "writers" (no trigger: the library's writers send the
	// wake-up themselves while a relay waits, and inserts cost less; a
	// plain-SQL writer's events are found at the relay's next look).
	// Applied on every migration that sets it, to a new or an existing
	// table; "" leaves the table as it is (a new table gets "writers":
	// no trigger, since schema version 26).
	// docs/relay.md, wake-ups.
	Wakeups string
	// IgnoreRelaysBehind applies the migrations even while live relays
	// hold leases that cannot work with one of them; without it Migrate
	// refuses, before applying anything, with a *RelaysBehindError
	// (docs/operations.md, Upgrades).
	IgnoreRelaysBehind bool
	// CDC also creates, once the migration committed, what log tailing on
	// PostgreSQL streams from when it is missing: the table's row in its
	// _cdc companion, the publication of its inserts and the replication
	// slot (outbox migrate --cdc). Writers in message and insert + delete
	// mode need the slot before their first event, so a driver made for
	// those modes (outboxpgx.WithMessages, outboxsql.WithInsertDelete, ...)
	// creates it without being asked. Migrate only: MigrateTx refuses it,
	// because PostgreSQL makes no slot in a transaction that has written.
	// It needs wal_level = logical and a role with REPLICATION; a slot the
	// table had and lost is reported, not made again (a relay in table
	// mode makes it again). The slot keeps WAL from then on until a relay
	// consumes it or `outbox cdc drop` drops it. PostgreSQL only
	// (ErrNoCDC elsewhere).
	CDC bool
	// CDCSlot and CDCPublication name what CDC creates; they default to
	// the names a relay with log tailing streams by default: the slot
	// outbox_<schema>_<table> (cdc.DefaultSlot) and a publication named
	// as the slot.
	CDCSlot, CDCPublication string
}

// ErrNoCDC is returned by a driver asked to create a replication slot
// (MigrateOptions.CDC) on a database other than PostgreSQL.
var ErrNoCDC = errors.New("MigrateOptions.CDC creates a PostgreSQL replication slot; on MySQL/MariaDB the binary log needs none (docs/binlog.md)")

// Who wakes an idle relay on PostgreSQL (MigrateOptions.Wakeups).
const (
	// WakeupsTrigger: the table's notify trigger, which checks on every
	// INSERT statement whether a relay waits. Every writer is covered,
	// plain SQL too.
	WakeupsTrigger = "trigger"
	// WakeupsWriters: no trigger; the library's PostgreSQL writers keep a
	// view of whether a relay waits and add the NOTIFY to their own
	// INSERT only while it says one does (a view at most 25 ms old). Inserts cost
	// no check on the server; a plain-SQL writer's events wake no relay
	// and are found at its next look. A new table's default.
	WakeupsWriters = "writers"
)

// ErrNoWakeups is returned by a driver asked to choose wake-ups
// (MigrateOptions.Wakeups) on a database whose relays only poll.
var ErrNoWakeups = errors.New("wake-ups are chosen on PostgreSQL only: relays on this database poll")

// ErrNoTimePartitions is returned by a driver asked for time partitions
// (MigrateOptions.TimePartitions) on a database that has none here.
var ErrNoTimePartitions = errors.New("time partitions are made on PostgreSQL only (docs/retention.md)")

// Time partition units (MigrateOptions.TimePartitions).
const (
	TimePartitionsDay  = "day"
	TimePartitionsHour = "hour"
)
