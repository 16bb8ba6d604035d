package outboxpgx

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/outboxdriver"
)

// Tx is a transaction whose events travel with its COMMIT: events written
// to it with outbox.Outbox.WriteTx are kept, and Commit sends their INSERT
// in the same round trip as the COMMIT itself, so they cost the
// transaction no round trip of their own, whatever the transaction does
// before (statements whose results it uses, such as an INSERT ...
// RETURNING id that names the aggregate). An INSERT that fails (a
// constraint or trigger of the table refuses it) therefore fails Commit, not WriteTx, and nothing is
// committed. Tx is a pgx.Tx: pass it to code that takes one. Its other
// methods are pgx's; Commit and Rollback also return the connection to the
// pool. A Tx is not safe for concurrent use, as no pgx.Tx is.
type Tx struct {
	pgx.Tx
	conn *pgxpool.Conn
	drv  *Driver
	// kept holds the events written so far, per table, in the order the
	// tables were first written; Commit sends one INSERT per table.
	kept []keptRows
	n    int // events kept
	done bool
}

type keptRows struct {
	table outboxdriver.Table
	rows  []outboxdriver.Row
}

var _ pgx.Tx = (*Tx)(nil)

// Begin starts a transaction with opts on a connection of the Driver's
// pool. Events written to it with outbox.Outbox.WriteTx go with its
// Commit.
func (d *Driver) Begin(ctx context.Context, opts pgx.TxOptions) (*Tx, error) {
	if d.pool == nil {
		return nil, errNoPool
	}
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("outboxpgx: begin: %w", err)
	}
	tx, err := conn.BeginTx(ctx, opts)
	if err != nil {
		conn.Release()
		return nil, fmt.Errorf("outboxpgx: begin: %w", err)
	}
	return &Tx{Tx: tx, conn: conn, drv: d}, nil
}

// keep keeps rows of table for Commit.
func (t *Tx) keep(table outboxdriver.Table, rows []outboxdriver.Row) error {
	if t.done {
		return pgx.ErrTxClosed
	}
	t.n += len(rows)
	for i := range t.kept {
		if t.kept[i].table == table {
			t.kept[i].rows = append(t.kept[i].rows, rows...)
			return nil
		}
	}
	t.kept = append(t.kept, keptRows{table: table, rows: slices.Clone(rows)})
	return nil
}

// Commit writes the kept events and commits, in one round trip. The
// events exist for the relay if and only if it returns nil. If the
// transaction had already failed (a statement of it returned an error),
// it is rolled back and Commit returns pgx.ErrTxCommitRollback, as pgx's
// does. Commit after Commit or Rollback returns pgx.ErrTxClosed.
func (t *Tx) Commit(ctx context.Context) error {
	if t.done {
		return pgx.ErrTxClosed
	}
	t.done = true
	defer t.release(ctx)
	if t.conn.Conn().PgConn().TxStatus() == 'E' {
		return pgx.ErrTxCommitRollback // release rolls it back
	}
	b := &pgx.Batch{}
	for _, k := range t.kept {
		sql, args := t.drv.statement(k.table, k.rows)
		b.Queue(sql, args...)
	}
	commit := b.Queue(`commit`)
	var tag string
	commit.Exec(func(ct pgconn.CommandTag) error { tag = ct.String(); return nil })
	// Sent on the connection, not through t.Tx: pgx's transaction would
	// otherwise want a COMMIT of its own, one more round trip.
	if err := t.conn.SendBatch(ctx, b).Close(); err != nil {
		// The events' INSERT failed (and the COMMIT behind it was
		// skipped), or the COMMIT did: nothing was committed, unless the
		// connection broke with the COMMIT in flight.
		return fmt.Errorf("outboxpgx: commit with %d events: %w", t.n, writeFailed(err, t.kept...))
	}
	if tag == "ROLLBACK" {
		return pgx.ErrTxCommitRollback
	}
	return nil
}

// Rollback rolls the transaction back and drops the kept events.
// Rollback after Commit or Rollback returns pgx.ErrTxClosed.
func (t *Tx) Rollback(ctx context.Context) error {
	if t.done {
		return pgx.ErrTxClosed
	}
	t.done = true
	err := t.Tx.Rollback(ctx)
	t.release(ctx)
	return err
}

// release ends any transaction still open on the connection and returns
// it to the pool (which closes it if that failed).
func (t *Tx) release(ctx context.Context) {
	t.kept, t.n = nil, 0
	if t.conn.Conn().PgConn().TxStatus() != 'I' {
		_, _ = t.conn.Exec(context.WithoutCancel(ctx), `rollback`)
	}
	t.conn.Release()
}

// The statements of pgx.Tx, refused once the transaction ended: the
// connection may serve someone else by then. (pgx's own transaction is
// left open in pgx's eyes by Commit, which sent the COMMIT itself.)

// Begin starts a nested transaction (a savepoint), as pgx's does.
func (t *Tx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.done {
		return nil, pgx.ErrTxClosed
	}
	return t.Tx.Begin(ctx)
}

// Exec runs sql in the transaction, as pgx's does.
func (t *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.done {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return t.Tx.Exec(ctx, sql, args...)
}

// Query runs sql in the transaction, as pgx's does.
func (t *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.done {
		return nil, pgx.ErrTxClosed
	}
	return t.Tx.Query(ctx, sql, args...)
}

// QueryRow runs sql in the transaction, as pgx's does.
func (t *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.done {
		return closedRow{}
	}
	return t.Tx.QueryRow(ctx, sql, args...)
}

// SendBatch sends b in the transaction, as pgx's does.
func (t *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.done {
		return closedResults{}
	}
	return t.Tx.SendBatch(ctx, b)
}

// CopyFrom copies rows into a table in the transaction, as pgx's does.
func (t *Tx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if t.done {
		return 0, pgx.ErrTxClosed
	}
	return t.Tx.CopyFrom(ctx, table, columns, src)
}

// Prepare prepares a statement on the transaction's connection, as pgx's
// does.
func (t *Tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if t.done {
		return nil, pgx.ErrTxClosed
	}
	return t.Tx.Prepare(ctx, name, sql)
}

type closedRow struct{}

func (closedRow) Scan(...any) error { return pgx.ErrTxClosed }

type closedResults struct{}

func (closedResults) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, pgx.ErrTxClosed }
func (closedResults) Query() (pgx.Rows, error)         { return nil, pgx.ErrTxClosed }
func (closedResults) QueryRow() pgx.Row                { return closedRow{} }
func (closedResults) Close() error                     { return pgx.ErrTxClosed }
func (closedResults) Tx() pgx.Tx                       { return nil }
