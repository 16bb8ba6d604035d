package outboxpgx

import (
	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Events as logical decoding messages (message mode,
// docs/cdc.md#the-three-write-modes): WithMessages writes each event as
// one transactional logical decoding message with the table's prefix
// (MessagePrefix) and a JSON content of format MessageVersion, which log
// tailing (package outboxpgx/cdc) decodes. docs/cdc.md gives the format
// for writers in plain SQL.

// MessageVersion is the version of the content format of the logical
// decoding messages written in message mode.
const MessageVersion = pgschema.MessageVersion

// MessagePrefix is the prefix of the logical decoding messages that carry
// the events of table t: "outbox:" followed by schema.table.
func MessagePrefix(t outboxdriver.Table) string { return pgschema.MessagePrefix(t) }

// messageStatement returns the statement that emits rows as messages of
// table t, in order, and its arguments (pgschema.EmitCall).
func messageStatement(t outboxdriver.Table, rows []outboxdriver.Row) (string, []any) {
	return pgschema.EmitCall(t, rows, pgschema.Arrays)
}

// ErrNoSlot is wrapped by the error of a write in message or insert +
// delete mode (WithMessages, WithInsertDelete) while no replication slot
// of the table's exists: nothing was written, because no relay would ever
// read it. Create the slot (Migrate with this Driver, `outbox migrate
// --cdc`, cdc.Source.Setup, or a relay with --source cdc) before writers
// write. It is outboxdriver.ErrNoSlot, which outboxsql's writers wrap too.
var ErrNoSlot = outboxdriver.ErrNoSlot

// writeFailed returns err, marked as ErrNoSlot when it is the refusal of
// _cdc_slot; as an *outboxdriver.DuplicateIDError when the table refused
// an id of kept it holds already.
func writeFailed(err error, kept ...keptRows) error {
	if e := pgschema.NoSlot(err); e != err {
		return e
	}
	for _, k := range kept {
		if e := pgschema.DuplicateID(err, k.table, k.rows); e != err {
			return e
		}
	}
	return err
}
