package outboxmysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/sqlstore"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Driver is the outbox on one MySQL or MariaDB server through
// database/sql.
type Driver struct {
	pool driverkit.SQLPool
	console
}

// New returns the Driver of the database db connects to (opened with
// github.com/go-sql-driver/mysql; see DSN). It does no I/O, and it never
// closes db: that is the caller's. db may be nil for a program that only
// writes events inside its own transactions (WriteTx); every method that
// needs a connection of its own then fails.
func New(db *sql.DB) *Driver {
	p := driverkit.NewSQLPool("outboxmysql", db)
	return &Driver{pool: p, console: sqlstore.New(dialect, p.Need)}
}

var (
	_ outboxdriver.Writer[*sql.Tx] = (*Driver)(nil)
	_ outboxdriver.Store           = (*Driver)(nil)
)

// maxTextLen is the length, in characters, of the VARCHAR columns
// aggregatetype, aggregateid and type.
const maxTextLen = 255

// maxRowsPerInsert bounds one INSERT's rows, so that its placeholders stay
// under the 65,535 a prepared statement may have.
const maxRowsPerInsert = 5000

// InsertTx inserts rows within tx with one multi-row INSERT (one round trip;
// more than 5,000 rows go in INSERTs of 5,000). A row whose aggregate type,
// aggregate id or type is longer than the 255 characters the columns hold
// is refused before any SQL runs, with an error wrapping
// outboxdriver.ErrInvalidEvent, so a server not in strict mode never truncates
// one (which would merge two aggregates).
func (d *Driver) InsertTx(ctx context.Context, tx *sql.Tx, t outboxdriver.Table, rows []outboxdriver.Row) error {
	if tx == nil {
		return errors.New("transaction is nil")
	}
	return insert(ctx, tx, t, rows)
}

// Insert inserts rows in a transaction of its own on the Driver's
// database.
func (d *Driver) Insert(ctx context.Context, t outboxdriver.Table, rows []outboxdriver.Row) error {
	return d.pool.InTx(ctx, func(tx *sql.Tx) error { return insert(ctx, tx, t, rows) })
}

func insert(ctx context.Context, tx *sql.Tx, t outboxdriver.Table, rows []outboxdriver.Row) error {
	if err := validate(t); err != nil {
		return err
	}
	for i, r := range rows {
		for _, f := range []struct{ name, v string }{{"AggregateType", r.AggregateType}, {"AggregateID", r.AggregateID}, {"Type", r.Type}} {
			if utf8.RuneCountInString(f.v) > maxTextLen {
				return fmt.Errorf("%w: event %d: %s has more than the %d characters MySQL stores", outboxdriver.ErrInvalidEvent, i, f.name, maxTextLen)
			}
		}
	}
	table := namesOf(t).Table
	for len(rows) > 0 {
		n := min(len(rows), maxRowsPerInsert)
		q, args := insertStatement(table, rows[:n])
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			var my *mysql.MySQLError
			dup := errors.As(err, &my) && my.Number == 1062 && strings.Contains(my.Message, "by_id")
			return driverkit.DuplicateID(err, dup, err.Error(), t, rows[:n])
		}
		rows = rows[n:]
	}
	return nil
}

// insertStatement returns one multi-row INSERT of rows into table. The
// deliver_at column is written only when some row has a DeliverAt, so the
// statement of undelayed rows stays as it was.
func insertStatement(table string, rows []outboxdriver.Row) (string, []any) {
	delayed := driverkit.Delayed(rows)
	cols, tuple := 8, "(?, ?, ?, ?, ?, ?, ?, ?)"
	var b strings.Builder
	b.WriteString(`INSERT INTO `)
	b.WriteString(table)
	b.WriteString(` (id, aggregatetype, aggregateid, type, payload, payload_raw, headers, tracingspancontext`)
	if delayed {
		cols, tuple = 9, "(?, ?, ?, ?, ?, ?, ?, ?, ?)"
		b.WriteString(`, deliver_at`)
	}
	b.WriteString(`) VALUES `)
	args := make([]any, 0, cols*len(rows))
	for i, r := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(tuple)
		headers := "{}"
		if len(r.Headers) > 0 {
			headers = string(r.Headers)
		}
		args = append(args, r.ID, r.AggregateType, r.AggregateID, r.Type, nullText(r.Payload), nullBytes(r.RawPayload), headers, nullText([]byte(r.TraceContext)))
		if delayed {
			args = append(args, deliverAt(r.DeliverAt))
		}
	}
	return b.String(), args
}

// deliverAt is a DeliverAt as the text of a DATETIME(6) in UTC (text, so
// that the DSN's loc setting cannot shift it), rounded up to the
// microsecond so that the event is never due before its time; NULL for
// the zero time.
func deliverAt(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return driverkit.DeliverAtCeil(t, time.Microsecond).UTC().Format("2006-01-02 15:04:05.000000")
}

// nullText passes JSON and text as a string (MySQL refuses JSON from a
// binary string), nil or empty as NULL.
func nullText(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return string(b)
}

func nullBytes(b []byte) any {
	if b == nil {
		return nil
	}
	return b
}

// DefaultSchema implements outboxdriver.SchemaDefaulter: with no schema
// configured, the outbox table is in the connection's current database.
func (d *Driver) DefaultSchema() string { return "" }

// Close does nothing: the pool is the caller's.
func (d *Driver) Close() error { return nil }
