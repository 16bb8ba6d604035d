package outboxpgx

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// fail wraps err of what ("list dead letters of") on t: the one place the
// Store's methods say why they failed. When PostgreSQL reports a missing
// schema, table, column or function, fail reads t's schema version: a
// table never migrated wraps outboxdriver.ErrNotMigrated, one at an older
// version says to migrate it (driverkit.MissingSchema).
//
// It reads on the pool: call it once the failed statement's connection is
// back (after the transaction, never inside it).
func (d *Driver) fail(ctx context.Context, t outboxdriver.Table, what string, err error) error {
	if missingObject(err) && d.pool != nil {
		if v, verr := schemaVersion(ctx, d.pool, t); verr == nil {
			if e := driverkit.MissingSchema("outboxpgx", what, t, v, pgschema.Latest(), err); e != nil {
				return e
			}
		}
	}
	return fmt.Errorf("outboxpgx: %s %s: %w", what, t, err)
}

// missingObject reports PostgreSQL's errors of a schema, table, column
// or function that does not exist.
func missingObject(err error) bool {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return false
	}
	switch pg.Code {
	case "3F000", "42P01", "42703", "42883": // invalid_schema_name, undefined_table, undefined_column, undefined_function
		return true
	}
	return false
}

// rowQuerier is a pool or a transaction.
type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// queryRow is q as pgschema reads through it.
func queryRow(q rowQuerier) pgschema.QueryRow {
	return func(ctx context.Context, sql string, args []any, dest ...any) error {
		return q.QueryRow(ctx, sql, args...).Scan(dest...)
	}
}

// migrated reports whether the outbox table t and its migrations table
// exist.
func migrated(ctx context.Context, q rowQuerier, t outboxdriver.Table) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, pgschema.MigratedSQL, pgschema.MigratedArgs(t)...).Scan(&ok)
	return ok, err
}

// schemaVersion is the schema version of the outbox table t: 0 when it is
// not migrated.
func schemaVersion(ctx context.Context, q rowQuerier, t outboxdriver.Table) (int, error) {
	ok, err := migrated(ctx, q, t)
	if err != nil || !ok {
		return 0, err
	}
	var v int
	err = q.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+pgschema.NamesOf(t.WithDefaults()).Migrations).Scan(&v)
	return v, err
}
