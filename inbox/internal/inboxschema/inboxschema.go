// Package inboxschema holds the inbox's SQL for every database it supports:
// embedded, numbered migrations rendered for a validated schema and table
// name, the runner the drivers share, and the statements they run.
//
// On MySQL and MariaDB every DDL statement commits at once, so a migration
// cannot be one transaction: its statements are idempotent instead, run
// one at a time, and the caller serialises migrators with a named lock
// (GET_LOCK).
package inboxschema

import (
	"context"
	"embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outbox/internal/migrations"
	"github.com/outboxkit/outbox/outboxdriver"
)

//go:embed postgres/*.sql sqlite/*.sql mysql/*.sql
var files embed.FS

// Dialect is the SQL flavour of a database.
type Dialect int

const (
	// Postgres is PostgreSQL.
	Postgres Dialect = iota + 1
	// SQLite is SQLite 3.35 or newer.
	SQLite
	// MySQL is MySQL 8.0.13 or newer, or MariaDB 10.6 or newer, with
	// InnoDB tables.
	MySQL
)

// String returns postgres, sqlite or mysql.
func (d Dialect) String() string {
	switch d {
	case Postgres:
		return "postgres"
	case SQLite:
		return "sqlite"
	case MySQL:
		return "mysql"
	}
	return "Dialect(" + strconv.Itoa(int(d)) + ")"
}

// Valid reports whether d is a known dialect.
func (d Dialect) Valid() bool { return d == Postgres || d == SQLite || d == MySQL }

// DefaultSchema is the schema a table lives in when none is named: on
// MySQL the empty string, the connection's current database.
func (d Dialect) DefaultSchema() string {
	switch d {
	case SQLite:
		return "main"
	case MySQL:
		return ""
	}
	return "public"
}

// param returns the i-th (1-based) placeholder.
func (d Dialect) param(i int) string {
	if d == SQLite || d == MySQL {
		return "?"
	}
	return "$" + strconv.Itoa(i)
}

// Validate checks t's names. On MySQL an empty schema is allowed: it means
// the connection's current database.
func (d Dialect) Validate(t outboxdriver.Table) error {
	if d == MySQL && t.Schema == "" {
		t.Schema = "current_database"
	}
	return t.Validate()
}

// quote quotes a validated identifier: with backticks on MySQL, double
// quotes elsewhere.
func (d Dialect) quote(s string) string {
	if d == MySQL {
		return "`" + strings.ReplaceAll(s, "`", "``") + "`"
	}
	return outboxdriver.QuoteIdent(s)
}

// qualified returns t's companion named t.Name+suffix, quoted and
// qualified by the schema (unless it is empty, on MySQL).
func (d Dialect) qualified(t outboxdriver.Table, suffix string) string {
	if d == MySQL && t.Schema == "" {
		return d.quote(t.Name + suffix)
	}
	return d.quote(t.Schema) + "." + d.quote(t.Name+suffix)
}

// Migration is one numbered schema change.
type Migration = migrations.Migration

// all reads the embedded migrations of d.
func all(d Dialect) []Migration { return migrations.MustLoad(files, d.String()) }

// Latest is the newest schema version of d.
func Latest(d Dialect) int { return migrations.Latest(all(d)) }

// Names are the quoted, qualified names of an inbox table's companions.
type Names struct {
	Table, Versions, DeadLetter, Migrations string
}

// NamesOf returns the names belonging to t in dialect d; t must be valid.
func NamesOf(d Dialect, t outboxdriver.Table) Names {
	return Names{
		Table:      d.qualified(t, ""),
		Versions:   d.qualified(t, "_versions"),
		DeadLetter: d.qualified(t, "_dead_letter"),
		Migrations: d.qualified(t, "_migrations"),
	}
}

// Render replaces the {{...}} placeholders of a migration with t's quoted
// names in dialect d. t must be valid.
func Render(d Dialect, sql string, t outboxdriver.Table) string {
	n := NamesOf(d, t)
	q := d.quote
	return strings.NewReplacer(
		"{{schema}}", q(t.Schema),
		"{{table}}", n.Table,
		"{{table_name}}", q(t.Name),
		"{{versions}}", n.Versions,
		"{{dead_letter}}", n.DeadLetter,
		"{{dead_letter_name}}", q(t.Name+"_dead_letter"),
		"{{processed_idx}}", q(t.Name+"_processed"),
		"{{dead_letter_idx}}", q(t.Name+"_dl_consumer"),
	).Replace(sql)
}

