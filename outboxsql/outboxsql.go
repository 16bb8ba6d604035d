package outboxsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/migrations"
	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Driver writes events to a PostgreSQL database through database/sql.
type Driver struct {
	pool driverkit.SQLPool
	// messages writes events as logical decoding messages (WithMessages),
	// insertDelete as rows deleted again at once (WithInsertDelete).
	messages, insertDelete bool
	// wake is the view of whether relays wait, for tables whose writers
	// send the wake-up (outboxdriver.WakeupsWriters); nil without a db.
	wake *pgschema.WakeView
}

// New returns the Driver of the database db connects to. It does no I/O,
// and it never closes db: that is the caller's. db may be nil for a
// program that only writes inside its own transactions (WriteTx,
// MigrateTx).
//
// On a table whose writers wake idle relays (outbox migrate --wakeups
// writers, docs/relay.md) the Driver reads, on db and in the background,
// whether a relay waits, and adds the wake-up to its INSERT while one
// does; a Driver without a db sends none there.
func New(db *sql.DB, opts ...Option) *Driver {
	d := &Driver{pool: driverkit.NewSQLPool("outboxsql", db)}
	for _, o := range opts {
		o(d)
	}
	if db != nil && !d.messages && !d.insertDelete {
		d.wake = pgschema.NewWakeView(func(ctx context.Context, t outboxdriver.Table) (awake, now int64, trigger bool, err error) {
			err = db.QueryRowContext(ctx, pgschema.WakeViewSQL, pgschema.WakeViewArgs(t)...).Scan(&awake, &now, &trigger)
			return awake, now, trigger, err
		})
	}
	return d
}

var (
	_ outboxdriver.Writer[*sql.Tx]     = (*Driver)(nil)
	_ outboxdriver.TxMigrator[*sql.Tx] = (*Driver)(nil)
	_ outboxdriver.Pooled              = (*Driver)(nil)
)

// DefaultSchema is "public": the schema of a table whose configuration
// names none.
func (d *Driver) DefaultSchema() string { return outboxdriver.DefaultSchema }

// InsertTx inserts rows within tx with one multi-row INSERT (one round
// trip); in message or insert + delete mode, with one call of the table's
// function.
func (d *Driver) InsertTx(ctx context.Context, tx *sql.Tx, t outboxdriver.Table, rows []outboxdriver.Row) error {
	if tx == nil {
		return errors.New("transaction is nil")
	}
	if len(rows) == 0 {
		return nil
	}
	q, args, err := d.write(t, rows)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, q, args...)
	return pgschema.NoSlot(pgschema.DuplicateID(err, t, rows))
}

// Insert inserts rows with one statement (one transaction) on the
// Driver's database.
func (d *Driver) Insert(ctx context.Context, t outboxdriver.Table, rows []outboxdriver.Row) error {
	db, err := d.pool.Need()
	if err != nil {
		return err
	}
	if len(rows) == 0 {
		return nil
	}
	q, args, err := d.write(t, rows)
	if err != nil {
		return err
	}
	_, err = db.ExecContext(ctx, q, args...)
	return pgschema.NoSlot(pgschema.DuplicateID(err, t, rows))
}

// write returns the statement that writes rows into t in the Driver's
// write mode, and its arguments.
func (d *Driver) write(t outboxdriver.Table, rows []outboxdriver.Row) (string, []any, error) {
	if err := driverkit.CheckWriteMode(d.messages || d.insertDelete, rows); err != nil {
		return "", nil, err
	}
	switch {
	case d.messages:
		q, args := pgschema.EmitCall(t, rows, pgschema.Scalars)
		return q, args, nil
	case d.insertDelete:
		q, args := pgschema.WriteCall(t, rows, pgschema.Scalars)
		return q, args, nil
	}
	q, args := statement(t, rows, d.wake != nil && d.wake.Wake(t))
	return q, args, nil
}

// statement returns the multi-row INSERT of rows into t; with the
// deliver_at column only when some row has a DeliverAt, so that the
// statement of undelayed rows stays as it was; with wake, in the form that
// also sends the table's wake-up (pgschema.WakeCTE).
func statement(t outboxdriver.Table, rows []outboxdriver.Row, wake bool) (string, []any) {
	delayed := driverkit.Delayed(rows)
	cols := 8
	var b strings.Builder
	if wake {
		b.WriteString(pgschema.WakeCTE(t))
	}
	b.WriteString(`INSERT INTO `)
	b.WriteString(pgschema.NamesOf(t).Table)
	b.WriteString(` (id, aggregatetype, aggregateid, type, payload, payload_raw, headers, tracingspancontext`)
	if delayed {
		cols = 9
		b.WriteString(`, deliver_at`)
	}
	b.WriteString(`) `)
	if wake {
		b.WriteString(`SELECT v.* FROM wake, (`)
	}
	b.WriteString(`VALUES `)
	args := make([]any, 0, cols*len(rows))
	for i, r := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		n := i * cols
		p := func(k int) string { return "$" + strconv.Itoa(n+k) }
		b.WriteString("(" + p(1) + "::uuid, " + p(2) + ", " + p(3) + ", " + p(4) + ", " + p(5) + "::json, " + p(6) + "::bytea, coalesce(" + p(7) + "::jsonb, '{}'::jsonb), " + p(8))
		args = append(args, r.ID, r.AggregateType, r.AggregateID, r.Type, nullText(r.Payload), nullBytes(r.RawPayload), nullText(r.Headers), nullText([]byte(r.TraceContext)))
		if delayed {
			b.WriteString(", " + p(9) + "::timestamptz")
			var at any
			if !r.DeliverAt.IsZero() {
				at = driverkit.DeliverAtCeil(r.DeliverAt, time.Microsecond)
			}
			args = append(args, at)
		}
		b.WriteString(")")
	}
	if wake {
		b.WriteString(`) AS v`)
	}
	return b.String(), args
}

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

