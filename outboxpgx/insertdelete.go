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
// and deletes them again (WithInsertDelete), and its arguments.
func insertDeleteStatement(t outboxdriver.Table, rows []outboxdriver.Row) (string, []any) {
	n := len(rows)
	ids, ats, aids, tys := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	ps, hs, tcs := make([]*string, n), make([]*string, n), make([]*string, n)
	raws := make([][]byte, n)
	for i, r := range rows {
		ids[i], ats[i], aids[i], tys[i] = r.ID, r.AggregateType, r.AggregateID, r.Type
		ps[i], raws[i], hs[i], tcs[i] = pgschema.NullText(r.Payload), r.RawPayload, pgschema.NullText(r.Headers), pgschema.NullText([]byte(r.TraceContext))
	}
	return `SELECT ` + pgschema.CDCNamesOf(t.WithDefaults()).Write + `($1::uuid[], $2, $3, $4, $5, $6, $7, $8)`,
		[]any{pgschema.UUIDArray(ids), ats, aids, tys, ps, raws, hs, tcs}
}
