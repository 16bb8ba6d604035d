package outboxpgx

import (
	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Events as rows deleted again at once (insert + delete mode,
// docs/cdc.md#the-three-write-modes): the INSERT reaches the WAL, where log
// tailing reads it; the table stays empty. The function <table>_cdc_write
// (migration 4) does both in one statement, so the pair costs the writer
// one round trip, as one INSERT does; from migration 16 a single event
// takes a path without the arrays' unnest and aggregate, which costs the
// server about half.

// insertDeleteStatement returns the call that inserts rows into table t
// and deletes them again (WithInsertDelete), and its arguments
// (pgschema.WriteCall).
func insertDeleteStatement(t outboxdriver.Table, rows []outboxdriver.Row) (string, []any) {
	return pgschema.WriteCall(t, rows, pgschema.Arrays)
}
