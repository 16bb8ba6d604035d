package outboxsql

import "github.com/outboxkit/outbox/outboxdriver"

// Option configures a Driver.
type Option func(*Driver)

// WithMessages makes the Driver write events as transactional logical
// decoding messages instead of rows (message mode,
// docs/cdc.md#the-three-write-modes), as outboxpgx.WithMessages does:
// WriteTx and Write emit one message per event through the table's
// function _cdc_emit (schema version 23). Nothing is inserted; only a
// relay with log tailing (--source cdc) reads such events, and only what
// is written while its replication slot exists: the function refuses, and
// the write fails wrapping ErrNoSlot, while no slot of the table's exists.
// Migrate with this Driver creates the slot (docs/databases.md).
func WithMessages() Option { return func(d *Driver) { d.messages, d.insertDelete = true, false } }

// WithInsertDelete makes the Driver write each event as a row and delete
// it again in the same statement (insert + delete mode), through the
// table's function _cdc_write, as outboxpgx.WithInsertDelete does: the
// INSERT reaches the WAL, where log tailing reads it, and the table stays
// empty. The polling relay never sees such events. The write fails,
// wrapping ErrNoSlot, while no replication slot of the table's exists;
// Migrate with this Driver creates it.
func WithInsertDelete() Option { return func(d *Driver) { d.insertDelete, d.messages = true, false } }

// ErrNoSlot is wrapped by the error of a write in message or insert +
// delete mode while no replication slot of the table's exists: nothing
// was written. It is outboxdriver.ErrNoSlot, as outboxpgx.ErrNoSlot is.
// The check runs in the database, inside the write's own statement: it
// costs no round trip and cannot act on a stale view.
var ErrNoSlot = outboxdriver.ErrNoSlot
