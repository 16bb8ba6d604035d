package outboxpgx

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Querier runs queries: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ErrNotMigrated is returned by Status for a table that does not exist yet.
var ErrNotMigrated = fmt.Errorf("outbox table not found: run `outbox migrate` (or outboxpgx.Migrate) first")

// Status reports the backlog, the age of the oldest unpublished event and
// the dead letters of table t.
func Status(ctx context.Context, db Querier, t outboxdriver.Table) (outboxdriver.Status, error) {
	t = t.WithDefaults()
	st := outboxdriver.Status{Table: t, LatestSchemaVersion: pgschema.Latest()}
	if err := t.Validate(); err != nil {
		return st, fmt.Errorf("outboxpgx: %w", err)
	}
	n := pgschema.NamesOf(t)
	var exists bool
	if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL`, n.Table, n.Migrations).Scan(&exists); err != nil {
		return st, fmt.Errorf("outboxpgx: status of %s: %w", t, err)
	}
	if !exists {
		return st, fmt.Errorf("outboxpgx: %s: %w", t, ErrNotMigrated)
	}
	var ageSeconds float64
	err := db.QueryRow(ctx, `SELECT
    (SELECT count(*) FROM `+n.Table+` WHERE published_at IS NULL),
    (SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 FROM `+n.Table+` WHERE published_at IS NULL),
    (SELECT count(*) FROM `+n.Table+` WHERE published_at IS NOT NULL),
    (SELECT count(*) FROM `+n.DeadLetter+`),
    (SELECT coalesce(max(version), 0) FROM `+n.Migrations+`)`).
		Scan(&st.Backlog, &ageSeconds, &st.Published, &st.DeadLetters, &st.SchemaVersion)
	if err != nil {
		return st, fmt.Errorf("outboxpgx: status of %s: %w", t, err)
	}
	if ageSeconds > 0 {
		st.OldestUnpublishedAge = time.Duration(ageSeconds * float64(time.Second))
	}
	return st, nil
}
