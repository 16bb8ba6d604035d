package cdc

import (
	"fmt"
	"time"

	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Mode says which writes a CDC source expects, which decides what it
// does when its replication slot was lost (dropped or invalidated). It
// reads every kind of write whatever the mode: rows (plain inserts, and
// insert+delete) and logical decoding messages.
type Mode int

const (
	// ModeTable: events are rows of the outbox table. A lost slot is
	// reported and made again, and the rows still in the table are relayed
	// (drained) before the new slot's stream: nothing is lost. The default.
	ModeTable Mode = iota
	// ModeMessages: events are logical decoding messages
	// (outboxpgx.WithMessages), which exist only in the WAL. A lost slot
	// stops the relay with an error that names the LSN range in which
	// messages may be lost.
	ModeMessages
	// ModeInsertDelete: events are rows deleted again in their own
	// transaction (outboxpgx.WithInsertDelete), which exist only in the
	// WAL too. A lost slot stops the relay as in ModeMessages.
	ModeInsertDelete
)

// String returns "table", "message" or "insert-delete".
func (m Mode) String() string {
	switch m {
	case ModeMessages:
		return "message"
	case ModeInsertDelete:
		return "insert-delete"
	}
	return "table"
}

// ParseMode parses "table", "message" or "insert-delete".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "table":
		return ModeTable, nil
	case "message", "messages":
		return ModeMessages, nil
	case "insert-delete", "insert+delete":
		return ModeInsertDelete, nil
	}
	return 0, fmt.Errorf("unknown CDC mode %q: use table, message or insert-delete", s)
}

// Config configures a Source. The zero value relays the table's
// default slot and publication, creating them when missing.
type Config struct {
	outboxdriver.SourceConfig
	// Slot is the logical replication slot. Defaults to DefaultSlot(t):
	// derived from schema and table, so two outbox tables never share one.
	// Lower-case letters, digits and underscores, at most 63.
	Slot string
	// Publication is the publication of the outbox table's inserts the
	// slot streams. Defaults to the slot's name.
	Publication string
	// NoCreate makes a missing slot or publication an error instead of
	// creating it.
	NoCreate bool
	// Mode says what a lost slot means. Defaults to ModeTable.
	Mode Mode
	// MaxPending bounds the events decoded and not yet published that
	// the source keeps in memory: it stops reading the stream while it
	// holds that many. A larger transaction is handed on in parts (of at
	// most 1000 events) and never held whole. Defaults to 10000.
	MaxPending int
	// SpillDir is where the events of a large transaction that PostgreSQL
	// streams before its commit wait for the commit, in a file per
	// transaction removed at its end. Defaults to the system's temporary
	// directory (os.TempDir).
	SpillDir string
	// StatusInterval is the longest time between two standby status
	// updates to the server, which confirm the LSN the slot may release
	// WAL up to. Defaults to 10s; it must stay below the server's
	// wal_sender_timeout.
	StatusInterval time.Duration
}

const (
	defaultMaxPending     = 10000
	defaultStatusInterval = 10 * time.Second
	drainPage             = 1000
)

// DefaultSlot is the default replication slot (and publication) name of
// table t: "outbox_<schema>_<table>", lower-cased, with a hash of the
// names appended when that was needed to keep it unique (upper-case
// letters) or short enough (63 bytes).
func DefaultSlot(t outboxdriver.Table) string { return pgschema.DefaultSlot(t) }

// resolve fills the defaults of cfg (nil: none) for table t.
func (cfg *Config) resolve(t outboxdriver.Table) (Config, error) {
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	var err error
	if c.Slot, c.Publication, err = pgschema.SlotNames(t, c.Slot, c.Publication); err != nil {
		return c, err
	}
	if c.Mode != ModeTable && c.Mode != ModeMessages && c.Mode != ModeInsertDelete {
		return c, fmt.Errorf("unknown CDC mode %d", c.Mode)
	}
	if c.MaxPending == 0 {
		c.MaxPending = defaultMaxPending
	}
	if c.MaxPending < 1 {
		return c, fmt.Errorf("CDC MaxPending %d must be positive", c.MaxPending)
	}
	if c.StatusInterval == 0 {
		c.StatusInterval = defaultStatusInterval
	}
	if c.StatusInterval < 10*time.Millisecond || c.StatusInterval > time.Minute {
		return c, fmt.Errorf("CDC StatusInterval %s: use 10ms to 1m", c.StatusInterval)
	}
	return c, nil
}
