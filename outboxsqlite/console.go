package outboxsqlite

import (
	"context"
	"database/sql"
	"strings"
	"time"

	"github.com/outboxkit/outbox/internal/migrations"
	"github.com/outboxkit/outbox/internal/sqlstore"
	"github.com/outboxkit/outbox/outboxdriver"
)

// console is the operators' side of the tables, shared with outboxmysql.
type console = sqlstore.Store

// consoleVersion is the schema version that adds the console's tables.
const consoleVersion = 2

// dialect is how package sqlstore speaks SQLite. Write transactions lock
// the database from their start (Open's _txlock=immediate), so no row
// locks are needed.
var dialect = sqlstore.Dialect{
	Driver: "outboxsqlite",
	Resolve: func(t outboxdriver.Table) (outboxdriver.Table, func(string) string, error) {
		t, err := table(t)
		if err != nil {
			return t, nil, err
		}
		return t, t.Qualified, nil
	},
	Now:        nowSQL,
	TimeText:   func(col string) string { return col },
	TimeArg:    func(t time.Time) any { return t.UTC().Format("2006-01-02 15:04:05.000") },
	NowMinusMS: `strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.3f seconds', -(? / 1000.0)))`,
	AgeSeconds: func(col string) string {
		return "((julianday('now') - julianday(" + col + ")) * 86400.0)"
	},
	InsertIgnore: "INSERT OR IGNORE",
	// AUTOINCREMENT keeps the highest position handed out.
	LastSeq: func(t outboxdriver.Table) (string, []any) {
		return `SELECT seq FROM ` + outboxdriver.QuoteIdent(t.Schema) + `.sqlite_sequence WHERE name = ?`, []any{t.Name}
	},
	NoTable: func(err error) bool {
		return strings.Contains(err.Error(), "no such table") || strings.Contains(err.Error(), "no such column")
	},
	Migrated: func(ctx context.Context, db *sql.DB, t outboxdriver.Table) (bool, error) { return migrated(ctx, db, t) },
	Latest:   func() int { return migrations.Latest(all()) },
}

// Pauses reads the pauses in force: one small query.
func (s *source) Pauses(ctx context.Context) ([]outboxdriver.Pause, error) {
	return sqlstore.Pauses(ctx, dialect, s.db, s.Table)
}

// Pauses reads the pauses in force through the batch's source: a claim
// on SQLite holds no connection while its events are published.
func (b *batch) Pauses(ctx context.Context) ([]outboxdriver.Pause, error) {
	return b.src.Pauses(ctx)
}

// ExcludeAggregateTypes leaves the events of types out of the next claims
// (the relay sets the paused ones), so that a paused backlog does not fill
// every batch while other events wait behind it.
func (s *source) ExcludeAggregateTypes(types []string) { s.exclude.Store(&types) }
