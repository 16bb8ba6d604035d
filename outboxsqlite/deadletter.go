package outboxsqlite

import (
	"database/sql"

	"github.com/outboxkit/outbox/outboxdriver"
)

// table checks t and fills in the defaults, and returns the Driver's pool;
// it fails when the Driver has none.
func (d *Driver) table(t outboxdriver.Table) (outboxdriver.Table, *sql.DB, error) {
	t, err := table(t)
	if err != nil {
		return t, nil, err
	}
	db, err := d.pool.Need()
	return t, db, err
}
