// Package drivertest is the conformance suite every outbox driver passes:
// the PostgreSQL drivers (pgx, database/sql), MySQL/MariaDB and SQLite run
// the same tests against their real database. A driver's test calls Run
// with a Harness.
package drivertest

import (
	"context"
	"testing"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Harness adapts one driver and its database to the suite.
type Harness struct {
	// Name names the driver in failures ("pgx", "mysql", ...).
	Name string
	// Store is the driver's Store on the database under test.
	Store outboxdriver.Store
	// NewTable returns a table name no other test uses. The suite
	// migrates it and reverts it (MigrateDown to 0) at the test's end; the
	// harness drops whatever else it created for it (a schema) itself.
	NewTable func(t testing.TB) outboxdriver.Table
	// Write inserts events into t through the driver's Writer inside one
	// transaction of the driver's own kind, then commits it, or rolls it
	// back when commit is false.
	Write func(ctx context.Context, t outboxdriver.Table, commit bool, events ...outbox.Event) error
	// ExecInsert inserts one event into t with plain SQL in its own
	// transaction, as a program that does not use this module would:
	// only the columns of the table contract (id, aggregatetype,
	// aggregateid, type, payload), so the database fills in the rest.
	ExecInsert func(ctx context.Context, t outboxdriver.Table, id, aggregateType, aggregateID, typ, payloadJSON string) error
	// SingleRelay is set by a driver that serves one relay process per
	// table at a time (SQLite): the suite then leaves out the cases with
	// several relays competing for partitions, and says so in the log.
	SingleRelay bool
}

// Run runs the whole suite against h.
func Run(t *testing.T, h Harness) {
	t.Helper()
	_ = context.Background
	panic("drivertest: being written")
}
