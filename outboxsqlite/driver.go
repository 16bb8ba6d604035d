package outboxsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/outboxdriver"
)

const insertCols = `(id, aggregatetype, aggregateid, type, payload, payload_raw, headers, tracingspancontext)`

// insertColsDelayed are the columns of an INSERT with a delayed event.
const insertColsDelayed = `(id, aggregatetype, aggregateid, type, payload, payload_raw, headers, tracingspancontext, deliver_at)`

// maxRowsPerInsert keeps one INSERT's bound parameters (8 per row, 9 with
// deliver_at) well under SQLite's limit of 32766.
const maxRowsPerInsert = 1000

// InsertTx inserts rows within tx with one multi-row INSERT (a call with
// more than maxRowsPerInsert rows takes one INSERT per thousand). The rows
// exist for the relay if and only if tx commits.
func (d *Driver) InsertTx(ctx context.Context, tx *sql.Tx, t outboxdriver.Table, rows []outboxdriver.Row) error {
	if tx == nil {
		return errors.New("transaction is nil")
	}
	if len(rows) == 0 {
		return nil
	}
	t, err := table(t)
	if err != nil {
		return err
	}
	for len(rows) > 0 {
		n := min(len(rows), maxRowsPerInsert)
		sql, args := statement(t, rows[:n])
		if _, err := tx.ExecContext(ctx, sql, args...); err != nil {
			// SQLite's message, whichever Go driver carries it.
			if strings.Contains(err.Error(), "UNIQUE constraint failed: "+t.Name+".id") {
				return driverkit.DuplicateID(err, true, "", t, rows[:n])
			}
			if t.Schema == "public" {
				// PostgreSQL's default schema, configured by habit.
				return fmt.Errorf("%w (SQLite's database is %q: set outbox.Config.Schema to outboxsqlite.Schema)", err, Schema)
			}
			return err
		}
		rows = rows[n:]
	}
	return nil
}

// statement returns the INSERT of rows into t and its arguments. The
// deliver_at column is written only when some row has a DeliverAt, so the
// statement of undelayed rows stays as it was.
func statement(t outboxdriver.Table, rows []outboxdriver.Row) (string, []any) {
	delayed := driverkit.Delayed(rows)
	cols, cl, tuple := 8, insertCols, `(?, ?, ?, ?, ?, ?, coalesce(?, '{}'), ?)`
	if delayed {
		cols, cl, tuple = 9, insertColsDelayed, `(?, ?, ?, ?, ?, ?, coalesce(?, '{}'), ?, ?)`
	}
	var b strings.Builder
	b.WriteString(`INSERT INTO `)
	b.WriteString(namesOf(t).Table)
	b.WriteString(` ` + cl + ` VALUES `)
	args := make([]any, 0, cols*len(rows))
	for i, r := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(tuple)
		args = append(args, r.ID, r.AggregateType, r.AggregateID, r.Type, text(r.Payload), blob(r.RawPayload), text(r.Headers), text([]byte(r.TraceContext)))
		if delayed {
			args = append(args, deliverAt(r.DeliverAt))
		}
	}
	return b.String(), args
}

// deliverAt is a DeliverAt in the format of the time columns (UTC, to the
// millisecond), rounded up to the millisecond so that the event is never
// due before its time; NULL for the zero time.
func deliverAt(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return driverkit.DeliverAtCeil(t, time.Millisecond).UTC().Format(timeFormat)
}

// text maps nil or empty to SQL NULL, anything else to TEXT.
func text(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return string(b)
}

// blob maps nil to SQL NULL, anything else (even empty) to a BLOB.
func blob(b []byte) any {
	if b == nil {
		return nil
	}
	return b
}

// DefaultSchema implements outboxdriver.SchemaDefaulter: with no schema
// configured, the outbox table is in SQLite's main database.
func (d *Driver) DefaultSchema() string { return Schema }

// Close does nothing: the pool is the caller's.
func (d *Driver) Close() error { return nil }
