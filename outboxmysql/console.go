package outboxmysql

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outbox/internal/migrations"
	"github.com/outboxkit/outbox/internal/sqlstore"
	"github.com/outboxkit/outbox/outboxdriver"
)

// console is the operators' side of the tables, shared with outboxsqlite.
type console = sqlstore.Store

// consoleVersion is the schema version that adds the console's tables.
const consoleVersion = 3

// dialect is how package sqlstore speaks MySQL and MariaDB.
var dialect = sqlstore.Dialect{
	Driver: "outboxmysql",
	Resolve: func(t outboxdriver.Table) (outboxdriver.Table, func(string) string, error) {
		if err := validate(t); err != nil {
			return t, nil, err
		}
		return t, qualifier(t), nil
	},
	Now:        "UTC_TIMESTAMP(6)",
	TimeText:   func(col string) string { return "DATE_FORMAT(" + col + ", '%Y-%m-%d %H:%i:%s.%f')" },
	TimeArg:    func(t time.Time) any { return t.UTC().Format("2006-01-02 15:04:05.000000") },
	NowMinusMS: "(UTC_TIMESTAMP(6) - INTERVAL (? * 1000) MICROSECOND)",
	AgeSeconds: func(col string) string {
		return "(TIMESTAMPDIFF(MICROSECOND, " + col + ", UTC_TIMESTAMP(6)) / 1000000.0)"
	},
	ForUpdate:    " FOR UPDATE",
	InsertIgnore: "INSERT IGNORE",
	// The table's next AUTO_INCREMENT less one (MySQL 8 caches it for
	// information_schema_stats_expiry seconds; MariaDB reads it live).
	LastSeq: func(t outboxdriver.Table) (string, []any) {
		return `SELECT AUTO_INCREMENT - 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?`,
			[]any{schemaArg(t), t.Name}
	},
	NoTable: func(err error) bool {
		var my *mysql.MySQLError
		return errors.As(err, &my) && (my.Number == 1146 || my.Number == 1054 || my.Number == 1305) // no such table, unknown column, no such routine
	},
	Migrated:  migrated,
	Latest:    func() int { return migrations.Latest(all()) },
	PruneProc: func(t outboxdriver.Table) string { return qualifier(t)("_audit_prune") },
	NoProc: func(err error) bool {
		var my *mysql.MySQLError
		return errors.As(err, &my) && my.Number == 1305 // does not exist
	},
	Denied: func(err error) bool {
		var my *mysql.MySQLError
		return errors.As(err, &my) && (my.Number == 1370 || my.Number == 1142) // routine or table command denied
	},
	TxOptions: &sql.TxOptions{Isolation: sql.LevelReadCommitted},
}

// Pauses reads the pauses in force: one small query.
func (s *source) Pauses(ctx context.Context) ([]outboxdriver.Pause, error) {
	return sqlstore.Pauses(ctx, dialect, s.db, s.Table)
}

// Pauses reads the pauses in force in the claim's transaction
// (outboxdriver.PauseReader): the relay reads them before it publishes the
// batch, and needs no second connection of the pool for it.
func (b *batch) Pauses(ctx context.Context) ([]outboxdriver.Pause, error) {
	if b.tx == nil {
		return b.src.Pauses(ctx)
	}
	return sqlstore.Pauses(ctx, dialect, b.tx, b.src.Table)
}

// ExcludeAggregateTypes leaves the events of types out of the next claims
// (the relay sets the paused ones), so that a paused backlog does not fill
// every batch while other events wait behind it.
func (s *source) ExcludeAggregateTypes(types []string) { s.exclude.Store(&types) }
