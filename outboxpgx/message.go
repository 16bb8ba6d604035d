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
// table t, in order, and its arguments.
func messageStatement(t outboxdriver.Table, rows []outboxdriver.Row) (string, []any) {
	prefix := MessagePrefix(t)
	if len(rows) == 1 {
		return `SELECT pg_logical_emit_message(true, $1, $2::text)`, []any{prefix, string(pgschema.AppendMessage(nil, &rows[0]))}
	}
	contents := make([]string, len(rows))
	var buf []byte
	for i := range rows {
		buf = pgschema.AppendMessage(buf[:0], &rows[i])
		contents[i] = string(buf)
	}
	return `SELECT pg_logical_emit_message(true, $1, m.c) FROM unnest($2::text[]) WITH ORDINALITY AS m(c, i) ORDER BY m.i`, []any{prefix, contents}
}