// Tx is the part of a database transaction the runner needs.
type Tx = migrations.Tx

// run executes a rendered migration: in one call, or on MySQL statement by
// statement.
func run(ctx context.Context, tx Tx, d Dialect, sqlText string) error {
	if d != MySQL {
		return tx.Exec(ctx, sqlText)
	}
	for _, st := range migrations.Statements(sqlText) {
		if err := tx.Exec(ctx, st); err != nil {
			return err
		}
	}
	return nil
}

// prepare validates t, serialises concurrent migrations of it (on SQLite
// the write transaction does; on MySQL the caller holds a GET_LOCK),
// creates the bookkeeping table and returns the applied versions.
func prepare(ctx context.Context, tx Tx, d Dialect, t outboxdriver.Table) (map[int]bool, error) {
	if !d.Valid() {
		return nil, fmt.Errorf("unknown dialect %v", d)
	}
	if err := d.Validate(t); err != nil {
		return nil, err
	}
	n := NamesOf(d, t)
	if d == Postgres {
		if err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "outbox.inbox.migrate:"+t.String()); err != nil {
			return nil, err
		}
		if err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+outboxdriver.QuoteIdent(t.Schema)); err != nil {
			return nil, fmt.Errorf("create schema %s: %w", t.Schema, err)
		}
	}
	bookkeeping := `CREATE TABLE IF NOT EXISTS ` + n.Migrations + ` (
		version    integer NOT NULL PRIMARY KEY,
		name       text    NOT NULL,
		applied_at text    NOT NULL DEFAULT CURRENT_TIMESTAMP)`
	if d == MySQL {
		bookkeeping = `CREATE TABLE IF NOT EXISTS ` + n.Migrations + ` (
		version    INT          NOT NULL PRIMARY KEY,
		name       VARCHAR(255) NOT NULL,
		applied_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6))) ENGINE=InnoDB`
	}
	if err := tx.Exec(ctx, bookkeeping); err != nil {
		return nil, fmt.Errorf("create migrations table: %w", err)
	}
	vs, err := tx.Versions(ctx, `SELECT version FROM `+n.Migrations)
	if err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", err)
	}
	done := map[int]bool{}
	for _, v := range vs {
		done[v] = true
	}
	return done, nil
}

