// Package outboxpgx is the PostgreSQL driver of the outbox on pgx v5.
//
// One Driver per database, made with New(pool), is everything the outbox
// needs of PostgreSQL: the Writer behind outbox.New (WriteTx inside a
// pgx.Tx, Write in a transaction of its own, Queue on a pgx.Batch, Begin
// for a transaction whose events travel with its COMMIT), the Store of the
// command line (migrations, status, dead letters, audit) and the maker of
// the relay's polling source (NewSource: claims with FOR UPDATE SKIP
// LOCKED, wake-ups by LISTEN/NOTIFY). Log tailing through logical
// replication is package outboxpgx/cdc (docs/cdc.md); WithMessages and
// WithInsertDelete make a writer for its other write modes.
package outboxpgx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Driver is the outbox on one PostgreSQL database through pgx. The zero
// value is not usable; call New.
type Driver struct {
	pool *pgxpool.Pool
	// messages writes events as logical decoding messages (WithMessages),
	// insertDelete as rows deleted again at once (WithInsertDelete).
	messages, insertDelete bool
	// quiet turns the wake-up off for the writer's transaction
	// (WithoutWakeups).
	quiet bool

	// wake is the view of whether relays wait, for tables whose writers
	// send the wake-up (outboxdriver.WakeupsWriters); nil when the Driver
	// has no pool to read it with, or never wakes relays.
	wake *pgschema.WakeView

	mu    sync.Mutex
	stmts map[stmtKey]string // the INSERT's forms
}

// New returns the Driver of the database pool connects to. It does no
// I/O, and it never closes pool: that is the caller's. pool may be nil for
// a program that only writes events inside its own transactions
// (WriteTx); every method that needs a connection of its own then fails.
//
// On a table whose writers wake idle relays (outbox migrate --wakeups
// writers, docs/relay.md) the Driver reads, on its pool and in the
// background, whether a relay waits, and adds the wake-up to its INSERT
// while one does; a Driver without a pool sends none there.
func New(pool *pgxpool.Pool, opts ...Option) *Driver {
	d := &Driver{pool: pool, stmts: map[stmtKey]string{}}
	for _, o := range opts {
		o(d)
	}
	if pool != nil && !d.quiet && !d.messages && !d.insertDelete {
		d.wake = pgschema.NewWakeView(func(ctx context.Context, t outboxdriver.Table) (awake, now int64, trigger bool, err error) {
			err = pool.QueryRow(ctx, pgschema.WakeViewSQL, pgschema.WakeViewArgs(t)...).Scan(&awake, &now, &trigger)
			return awake, now, trigger, err
		})
	}
	return d
}

// Option configures a Driver.
type Option func(*Driver)

// WithMessages makes the Driver write events as transactional logical
// decoding messages instead of rows (message mode,
// docs/cdc.md#the-three-write-modes): WriteTx, Write, Queue and a Tx from
// Begin emit one pg_logical_emit_message(true, MessagePrefix(table),
// content) per event, with the content format of MessageVersion, through
// the table's function _cdc_emit (schema version 23). Nothing is
// inserted, so nothing is left to delete or vacuum; only a relay with
// --source cdc (package outboxpgx/cdc) reads such events, and only what is
// written while its replication slot exists: the function refuses, and the
// write fails wrapping ErrNoSlot, while no slot of the table's exists.
// Create it first (`outbox migrate --cdc`, or start the relay).
func WithMessages() Option { return func(d *Driver) { d.messages, d.insertDelete = true, false } }

// WithInsertDelete makes the Driver write each event as a row and delete
// it again in the same statement (insert + delete mode,
// docs/cdc.md#the-three-write-modes; Debezium's recommended pattern): the
// INSERT reaches the WAL, so a relay with --source cdc publishes it, and
// the table stays empty. The polling relay never sees such events: use it
// only with log tailing. It needs the table migrated to version 4; from
// version 23 the write fails, wrapping ErrNoSlot, while no replication
// slot of the table's exists.
func WithInsertDelete() Option { return func(d *Driver) { d.insertDelete, d.messages = true, false } }

