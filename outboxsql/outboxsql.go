// Package outboxsql is the PostgreSQL driver of the outbox for database/sql:
// it writes events inside a *sql.Tx opened on any PostgreSQL driver
// (pgx's stdlib, lib/pq) and migrates the schema. The relay itself runs on
// outboxpgx.
package outboxsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/outboxkit/outbox/internal/migrations"
	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Driver writes events through database/sql.
type Driver struct{}

// New returns a Driver. It holds no connection.
func New() *Driver { return &Driver{} }

var _ outboxdriver.Writer[*sql.Tx] = (*Driver)(nil)

// InsertTx inserts rows within tx with one multi-row INSERT (one round trip).
func (d *Driver) InsertTx(ctx context.Context, tx *sql.Tx, t outboxdriver.Table, rows []outboxdriver.Row) error {
	if tx == nil {
		return errors.New("transaction is nil")
	}
	var b strings.Builder
	b.WriteString(`INSERT INTO `)
	b.WriteString(pgschema.NamesOf(t).Table)
	b.WriteString(` (id, aggregatetype, aggregateid, type, payload, payload_raw, headers, tracingspancontext) VALUES `)
	args := make([]any, 0, 8*len(rows))
	for i, r := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		n := i * 8
		p := func(k int) string { return "$" + strconv.Itoa(n+k) }
		b.WriteString("(" + p(1) + "::uuid, " + p(2) + ", " + p(3) + ", " + p(4) + ", " + p(5) + "::jsonb, " + p(6) + "::bytea, coalesce(" + p(7) + "::jsonb, '{}'::jsonb), " + p(8) + ")")
		args = append(args, r.ID, r.AggregateType, r.AggregateID, r.Type, nullText(r.Payload), nullBytes(r.RawPayload), nullText(r.Headers), nullText([]byte(r.TraceContext)))
	}
	_, err := tx.ExecContext(ctx, b.String(), args...)
	return err
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

// Migrate creates or upgrades the outbox table t in one transaction and
// returns the versions it applied; a second run applies none. opts may be
// nil.
func Migrate(ctx context.Context, db *sql.DB, t outboxdriver.Table, opts *outboxdriver.MigrateOptions) ([]int, error) {
	o := outboxdriver.MigrateOptions{}
	if opts != nil {
		o = *opts
	}
	return inTx(ctx, db, t, "migrate", func(tx pgschema.Tx, t outboxdriver.Table) ([]int, error) { return pgschema.Up(ctx, tx, t, o) })
}

// MigrateDown reverts t to version target in one transaction (0 drops its
// tables and their data) and returns the versions it reverted.
func MigrateDown(ctx context.Context, db *sql.DB, t outboxdriver.Table, target int) ([]int, error) {
	return inTx(ctx, db, t, "revert", func(tx pgschema.Tx, t outboxdriver.Table) ([]int, error) { return pgschema.Down(ctx, tx, t, target) })
}

func inTx(ctx context.Context, db *sql.DB, t outboxdriver.Table, what string, fn func(pgschema.Tx, outboxdriver.Table) ([]int, error)) ([]int, error) {
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("outboxsql: %w", err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("outboxsql: %s %s: %w", what, t, err)
	}
	defer tx.Rollback()
	vs, err := fn(migrations.SQLTx(tx), t)
	if err != nil {
		return nil, fmt.Errorf("outboxsql: %s %s: %w", what, t, err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("outboxsql: %s %s: commit: %w", what, t, err)
	}
	return vs, nil
}