// LatestVersion is the newest schema version this driver knows.
func (d *Driver) LatestVersion() int { return pgschema.Latest() }

// Migrate creates or upgrades the outbox table t in one transaction on the
// Driver's database and returns the versions it applied; a second run
// applies none. opts may be nil.
//
// With opts.CDC, or on a Driver in message or insert + delete mode
// (WithMessages, WithInsertDelete), whose writes need it, it then also
// makes what log tailing streams from when missing: the publication and
// the replication slot (outboxdriver.MigrateOptions.CDC), which keeps WAL
// until a relay consumes it or `outbox cdc drop` drops it.
func (d *Driver) Migrate(ctx context.Context, t outboxdriver.Table, opts *outboxdriver.MigrateOptions) ([]int, error) {
	vs, err := d.inTx(ctx, t, "migrate", func(tx *sql.Tx, t outboxdriver.Table) ([]int, error) { return d.migrateTx(ctx, tx, t, opts) })
	if err != nil {
		return nil, err
	}
	db, _ := d.pool.Need() // inTx had it
	if err := pgschema.MigrateSlot(ctx, migrations.SQLTx(db), t, opts, d.messages || d.insertDelete); err != nil {
		return vs, fmt.Errorf("outboxsql: migrate %s: log tailing: %w", t.WithDefaults(), err)
	}
	return vs, nil
}

// MigrateTx is Migrate inside the caller's transaction tx, which the
// caller commits. It makes no replication slot, not even for a Driver in
// message or insert + delete mode (MigrateOptions.CDC is refused): make it
// after the commit with Migrate or `outbox migrate --cdc`.
func (d *Driver) MigrateTx(ctx context.Context, tx *sql.Tx, t outboxdriver.Table, opts *outboxdriver.MigrateOptions) ([]int, error) {
	if opts != nil && opts.CDC {
		return nil, fmt.Errorf("outboxsql: migrate %s: %w", t.WithDefaults(), pgschema.ErrSlotInTx)
	}
	return d.migrateTx(ctx, tx, t, opts)
}

func (d *Driver) migrateTx(ctx context.Context, tx *sql.Tx, t outboxdriver.Table, opts *outboxdriver.MigrateOptions) ([]int, error) {
	t = t.WithDefaults()
	o, err := driverkit.ResolveMigrate(opts)
	if err == nil {
		err = t.Validate()
	}
	if err != nil {
		return nil, fmt.Errorf("outboxsql: migrate %s: %w", t, err)
	}
	vs, err := pgschema.Up(ctx, migrations.SQLTx(tx), t, o)
	if err != nil {
		return nil, fmt.Errorf("outboxsql: migrate %s: %w", t, err)
	}
	return vs, nil
}

// MigrateDown reverts t to version target in one transaction (0 drops its
// tables and their data) and returns the versions it reverted.
func (d *Driver) MigrateDown(ctx context.Context, t outboxdriver.Table, target int) ([]int, error) {
	return d.inTx(ctx, t, "revert", func(tx *sql.Tx, t outboxdriver.Table) ([]int, error) {
		vs, err := pgschema.Down(ctx, migrations.SQLTx(tx), t, target)
		if err != nil {
			return nil, fmt.Errorf("outboxsql: revert %s: %w", t, err)
		}
		return vs, nil
	})
}

func (d *Driver) inTx(ctx context.Context, t outboxdriver.Table, what string, fn func(*sql.Tx, outboxdriver.Table) ([]int, error)) ([]int, error) {
	db, err := d.pool.Need()
	if err != nil {
		return nil, err
	}
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("outboxsql: %w", err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("outboxsql: %s %s: %w", what, t, err)
	}
	defer tx.Rollback()
	vs, err := fn(tx, t)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("outboxsql: %s %s: commit: %w", what, t, err)
	}
	return vs, nil
}

// Close does nothing: the pool is the caller's.
func (d *Driver) Close() error { return nil }
