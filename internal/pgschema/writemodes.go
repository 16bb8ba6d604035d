package pgschema

import (
	"errors"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/outbox/outboxdriver"
)

// The write modes of log tailing that add no row to the table (message
// mode and insert + delete mode, docs/cdc.md#the-three-write-modes): the
// calls of the table's functions _cdc_emit and _cdc_write, and the
// refusal they answer with while no replication slot of the table's
// exists. Both PostgreSQL drivers write through them: outboxpgx sends the
// events as arrays, which pgx encodes (Arrays); outboxsql sends one
// argument per column of each event, which every database/sql driver can
// send (lib/pq takes no slice), gathered into arrays by ARRAY constructors
// (Scalars).

// ArgStyle says how the arguments of a call are sent.
type ArgStyle int

const (
	// Arrays: one array argument per column (pgx encodes Go slices).
	Arrays ArgStyle = iota
	// Scalars: one argument per column of each event, gathered into the
	// arrays by ARRAY constructors in the statement (database/sql).
	Scalars
)

// EmitCall returns the statement that emits rows as logical decoding
// messages of table t, in order, and its arguments: the call of t's
// _cdc_emit (version 23), which refuses while no replication slot of t's
// exists, so that no event is written where no relay will ever read it.
func EmitCall(t outboxdriver.Table, rows []outboxdriver.Row, style ArgStyle) (string, []any) {
	contents := make([]string, len(rows))
	var buf []byte
	for i := range rows {
		buf = AppendMessage(buf[:0], &rows[i])
		contents[i] = string(buf)
	}
	fn := CDCNamesOf(t.WithDefaults()).Emit
	if style == Arrays {
		return `SELECT ` + fn + `($1::text[])`, []any{contents}
	}
	args := make([]any, len(contents))
	for i, c := range contents {
		args[i] = c
	}
	return `SELECT ` + fn + `(` + arrayOf(len(rows), 1, 0, "text") + `)`, args
}

// writeTypes are the element types of _cdc_write's arguments, in order.
var writeTypes = [...]string{"uuid", "text", "text", "text", "text", "bytea", "text", "text"}

// WriteCall returns the statement that inserts rows into table t and
// deletes them again (insert + delete mode), and its arguments: the call
// of t's _cdc_write (migration 4), which from version 23 refuses while no
// replication slot of t's exists.
func WriteCall(t outboxdriver.Table, rows []outboxdriver.Row, style ArgStyle) (string, []any) {
	fn := CDCNamesOf(t.WithDefaults()).Write
	n := len(rows)
	if style == Arrays {
		ids, ats, aids, tys := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		ps, hs, tcs := make([]*string, n), make([]*string, n), make([]*string, n)
		raws := make([][]byte, n)
		for i, r := range rows {
			ids[i], ats[i], aids[i], tys[i] = r.ID, r.AggregateType, r.AggregateID, r.Type
			ps[i], raws[i], hs[i], tcs[i] = NullText(r.Payload), r.RawPayload, NullText(r.Headers), NullText([]byte(r.TraceContext))
		}
		return `SELECT ` + fn + `($1::uuid[], $2, $3, $4, $5, $6, $7, $8)`,
			[]any{UUIDArray(ids), ats, aids, tys, ps, raws, hs, tcs}
	}
	cols := len(writeTypes)
	args := make([]any, 0, cols*n)
	for _, r := range rows {
		var raw any
		if r.RawPayload != nil {
			raw = r.RawPayload
		}
		args = append(args, r.ID, r.AggregateType, r.AggregateID, r.Type,
			nullArg(r.Payload), raw, nullArg(r.Headers), nullArg([]byte(r.TraceContext)))
	}
	var b strings.Builder
	b.WriteString(`SELECT `)
	b.WriteString(fn)
	b.WriteString(`(`)
	for c, typ := range writeTypes {
		if c > 0 {
			b.WriteString(`, `)
		}
		b.WriteString(arrayOf(n, cols, c, typ))
	}
	b.WriteString(`)`)
	return b.String(), args
}

// arrayOf is the ARRAY constructor of column c of n events sent as cols
// arguments each: ARRAY[$c+1::typ, $c+1+cols::typ, ...].
func arrayOf(n, cols, c int, typ string) string {
	var b strings.Builder
	b.WriteString(`ARRAY[`)
	for i := range n {
		if i > 0 {
			b.WriteString(`, `)
		}
		b.WriteString(`$`)
		b.WriteString(strconv.Itoa(i*cols + c + 1))
		b.WriteString(`::`)
		b.WriteString(typ)
	}
	b.WriteString(`]`)
	return b.String()
}

// nullArg is NullText as a database/sql argument: nil or a string.
func nullArg(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return string(b)
}

// NoSlotHint is the hint of the refusal of t's _cdc_slot (version 23).
const NoSlotHint = "outbox-no-slot"

// NoSlot returns err, marked as outboxdriver.ErrNoSlot when it is the
// database's refusal to write without a replication slot (the hint
// NoSlotHint), as pgx (and pgx's database/sql driver) or lib/pq report it.
func NoSlot(err error) error {
	if err == nil {
		return nil
	}
	hint := ""
	var pgErr *pgconn.PgError
	var fields interface{ Get(byte) string } // lib/pq's *pq.Error: 'H' is the hint
	switch {
	case errors.As(err, &pgErr):
		hint = pgErr.Hint
	case errors.As(err, &fields):
		hint = fields.Get('H')
	}
	if hint != NoSlotHint {
		return err
	}
	return noSlotError{err}
}

// noSlotError is the database's refusal, which also is
// outboxdriver.ErrNoSlot.
type noSlotError struct{ err error }

func (e noSlotError) Error() string   { return e.err.Error() }
func (e noSlotError) Unwrap() []error { return []error{outboxdriver.ErrNoSlot, e.err} }