// Up applies, inside tx, every migration of d not yet applied to t and
// returns the versions it applied (none on a second run). The caller
// commits. On MySQL tx is a connection holding the migration lock: each
// statement commits at once, and a run cut short is completed by running
// Up again.
func Up(ctx context.Context, tx Tx, d Dialect, t outboxdriver.Table) ([]int, error) {
	done, err := prepare(ctx, tx, d, t)
	if err != nil {
		return nil, err
	}
	ran, err := migrations.Up(all(d), done, func(m Migration) error {
		if err := run(ctx, tx, d, Render(d, m.Up, t)); err != nil {
			if d == MySQL {
				return fmt.Errorf("migration %03d_%s (its steps are idempotent: run migrate again once the cause is fixed): %w", m.Version, m.Name, err)
			}
			return fmt.Errorf("migration %03d_%s: %w", m.Version, m.Name, err)
		}
		if err := tx.Exec(ctx, `INSERT INTO `+NamesOf(d, t).Migrations+` (version, name) VALUES (`+d.param(1)+`, `+d.param(2)+`)`, m.Version, m.Name); err != nil {
			return fmt.Errorf("record migration %d: %w", m.Version, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return ran, nil
}

// Down reverts, inside tx, every applied migration newer than target (0
// removes the inbox tables and their data) and returns the versions it
// reverted, newest first.
func Down(ctx context.Context, tx Tx, d Dialect, t outboxdriver.Table, target int) ([]int, error) {
	if target < 0 || (d.Valid() && target > Latest(d)) {
		return nil, fmt.Errorf("target version %d: use 0 to %d", target, Latest(d))
	}
	done, err := prepare(ctx, tx, d, t)
	if err != nil {
		return nil, err
	}
	ran, err := migrations.Down(all(d), done, target, func(m Migration) error {
		if err := run(ctx, tx, d, Render(d, m.Down, t)); err != nil {
			return fmt.Errorf("revert migration %03d_%s: %w", m.Version, m.Name, err)
		}
		return tx.Exec(ctx, `DELETE FROM `+NamesOf(d, t).Migrations+` WHERE version = `+d.param(1), m.Version)
	})
	if err != nil {
		return nil, err
	}
	if target == 0 {
		if err := tx.Exec(ctx, `DROP TABLE IF EXISTS `+NamesOf(d, t).Migrations); err != nil {
			return nil, err
		}
	}
	return ran, nil
}

// Queries are the statements a driver runs, rendered for one table. The
// parameters of each are listed in its comment, in order.
type Queries struct {
	// Claim inserts a dedupe record; one row affected means it was new.
	// consumer, event id.
	Claim string
	// Advance raises a version if lower; one row affected means it did
	// (on MySQL: one or two rows). consumer, aggregatetype, aggregateid,
	// version; on MySQL then version twice more.
	Advance string
	// DeadLetter inserts a dead letter. consumer, event id, aggregatetype,
	// aggregateid, type, destination, headers (JSON text), payload, error.
	DeadLetter string
	// DeadLetters lists dead letters, oldest first. consumer, limit.
	// Columns: id, consumer, event_id, aggregatetype, aggregateid, type,
	// destination, headers (JSON text), payload, error, dead_lettered_at,
	// retry_requested_at (NULL when none).
	DeadLetters string
	// DeadLetterByID selects one dead letter with DeadLetters' columns.
	// consumer, id.
	DeadLetterByID string
	// DeadLetterIDs lists the ids of a consumer's dead letters, oldest
	// first. consumer.
	DeadLetterIDs string
	// RetryRequested lists up to limit dead letters marked for retry,
	// oldest first, with DeadLetters' columns. consumer, limit.
	RetryRequested string
	// RequestRetry marks one dead letter for retry; one row affected
	// means it exists. consumer, id.
	RequestRetry string
	// ClaimRetry clears one dead letter's retry mark; one row affected
	// means this caller claimed it. consumer, id.
	ClaimRetry string
	// DeleteDeadLetter deletes one dead letter; one row affected means it
	// existed. consumer, id.
	DeleteDeadLetter string
	// Processed counts a consumer's dedupe records. consumer.
	Processed string
	// DeadLetterStats counts a consumer's dead letters, those marked for
	// retry, and the oldest one's time (NULL when none). consumer.
	DeadLetterStats string
	// Cleanup deletes old records. Postgres: consumer, seconds (float),
	// limit. SQLite: consumer, consumer, SQLite date modifier
	// ("-3600.000 seconds"), limit. MySQL: consumer, microseconds, limit.
	Cleanup string
	// FoundRows (MySQL only) sets a claimed record to itself: one row
	// affected means the connection counts found rows instead of changed
	// ones (CLIENT_FOUND_ROWS), and Claim cannot tell a duplicate.
	// consumer, event id.
	FoundRows string
}

// QueriesFor renders the statements of d for t, which must be valid.
func QueriesFor(d Dialect, t outboxdriver.Table) Queries {
	n := NamesOf(d, t)
	p := d.param
	q := Queries{
		Claim: `INSERT INTO ` + n.Table + ` (consumer, event_id) VALUES (` + p(1) + `, ` + p(2) + `)
			ON CONFLICT (consumer, event_id) DO NOTHING`,
	}
	cols := `SELECT id, consumer, event_id, aggregatetype, aggregateid, type, destination, headers, payload, error, dead_lettered_at, retry_requested_at
			FROM ` + n.DeadLetter + ` WHERE consumer = ` + p(1)
	if d == Postgres {
		cols = strings.Replace(cols, "headers,", "headers::text,", 1)
	}
	now := map[Dialect]string{Postgres: "now()", SQLite: "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')", MySQL: "UTC_TIMESTAMP(6)"}[d]
	q.DeadLetters = cols + ` ORDER BY id LIMIT ` + p(2)
	q.DeadLetterByID = cols + ` AND id = ` + p(2)
	q.RetryRequested = cols + ` AND retry_requested_at IS NOT NULL ORDER BY id LIMIT ` + p(2)
	q.DeadLetterIDs = `SELECT id FROM ` + n.DeadLetter + ` WHERE consumer = ` + p(1) + ` ORDER BY id`
	q.RequestRetry = `UPDATE ` + n.DeadLetter + ` SET retry_requested_at = ` + now + ` WHERE consumer = ` + p(1) + ` AND id = ` + p(2)
	q.ClaimRetry = `UPDATE ` + n.DeadLetter + ` SET retry_requested_at = NULL WHERE consumer = ` + p(1) + ` AND id = ` + p(2) + ` AND retry_requested_at IS NOT NULL`
	q.DeleteDeadLetter = `DELETE FROM ` + n.DeadLetter + ` WHERE consumer = ` + p(1) + ` AND id = ` + p(2)
	q.Processed = `SELECT count(*) FROM ` + n.Table + ` WHERE consumer = ` + p(1)
	q.DeadLetterStats = `SELECT count(*), count(retry_requested_at), min(dead_lettered_at) FROM ` + n.DeadLetter + ` WHERE consumer = ` + p(1)
	switch d {
	case Postgres:
		q.Advance = `INSERT INTO ` + n.Versions + ` AS cur (consumer, aggregatetype, aggregateid, version) VALUES ($1, $2, $3, $4)
			ON CONFLICT (consumer, aggregatetype, aggregateid)
			DO UPDATE SET version = excluded.version, updated_at = now() WHERE cur.version < excluded.version`
		q.DeadLetter = `INSERT INTO ` + n.DeadLetter + ` (consumer, event_id, aggregatetype, aggregateid, type, destination, headers, payload, error)
			VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9)`
		q.Cleanup = `DELETE FROM ` + n.Table + ` WHERE consumer = $1 AND event_id IN (
			SELECT event_id FROM ` + n.Table + ` WHERE consumer = $1 AND processed_at < now() - make_interval(secs => $2) LIMIT $3)`
	case SQLite:
		q.Advance = `INSERT INTO ` + n.Versions + ` AS cur (consumer, aggregatetype, aggregateid, version) VALUES (?, ?, ?, ?)
			ON CONFLICT (consumer, aggregatetype, aggregateid)
			DO UPDATE SET version = excluded.version, updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE cur.version < excluded.version`
		q.DeadLetter = `INSERT INTO ` + n.DeadLetter + ` (consumer, event_id, aggregatetype, aggregateid, type, destination, headers, payload, error)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`
		q.Cleanup = `DELETE FROM ` + n.Table + ` WHERE consumer = ? AND event_id IN (
			SELECT event_id FROM ` + n.Table + ` WHERE consumer = ? AND processed_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?) LIMIT ?)`
	case MySQL:
		// A duplicate key makes the INSERT a no-op UPDATE: 0 rows affected
		// (unless the connection counts found rows; see FoundRows). Unlike
		// INSERT IGNORE it turns no other error into a warning. The
		// statement waits on a concurrent transaction's uncommitted record.
		q.Claim = `INSERT INTO ` + n.Table + ` (consumer, event_id) VALUES (?, ?)
			ON DUPLICATE KEY UPDATE event_id = event_id`
		q.FoundRows = `UPDATE ` + n.Table + ` SET event_id = event_id WHERE consumer = ? AND event_id = ?`
		// Assignments run left to right: updated_at is judged on the old
		// version. 1 row affected: inserted; 2: raised; 0: not newer.
		q.Advance = `INSERT INTO ` + n.Versions + ` (consumer, aggregatetype, aggregateid, version) VALUES (?, ?, ?, ?)
			ON DUPLICATE KEY UPDATE updated_at = IF(version < ?, UTC_TIMESTAMP(6), updated_at), version = GREATEST(version, ?)`
		q.DeadLetter = `INSERT INTO ` + n.DeadLetter + ` (consumer, event_id, aggregatetype, aggregateid, type, destination, headers, payload, error)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`
		q.Cleanup = `DELETE FROM ` + n.Table + ` WHERE consumer = ? AND processed_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
			ORDER BY processed_at LIMIT ?`
	}
	return q
}

// SQLiteModifier renders "d ago" as an SQLite date modifier.
func SQLiteModifier(d time.Duration) string {
	return fmt.Sprintf("-%.3f seconds", d.Seconds())
}

// SQLiteTimeLayout is the layout of the times the SQLite schema stores.
const SQLiteTimeLayout = "2006-01-02T15:04:05.000Z"

// Each runs one statement per id (exec reports whether it found the row)
// and returns the ids found, in order.
func Each(ids []int64, exec func(id int64) (bool, error)) ([]int64, error) {
	var found []int64
	for _, id := range ids {
		ok, err := exec(id)
		if err != nil {
			return found, err
		}
		if ok {
			found = append(found, id)
		}
	}
	return found, nil
}
