package outboxpgx

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"

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
// table t, in order, and its arguments: the call of t's _cdc_emit, which
// refuses while no replication slot of t's exists (version 23), so that
// no event is written where no relay will ever read it.
func messageStatement(t outboxdriver.Table, rows []outboxdriver.Row) (string, []any) {
	contents := make([]string, len(rows))
	var buf []byte
	for i := range rows {
		buf = pgschema.AppendMessage(buf[:0], &rows[i])
		contents[i] = string(buf)
	}
	return `SELECT ` + pgschema.CDCNamesOf(t).Emit + `($1::text[])`, []any{contents}
}

// ErrNoSlot is wrapped by the error of a write in message or insert +
// delete mode (WithMessages, WithInsertDelete) while no replication slot
// of the table's exists: nothing was written, because no relay would ever
// read it. Create the slot (`outbox migrate --cdc`, cdc.Source.Setup, or a
// relay with --source cdc) before writers write.
var ErrNoSlot = errors.New("outboxpgx: no replication slot relays the table")

// noSlotError is the database's refusal, which also is ErrNoSlot.
type noSlotError struct{ err error }

func (e noSlotError) Error() string   { return e.err.Error() }
func (e noSlotError) Unwrap() []error { return []error{ErrNoSlot, e.err} }

// writeFailed returns err, marked as ErrNoSlot when it is the refusal of
// _cdc_slot; as an *outboxdriver.DuplicateIDError when the table refused
// an id of kept it holds already.
func writeFailed(err error, kept ...keptRows) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Hint == "outbox-no-slot" {
		return noSlotError{err}
	}
	for _, k := range kept {
		if e := pgschema.DuplicateID(err, k.table, k.rows); e != err {
			return e
		}
	}
	return err
}
