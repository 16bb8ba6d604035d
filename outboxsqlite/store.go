package outboxsqlite

import (
	"context"
	"database/sql"
	"errors"

	"github.com/outboxkit/outbox/outboxdriver"
)

// Driver is the outbox on one SQLite database file through database/sql
// on modernc.org/sqlite.
type Driver struct {
	db *sql.DB
}

// New returns the Driver of db, a pool from Open. It does no I/O, and it
// never closes db: that is the caller's. db may be nil for a program that
// only writes events inside its own transactions (WriteTx); every method
// that needs a connection of its own then fails. With no schema
// configured, the table is in SQLite's "main" database:
//
//	ob, err := outbox.New(outboxsqlite.New(db), nil) // main.outbox
func New(db *sql.DB) *Driver { return &Driver{db: db} }

var (
	_ outboxdriver.Writer[*sql.Tx]     = (*Driver)(nil)
	_ outboxdriver.TxMigrator[*sql.Tx] = (*Driver)(nil)
	_ outboxdriver.Store               = (*Driver)(nil)
	_ outboxdriver.Inserter            = (*Driver)(nil)
)

// errNoDB is returned by the methods that need the Driver's own pool.
var errNoDB = errors.New("outboxsqlite: this Driver has no database: create it with outboxsqlite.New(db)")

// DB is the pool the Driver was made with (nil if none).
func (d *Driver) DB() *sql.DB { return d.db }

// Close does nothing: the pool is the caller's.
func (d *Driver) Close() error { return nil }

// Insert inserts rows in a transaction of its own on the Driver's pool.
func (d *Driver) Insert(ctx context.Context, t outboxdriver.Table, rows []outboxdriver.Row) error {
	if d.db == nil {
		return errNoDB
	}
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := d.InsertTx(ctx, tx, t, rows); err != nil {
		return err
	}
	return tx.Commit()
}
