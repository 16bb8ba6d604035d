package outboxmysql

import (
	"context"
	"crypto/sha1"
	"database/sql"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/migrations"
	"github.com/outboxkit/outbox/outboxdriver"
)

//go:embed migrations/*.sql
var files embed.FS

// all reads the embedded migrations; they are small.
func all() []migrations.Migration { return migrations.MustLoad(files, "migrations") }

// LatestVersion is the newest schema version this driver knows.
func (d *Driver) LatestVersion() int { return migrations.Latest(all()) }

// quoteIdent quotes a validated identifier with backticks.
func quoteIdent(s string) string {
	return "`" + strings.ReplaceAll(s, "`", "``") + "`"
}

// validate checks t's names. An empty schema is allowed: it means the
// connection's current database. MySQL's identifiers have at most 64
// characters; outboxdriver's limits (63, and 51 for the table so that
// <table>_dead_letter fits) are stricter, so every derived name fits.
func validate(t outboxdriver.Table) error {
	check := t
	if check.Schema == "" {
		check.Schema = "current_database"
	}
	if err := check.Validate(); err != nil {
		return fmt.Errorf("outboxmysql: %w", err)
	}
	return nil
}

// namesOf returns the quoted names of t's tables, qualified by the schema
// (the MySQL database) unless it is empty.
func namesOf(t outboxdriver.Table) driverkit.Names { return driverkit.NamesOf(qualifier(t)) }

// qualifier returns the function that quotes the name of t's companion
// table name+suffix, qualified by the schema unless it is empty.
func qualifier(t outboxdriver.Table) func(suffix string) string {
	return func(suffix string) string {
		if t.Schema == "" {
			return quoteIdent(t.Name + suffix)
		}
		return quoteIdent(t.Schema) + "." + quoteIdent(t.Name+suffix)
	}
}

// render replaces the {{...}} placeholders of a migration.
func render(sqlText string, t outboxdriver.Table, partitions int) string {
	n := namesOf(t)
	q := qualifier(t)
	var rows strings.Builder
	for p := range partitions {
		if p > 0 {
			rows.WriteString(",")
		}
		rows.WriteString("(" + strconv.Itoa(p) + ")")
	}
	return strings.NewReplacer(
		"{{table}}", n.Table,
		"{{dead_letter}}", n.DeadLetter,
		"{{leases}}", n.Leases,
		"{{claims}}", n.Claims,
		"{{relays}}", n.Relays,
		"{{migrations}}", n.Migrations,
		"{{held}}", n.Held,
		"{{audit}}", n.Audit,
		"{{pause}}", q("_pause"),
		"{{masking}}", q("_masking"),
		"{{samples}}", q("_samples"),
		"{{requests}}", q("_requests"),
		"{{audit_prune}}", q("_audit_prune"),
		"{{audit_upd}}", q("_audit_upd"),
		"{{audit_del}}", q("_audit_del"),
		"{{binlog}}", q("_binlog"),
		"{{partitions}}", strconv.Itoa(partitions),
		"{{partition_rows}}", rows.String(),
	).Replace(sqlText)
}

// migrator runs migrations of one table on one connection, under a named
// lock (GET_LOCK) that serialises migrators across processes.
type migrator struct {
	conn *sql.Conn
	t    outboxdriver.Table
	n    driverkit.Names
}

// lockName is the GET_LOCK name of t's migrations: at most 64 characters.
func lockName(schema, table string) string {
	h := sha1.Sum([]byte(schema + "." + table))
	return "outbox.migrate." + hex.EncodeToString(h[:])
}