// WithoutWakeups makes the Driver's inserts send no wake-up to an idle
// relay, for writers whose transactions end in PREPARE TRANSACTION
// (two-phase commit): PostgreSQL refuses to prepare a transaction that
// sent a NOTIFY. Each insert sets outbox.notify to off for the rest of
// its transaction, in the same statement (no extra round trip). An idle
// relay then finds the events at its next poll, within the relay's poll
// interval, instead of at once. Needs the table migrated to version 8;
// docs/databases.md (Two-phase commit) has the SQL for other writers.
func WithoutWakeups() Option { return func(d *Driver) { d.quiet = true } }

// quietCTE sets outbox.notify to off for the rest of the transaction; the
// statement that follows it selects FROM quiet.
const quietCTE = `WITH quiet AS MATERIALIZED (SELECT set_config('outbox.notify', 'off', true))
`

var (
	_ outboxdriver.Writer[pgx.Tx]     = (*Driver)(nil)
	_ outboxdriver.TxMigrator[pgx.Tx] = (*Driver)(nil)
	_ outboxdriver.Store              = (*Driver)(nil)
	_ outboxdriver.Queuer             = (*Driver)(nil)
)

// errNoPool is returned by the methods that need the Driver's own pool.
var errNoPool = errors.New("outboxpgx: this Driver has no pool: create it with outboxpgx.New(pool)")

// Pool is the pool the Driver was made with (nil if none).
func (d *Driver) Pool() *pgxpool.Pool { return d.pool }

// DefaultSchema is "public".
func (d *Driver) DefaultSchema() string { return outboxdriver.DefaultSchema }

// Close does nothing: the pool is the caller's.
func (d *Driver) Close() error { return nil }

const insertCols = `(id, aggregatetype, aggregateid, type, payload, payload_raw, headers, tracingspancontext)`

// stmtKey names one form of the INSERT: its table, how many rows (1; 0
// for several; -1 for rows of which some have a DeliverAt) and whether it
// sends the wake-up itself.
type stmtKey struct {
	t    outboxdriver.Table
	n    int
	wake bool
}

