package outboxsqlite

import (
	"context"
	"database/sql"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/sqlstore"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Driver is the outbox on one SQLite database file through database/sql
// on modernc.org/sqlite.
type Driver struct {
	pool driverkit.SQLPool
	console
}

// New returns the Driver of db, a pool from Open. It does no I/O, and it
// never closes db: that is the caller's. db may be nil for a program that
// only writes events inside its own transactions (WriteTx); every method
// that needs a connection of its own then fails. With no schema
// configured, the table is in SQLite's "main" database:
//
//	ob, err := outbox.New(outboxsqlite.New(db), nil) // main.outbox
func New(db *sql.DB) *Driver {
	p := driverkit.NewSQLPool("outboxsqlite", db)
	return &Driver{pool: p, console: sqlstore.New(dialect, p.Need)}
}

var (
	_ outboxdriver.Writer[*sql.Tx]     = (*Driver)(nil)
	_ outboxdriver.TxMigrator[*sql.Tx] = (*Driver)(nil)
	_ outboxdriver.Store               = (*Driver)(nil)
)

// Insert inserts rows in a transaction of its own on the Driver's pool.
func (d *Driver) Insert(ctx context.Context, t outboxdriver.Table, rows []outboxdriver.Row) error {
	return d.pool.InTx(ctx, func(tx *sql.Tx) error { return d.InsertTx(ctx, tx, t, rows) })
}