// withMigrator takes a connection, resolves an empty schema to the current
// database for the lock's name, takes the migration lock and runs fn.
func withMigrator(ctx context.Context, db *sql.DB, t outboxdriver.Table, fn func(m *migrator) ([]int, error)) ([]int, error) {
	if err := validate(t); err != nil {
		return nil, err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("outboxmysql: migrate %s: %w", t, err)
	}
	defer conn.Close()
	schema := t.Schema
	if schema == "" {
		var cur sql.NullString
		if err := conn.QueryRowContext(ctx, `SELECT DATABASE()`).Scan(&cur); err != nil {
			return nil, fmt.Errorf("outboxmysql: migrate %s: %w", t, err)
		}
		if !cur.Valid {
			return nil, fmt.Errorf("outboxmysql: migrate %s: no schema given and the connection has no current database: name one in the DSN", t)
		}
		schema = cur.String
	}
	name := lockName(schema, t.Name)
	for {
		var got sql.NullInt64
		if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, 1)`, name).Scan(&got); err != nil {
			return nil, fmt.Errorf("outboxmysql: migrate %s: take the migration lock: %w", t, err)
		}
		if got.Valid && got.Int64 == 1 {
			break
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("outboxmysql: migrate %s: wait for another migration: %w", t, err)
		}
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = conn.ExecContext(rctx, `DO RELEASE_LOCK(?)`, name)
	}()
	m := &migrator{conn: conn, t: t, n: namesOf(t)}
	vs, err := fn(m)
	if err != nil {
		return vs, fmt.Errorf("outboxmysql: migrate %s: %w", t, err)
	}
	return vs, nil
}

// applied creates the bookkeeping table if needed and returns the applied
// versions.
func (m *migrator) applied(ctx context.Context) (map[int]bool, error) {
	if _, err := m.conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+m.n.Migrations+` (
    version    INT          NOT NULL PRIMARY KEY,
    name       VARCHAR(255) NOT NULL,
    applied_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6))
) ENGINE=InnoDB`); err != nil {
		return nil, fmt.Errorf("create migrations table: %w", err)
	}
	rows, err := m.conn.QueryContext(ctx, `SELECT version FROM `+m.n.Migrations)
	if err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", err)
	}
	defer rows.Close()
	done := map[int]bool{}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		done[v] = true
	}
	return done, rows.Err()
}

// exec runs every statement of a rendered migration. An ALTER TABLE is
// atomic (all of its clauses or none), so one refused because its first
// column or key exists already (or, going down, is gone already) was
// applied by a run cut short before it recorded the version: it is done.
func (m *migrator) exec(ctx context.Context, sqlText string) error {
	for _, st := range migrations.Statements(sqlText) {
		if _, err := m.conn.ExecContext(ctx, st); err != nil {
			var my *mysql.MySQLError
			alter := strings.HasPrefix(strings.ToUpper(strings.TrimSpace(st)), "ALTER TABLE")
			if alter && errors.As(err, &my) && (my.Number == 1060 || my.Number == 1061 || my.Number == 1091) { // duplicate column, duplicate key, cannot drop
				continue
			}
			return err
		}
	}
	return nil
}

// up applies every migration not yet applied and returns their versions.
func (m *migrator) up(ctx context.Context, partitions int, ignoreRelaysBehind bool) ([]int, error) {
	done, err := m.applied(ctx)
	if err != nil {
		return nil, err
	}
	ms := all()
	if !ignoreRelaysBehind {
		relays, err := liveRelays(ctx, m.conn, m.n)
		if err != nil {
			return nil, err
		}
		if err := migrations.Behind(ms, done, relays); err != nil {
			if e, ok := err.(*outboxdriver.RelaysBehindError); ok {
				e.Table = m.t
			}
			return nil, err
		}
	}
	return migrations.Up(ms, done, func(mg migrations.Migration) error {
		if mg.Version == 1 {
			if err := m.checkHalfDone(ctx, partitions); err != nil {
				return err
			}
		}
		if err := m.exec(ctx, render(mg.Up, m.t, partitions)); err != nil {
			return fmt.Errorf("migration %03d_%s (its steps are idempotent: run migrate again once the cause is fixed): %w", mg.Version, mg.Name, err)
		}
		record, args := `INSERT INTO `+m.n.Migrations+` (version, name) VALUES (?, ?)`, []any{mg.Version, mg.Name}
		if mg.Version >= relayVersionsSince {
			record, args = `INSERT INTO `+m.n.Migrations+` (version, name, relays_from) VALUES (?, ?, ?)`, append(args, mg.RelaysFrom)
		}
		if _, err := m.conn.ExecContext(ctx, record, args...); err != nil {
			return fmt.Errorf("record migration %d: %w", mg.Version, err)
		}
		if mg.Version == relayVersionsSince {
			for _, e := range ms {
				if e.RelaysFrom > 0 && e.Version < relayVersionsSince {
					if _, err := m.conn.ExecContext(ctx, `UPDATE `+m.n.Migrations+` SET relays_from = ? WHERE version = ?`, e.RelaysFrom, e.Version); err != nil {
						return fmt.Errorf("record the relays migration %d works with: %w", e.Version, err)
					}
				}
			}
		}
		return nil
	})
}

// relayVersionsSince is the schema version whose migration records each
// relay's schema version, release and renewal, and each applied
// migration's relays_from (docs/operations.md, Upgrades).
const relayVersionsSince = 6

// relaysSQL lists the relays of the registry n.Relays, with their versions
// when withVersions (schema version relayVersionsSince).
func relaysSQL(n driverkit.Names, withVersions bool) string {
	cols := "0, '', NULL"
	if withVersions {
		cols = "COALESCE(schema_version, 0), `release`, DATE_FORMAT(renewed_at, '%Y-%m-%d %H:%i:%s.%f')"
	}
	return `SELECT relay, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at), ` + cols + ` FROM ` + n.Relays + ` ORDER BY relay`
}

// liveRelays lists the relays whose registration has not expired: none
// when the table has no registry yet.
func liveRelays(ctx context.Context, q interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}, n driverkit.Names) ([]outboxdriver.RelayStatus, error) {
	rows, err := q.QueryContext(ctx, relaysSQL(n, true))
	if isNoSuchTable(err) || isNoSuchColumn(err) {
		rows, err = q.QueryContext(ctx, relaysSQL(n, false))
	}
	if isNoSuchTable(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the relays: %w", err)
	}
	defer rows.Close()
	var out []outboxdriver.RelayStatus
	for rows.Next() {
		var r outboxdriver.RelayStatus
		var micros int64
		var renewed sql.NullString
		if err := rows.Scan(&r.Name, &micros, &r.SchemaVersion, &r.Release, &renewed); err != nil {
			return nil, fmt.Errorf("read the relays: %w", err)
		}
		if micros <= 0 {
			continue
		}
		r.ExpiresIn = time.Duration(micros) * time.Microsecond
		if renewed.Valid {
			r.RenewedAt, _ = time.Parse("2006-01-02 15:04:05.000000", renewed.String)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// checkHalfDone refuses to finish a first migration that an earlier run
// left half-done with another number of partitions.
func (m *migrator) checkHalfDone(ctx context.Context, partitions int) error {
	var n int
	err := m.conn.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+m.n.Leases).Scan(&n)
	if isNoSuchTable(err) {
		return nil // nothing was done
	}
	if err != nil {
		return err
	}
	if n != partitions {
		return fmt.Errorf("an earlier migration stopped half-way with %d partitions: migrate again with %d partitions, or migrate down to 0 first", n, n)
	}
	return nil
}

// down reverts every applied migration newer than target, newest first.
func (m *migrator) down(ctx context.Context, target int) ([]int, error) {
	done, err := m.applied(ctx)
	if err != nil {
		return nil, err
	}
	ran, err := migrations.Down(all(), done, target, func(mg migrations.Migration) error {
		if err := m.exec(ctx, render(mg.Down, m.t, 0)); err != nil {
			return fmt.Errorf("revert migration %03d_%s: %w", mg.Version, mg.Name, err)
		}
		_, err := m.conn.ExecContext(ctx, `DELETE FROM `+m.n.Migrations+` WHERE version = ?`, mg.Version)
		return err
	})
	if err != nil {
		return ran, err
	}
	if target == 0 {
		if _, err := m.conn.ExecContext(ctx, `DROP TABLE IF EXISTS `+m.n.Migrations); err != nil {
			return ran, err
		}
	}
	return ran, nil
}

// Migrate creates or upgrades the outbox table t and its companions (dead
// letters, leases, partition claims, live relays, held aggregates, audit,
// migration bookkeeping) and returns the versions it applied; a second
// run applies none. t.Schema is the MySQL database; empty means the
// connection's current one. opts may be nil.
//
// Migrators are serialised across processes by a named lock (GET_LOCK).
// MySQL commits every DDL statement at once, so a migration is not one
// transaction: instead every step is idempotent, and a migration cut short
// (a crash, a lost connection) is completed by running Migrate again.
func (d *Driver) Migrate(ctx context.Context, t outboxdriver.Table, opts *outboxdriver.MigrateOptions) ([]int, error) {
	db, err := d.pool.Need()
	if err != nil {
		return nil, err
	}
	o, err := driverkit.ResolveMigrate(opts)
	if err != nil {
		return nil, fmt.Errorf("outboxmysql: %w", err)
	}
	if o.TimePartitions != "" {
		return nil, fmt.Errorf("outboxmysql: %w", outboxdriver.ErrNoTimePartitions)
	}
	if o.Wakeups != "" {
		return nil, fmt.Errorf("outboxmysql: %w", outboxdriver.ErrNoWakeups)
	}
	if o.CDC {
		return nil, fmt.Errorf("outboxmysql: %w", outboxdriver.ErrNoCDC)
	}
	return withMigrator(ctx, db, t, func(m *migrator) ([]int, error) { return m.up(ctx, o.Partitions, o.IgnoreRelaysBehind) })
}

// MigrateDown reverts migrations of t newer than target; target 0 drops
// the outbox tables and everything in them. Like Migrate, it runs under
// the migration lock and can be repeated if it was cut short.
func (d *Driver) MigrateDown(ctx context.Context, t outboxdriver.Table, target int) ([]int, error) {
	db, err := d.pool.Need()
	if err != nil {
		return nil, err
	}
	if latest := d.LatestVersion(); target < 0 || target > latest {
		return nil, fmt.Errorf("outboxmysql: migrate down to %d: use 0 to %d", target, latest)
	}
	return withMigrator(ctx, db, t, func(m *migrator) ([]int, error) { return m.down(ctx, target) })
}