// sql returns the INSERT of n rows into t (n < 0: of rows of which some
// have a DeliverAt); with wake, the form that also sends the table's
// wake-up (pgschema.WakeCTE). The forms are cached: pgx prepares each
// once per connection, so an insert costs no parse or plan.
func (d *Driver) sql(t outboxdriver.Table, n int, wake bool) string {
	k := stmtKey{t: t, n: n, wake: wake}
	if n > 1 {
		k.n = 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if s, ok := d.stmts[k]; ok {
		return s
	}
	with, from := "", ""
	switch {
	case d.quiet:
		with, from = quietCTE, "quiet"
	case wake:
		with, from = pgschema.WakeCTE(t), "wake"
	}
	// The multi-row forms select from unnest, after the CTE if any.
	unnestFrom := "FROM "
	if from != "" {
		unnestFrom += from + ", "
	}
	table := pgschema.NamesOf(t).Table
	var s string
	switch {
	case k.n == 1 && from == "":
		s = `INSERT INTO ` + table + ` ` + insertCols + `
VALUES ($1::uuid, $2, $3, $4, $5::json, $6, coalesce($7::jsonb, '{}'::jsonb), $8)`
	case k.n == 1:
		s = with + `INSERT INTO ` + table + ` ` + insertCols + `
SELECT $1::uuid, $2, $3, $4, $5::json, $6::bytea, coalesce($7::jsonb, '{}'::jsonb), $8 FROM ` + from
	case k.n < 0:
		// Delayed rows: the form with deliver_at, kept apart so that the
		// others' statements stay as they were.
		s = with + `INSERT INTO ` + table + ` ` + strings.TrimSuffix(insertCols, ")") + `, deliver_at)
SELECT u.id, u.at, u.aid, u.ty, u.p::json, u.raw, coalesce(u.h::jsonb, '{}'::jsonb), u.tc, u.da
` + unnestFrom + `unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::text[], $8::text[], $9::timestamptz[])
  AS u(id, at, aid, ty, p, raw, h, tc, da)`
	default:
		s = with + `INSERT INTO ` + table + ` ` + insertCols + `
SELECT u.id, u.at, u.aid, u.ty, u.p::json, u.raw, coalesce(u.h::jsonb, '{}'::jsonb), u.tc
` + unnestFrom + `unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::text[], $8::text[])
  AS u(id, at, aid, ty, p, raw, h, tc)`
	}
	d.stmts[k] = s
	return s
}

// InsertTx inserts rows within tx in one round trip: one VALUES row for a
// single event, unnest over arrays for several. On a Tx from Begin, the
// INSERT is kept and sent with the COMMIT instead.
func (d *Driver) InsertTx(ctx context.Context, tx pgx.Tx, t outboxdriver.Table, rows []outboxdriver.Row) error {
	if tx == nil {
		return errors.New("transaction is nil")
	}
	if len(rows) == 0 {
		return nil
	}
	if err := d.check(rows); err != nil {
		return err
	}
	if ot, ok := tx.(*Tx); ok {
		return ot.keep(t, rows)
	}
	sql, args := d.statement(t, rows)
	_, err := tx.Exec(ctx, sql, args...)
	return writeFailed(err, keptRows{table: t, rows: rows})
}

// Insert inserts rows in a statement of its own on the Driver's pool (one
// statement is one transaction).
func (d *Driver) Insert(ctx context.Context, t outboxdriver.Table, rows []outboxdriver.Row) error {
	if d.pool == nil {
		return errNoPool
	}
	if len(rows) == 0 {
		return nil
	}
	if err := d.check(rows); err != nil {
		return err
	}
	sql, args := d.statement(t, rows)
	_, err := d.pool.Exec(ctx, sql, args...)
	return writeFailed(err, keptRows{table: t, rows: rows})
}

// QueueInsert queues the INSERT of rows on batch, which must be a
// *pgx.Batch: the events cost no round trip of their own when batch is
// sent inside the business transaction (tx.SendBatch).
func (d *Driver) QueueInsert(batch any, t outboxdriver.Table, rows []outboxdriver.Row) error {
	b, ok := batch.(*pgx.Batch)
	if !ok || b == nil {
		return fmt.Errorf("outboxpgx: queue events on a %T: want a *pgx.Batch", batch)
	}
	if len(rows) == 0 {
		return nil
	}
	if err := d.check(rows); err != nil {
		return err
	}
	sql, args := d.statement(t, rows)
	b.Queue(sql, args...)
	return nil
}

// check refuses rows this Driver's write mode cannot write: a delayed
// event needs a row that waits in the table.
func (d *Driver) check(rows []outboxdriver.Row) error {
	return driverkit.CheckWriteMode(d.messages || d.insertDelete, rows)
}

// statement returns the INSERT statement and its arguments for rows,
// which check accepted.
func (d *Driver) statement(t outboxdriver.Table, rows []outboxdriver.Row) (string, []any) {
	switch {
	case d.messages:
		return messageStatement(t, rows)
	case d.insertDelete:
		sql, args := insertDeleteStatement(t, rows)
		if d.quiet {
			sql = quietCTE + sql + ` FROM quiet`
		}
		return sql, args
	}
	delayed := driverkit.Delayed(rows)
	wake := d.wake != nil && d.wake.Wake(t)
	if len(rows) == 1 && !delayed {
		r := rows[0]
		return d.sql(t, 1, wake), []any{r.ID, r.AggregateType, r.AggregateID, r.Type, pgschema.NullText(r.Payload), r.RawPayload, pgschema.NullText(r.Headers), pgschema.NullText([]byte(r.TraceContext))}
	}
	n := len(rows)
	ids, ats, aids, tys := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	ps, hs, tcs := make([]*string, n), make([]*string, n), make([]*string, n)
	raws := make([][]byte, n)
	for i, r := range rows {
		ids[i], ats[i], aids[i], tys[i] = r.ID, r.AggregateType, r.AggregateID, r.Type
		ps[i], raws[i], hs[i], tcs[i] = pgschema.NullText(r.Payload), r.RawPayload, pgschema.NullText(r.Headers), pgschema.NullText([]byte(r.TraceContext))
	}
	if !delayed {
		return d.sql(t, n, wake), []any{pgschema.UUIDArray(ids), ats, aids, tys, ps, raws, hs, tcs}
	}
	das := make([]*time.Time, n)
	for i := range rows {
		if !rows[i].DeliverAt.IsZero() {
			at := driverkit.DeliverAtCeil(rows[i].DeliverAt, time.Microsecond)
			das[i] = &at
		}
	}
	return d.sql(t, -1, wake), []any{pgschema.UUIDArray(ids), ats, aids, tys, ps, raws, hs, tcs, das}
}
