package inboxsql

import (
	"context"
	"crypto/sha1"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/internal/inboxschema"
	"github.com/outboxkit/outbox/internal/migrations"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Dialect is the database behind the *sql.DB.
type Dialect = inboxschema.Dialect

// The supported dialects.
const (
	// Postgres is PostgreSQL; the default schema is "public".
	Postgres = inboxschema.Postgres
	// SQLite is SQLite 3.35 or newer; the default schema is "main".
	SQLite = inboxschema.SQLite
	// MySQL is MySQL 8.0.13 or newer, or MariaDB 10.6 or newer; the
	// default schema is the connection's current database.
	MySQL = inboxschema.MySQL
)

// ParseDialect parses "postgres", "sqlite" or "mysql" (also "postgresql",
// "sqlite3" and "mariadb").
func ParseDialect(s string) (Dialect, error) {
	switch s {
	case "postgres", "postgresql":
		return Postgres, nil
	case "sqlite", "sqlite3":
		return SQLite, nil
	case "mysql", "mariadb":
		return MySQL, nil
	}
	return 0, fmt.Errorf("unknown SQL dialect %q: use postgres, sqlite or mysql", s)
}

// Driver implements inbox.Driver[*sql.Tx].
type Driver struct {
	db      *sql.DB
	dialect Dialect
	// countsChanged is set once a MySQL claim showed that the connection
	// reports changed rows, not found rows.
	countsChanged atomic.Bool
}

var _ inbox.Driver[*sql.Tx] = (*Driver)(nil)

// New returns a driver on db speaking dialect. HandleTx uses only the
// caller's transaction; Handle, DeadLetter, DeadLetters and Cleanup use db.
// It does no I/O.
func New(db *sql.DB, dialect Dialect) (*Driver, error) {
	if db == nil {
		return nil, errors.New("inboxsql: db is nil")
	}
	if !dialect.Valid() {
		return nil, fmt.Errorf("inboxsql: unknown dialect %v: use inboxsql.Postgres, inboxsql.SQLite or inboxsql.MySQL", dialect)
	}
	return &Driver{db: db, dialect: dialect}, nil
}

// DefaultSchema implements inbox.Driver: "public" on PostgreSQL, "main" on
// SQLite, "" (the connection's current database) on MySQL.
func (d *Driver) DefaultSchema() string { return d.dialect.DefaultSchema() }

func (d *Driver) queries(t outboxdriver.Table) inboxschema.Queries {
	return inboxschema.QueriesFor(d.dialect, t)
}

// ClaimTx implements inbox.Driver with INSERT … ON CONFLICT DO NOTHING, on
// MySQL INSERT … ON DUPLICATE KEY UPDATE event_id = event_id.
func (d *Driver) ClaimTx(ctx context.Context, tx *sql.Tx, t outboxdriver.Table, consumer, eventID string) (bool, error) {
	if tx == nil {
		return false, errors.New("transaction is nil")
	}
	q := d.queries(t)
	first, err := affectedOne(tx.ExecContext(ctx, q.Claim, consumer, eventID))
	if err != nil || !first || d.dialect != MySQL || d.countsChanged.Load() {
		return first, err
	}
	// Once: a connection with CLIENT_FOUND_ROWS reports a duplicate as one
	// row too. Setting the record just claimed to itself tells: 0 rows
	// (changed) is what the claim relies on.
	found, err := affectedOne(tx.ExecContext(ctx, q.FoundRows, consumer, eventID))
	if err != nil {
		return false, err
	}
	if found {
		return false, errors.New("inboxsql: the MySQL connection counts found rows (clientFoundRows=true), so a duplicate cannot be told from a new event: remove clientFoundRows from the DSN")
	}
	d.countsChanged.Store(true)
	return true, nil
}

// mysqlKeyLen is the longest aggregate type or id (in characters) the
// MySQL version guard keys.
const mysqlKeyLen = 255

// AdvanceTx implements inbox.Driver with INSERT … ON CONFLICT DO UPDATE …
// WHERE the stored version is lower, on MySQL INSERT … ON DUPLICATE KEY
// UPDATE version = GREATEST(version, new).
func (d *Driver) AdvanceTx(ctx context.Context, tx *sql.Tx, t outboxdriver.Table, k inbox.VersionKey, version int64) (bool, error) {
	q := d.queries(t).Advance
	if d.dialect != MySQL {
		return affectedOne(tx.ExecContext(ctx, q, k.Consumer, k.AggregateType, k.AggregateID, version))
	}
	for _, f := range []struct{ what, v string }{{"aggregate type", k.AggregateType}, {"aggregate id", k.AggregateID}} {
		if n := utf8.RuneCountInString(f.v); n > mysqlKeyLen {
			return false, fmt.Errorf("%s has %d characters: the MySQL version guard keys at most %d", f.what, n, mysqlKeyLen)
		}
	}
	res, err := tx.ExecContext(ctx, q, k.Consumer, k.AggregateType, k.AggregateID, version, version, version)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, err
	}
	return n == 1 || n == 2, nil // inserted, or raised
}

func affectedOne(res sql.Result, err error) (bool, error) {
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, err
	}
	return n == 1, nil
}

// InTx implements inbox.Driver.
func (d *Driver) InTx(ctx context.Context, fn func(tx *sql.Tx) error) (err error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	defer func() {
		if p := recover(); p != nil {
			_ = tx.Rollback()
			panic(p)
		}
	}()
	if err = fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// RecordDeadLetter implements inbox.Driver.
func (d *Driver) RecordDeadLetter(ctx context.Context, t outboxdriver.Table, dl inbox.DeadLetter) error {
	h := "{}"
	if len(dl.Headers) > 0 {
		b, err := json.Marshal(dl.Headers)
		if err != nil {
			return err
		}
		h = string(b)
	}
	var payload any
	if dl.Payload != nil {
		payload = dl.Payload
	}
	_, err := d.db.ExecContext(ctx, d.queries(t).DeadLetter, dl.Consumer, dl.EventID, dl.AggregateType, dl.AggregateID,
		dl.Type, dl.Destination, h, payload, dl.Error)
	return err
}

// DeadLetters implements inbox.Driver.
func (d *Driver) DeadLetters(ctx context.Context, t outboxdriver.Table, consumer string, limit int) ([]inbox.DeadLetter, error) {
	return d.deadLetters(ctx, d.queries(t).DeadLetters, consumer, limit)
}

func (d *Driver) deadLetters(ctx context.Context, query string, args ...any) ([]inbox.DeadLetter, error) {
	rows, err := d.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []inbox.DeadLetter
	for rows.Next() {
		var dl inbox.DeadLetter
		var h string
		var at, retry dbTime
		if err := rows.Scan(&dl.ID, &dl.Consumer, &dl.EventID, &dl.AggregateType, &dl.AggregateID, &dl.Type,
			&dl.Destination, &h, &dl.Payload, &dl.Error, &at, &retry); err != nil {
			return nil, err
		}
		if err := json.Unmarshal([]byte(h), &dl.Headers); err != nil {
			return nil, fmt.Errorf("dead letter %d: headers: %w", dl.ID, err)
		}
		dl.DeadLetteredAt, dl.RetryRequestedAt = at.t, retry.t
		out = append(out, dl)
	}
	return out, rows.Err()
}

// DeadLetter implements inbox.Admin.
func (d *Driver) DeadLetter(ctx context.Context, t outboxdriver.Table, consumer string, id int64) (inbox.DeadLetter, error) {
	dls, err := d.deadLetters(ctx, d.queries(t).DeadLetterByID, consumer, id)
	if err != nil {
		return inbox.DeadLetter{}, err
	}
	if len(dls) == 0 {
		return inbox.DeadLetter{}, fmt.Errorf("dead letter %d of %s: %w", id, consumer, inbox.ErrNotFound)
	}
	return dls[0], nil
}

// DeadLetterIDs implements inbox.Admin.
func (d *Driver) DeadLetterIDs(ctx context.Context, t outboxdriver.Table, consumer string) ([]int64, error) {
	rows, err := d.db.QueryContext(ctx, d.queries(t).DeadLetterIDs, consumer)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// RequestRetry implements inbox.Admin.
func (d *Driver) RequestRetry(ctx context.Context, t outboxdriver.Table, consumer string, ids []int64) ([]int64, error) {
	return d.each(ctx, d.queries(t).RequestRetry, consumer, ids)
}

// DeleteDeadLetters implements inbox.Admin.
func (d *Driver) DeleteDeadLetters(ctx context.Context, t outboxdriver.Table, consumer string, ids []int64) ([]int64, error) {
	return d.each(ctx, d.queries(t).DeleteDeadLetter, consumer, ids)
}

// ClaimRetries implements inbox.Admin.
func (d *Driver) ClaimRetries(ctx context.Context, t outboxdriver.Table, consumer string, limit int) ([]inbox.DeadLetter, error) {
	q := d.queries(t)
	dls, err := d.deadLetters(ctx, q.RetryRequested, consumer, limit)
	if err != nil {
		return nil, err
	}
	var claimed []inbox.DeadLetter
	for _, dl := range dls {
		ok, err := affectedOne(d.db.ExecContext(ctx, q.ClaimRetry, consumer, dl.ID))
		if err != nil {
			return claimed, err
		}
		if ok {
			dl.RetryRequestedAt = time.Time{}
			claimed = append(claimed, dl)
		}
	}
	return claimed, nil
}

func (d *Driver) each(ctx context.Context, query, consumer string, ids []int64) ([]int64, error) {
	return inboxschema.Each(ids, func(id int64) (bool, error) {
		return affectedOne(d.db.ExecContext(ctx, query, consumer, id))
	})
}

// Stats implements inbox.Admin.
func (d *Driver) Stats(ctx context.Context, t outboxdriver.Table, consumer string) (inbox.Stats, error) {
	q := d.queries(t)
	s := inbox.Stats{Consumer: consumer}
	if err := d.db.QueryRowContext(ctx, q.Processed, consumer).Scan(&s.Processed); err != nil {
		return s, err
	}
	var oldest dbTime
	if err := d.db.QueryRowContext(ctx, q.DeadLetterStats, consumer).Scan(&s.DeadLetters, &s.RetryRequested, &oldest); err != nil {
		return s, err
	}
	s.OldestDeadLetter = oldest.t
	return s, nil
}

// Cleanup implements inbox.Driver.
func (d *Driver) Cleanup(ctx context.Context, t outboxdriver.Table, consumer string, olderThan time.Duration, limit int) (int, error) {
	q := d.queries(t).Cleanup
	var res sql.Result
	var err error
	switch d.dialect {
	case SQLite:
		res, err = d.db.ExecContext(ctx, q, consumer, consumer, inboxschema.SQLiteModifier(olderThan), limit)
	case MySQL:
		res, err = d.db.ExecContext(ctx, q, consumer, olderThan.Microseconds(), limit)
	default:
		res, err = d.db.ExecContext(ctx, q, consumer, olderThan.Seconds(), limit)
	}
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// dbTime scans a timestamp as PostgreSQL drivers (and MySQL's with
// parseTime) return it (time.Time), as the SQLite schema stores it (text),
// or as MySQL sends a DATETIME without parseTime (UTC text).
type dbTime struct{ t time.Time }

func (d *dbTime) Scan(v any) error {
	switch x := v.(type) {
	case time.Time:
		d.t = x
		return nil
	case string:
		return d.parse(x)
	case []byte:
		return d.parse(string(x))
	case nil:
		return nil
	}
	return fmt.Errorf("cannot scan %T as a time", v)
}

func (d *dbTime) parse(s string) error {
	t, err := time.Parse(inboxschema.SQLiteTimeLayout, s)
	if err != nil {
		t, err = time.Parse(time.RFC3339Nano, s)
	}
	if err != nil {
		t, err = time.Parse(time.DateTime, s) // MySQL; fractions parse too
	}
	d.t = t
	return err
}

// Migrate creates or upgrades the inbox table t (default name "inbox" in
// the dialect's default schema) and its companions <t>_versions,
// <t>_dead_letter and <t>_migrations in one transaction, and returns the
// versions it applied; a second run applies none.
//
// On MySQL, where DDL commits at once, it is not one transaction: every
// step is idempotent, migrators are serialised by a named lock (GET_LOCK),
// and a migration cut short is completed by running Migrate again.
func Migrate(ctx context.Context, db *sql.DB, dialect Dialect, t outboxdriver.Table) ([]int, error) {
	return inTx(ctx, db, dialect, t, func(tx inboxschema.Tx, t outboxdriver.Table) ([]int, error) {
		return inboxschema.Up(ctx, tx, dialect, t)
	})
}

// MigrateDown reverts the inbox table t to version target in one
// transaction (on MySQL: under the migration lock, repeatable if cut
// short) and returns the versions it reverted; target 0 drops the inbox
// tables and everything in them.
func MigrateDown(ctx context.Context, db *sql.DB, dialect Dialect, t outboxdriver.Table, target int) ([]int, error) {
	return inTx(ctx, db, dialect, t, func(tx inboxschema.Tx, t outboxdriver.Table) ([]int, error) {
		return inboxschema.Down(ctx, tx, dialect, t, target)
	})
}

// LatestVersion is the newest inbox schema version this build knows for
// dialect.
func LatestVersion(dialect Dialect) int { return inboxschema.Latest(dialect) }

func inTx(ctx context.Context, db *sql.DB, dialect Dialect, t outboxdriver.Table, fn func(inboxschema.Tx, outboxdriver.Table) ([]int, error)) ([]int, error) {
	if db == nil {
		return nil, errors.New("inboxsql: db is nil")
	}
	if !dialect.Valid() {
		return nil, fmt.Errorf("inboxsql: unknown dialect %v", dialect)
	}
	if t.Schema == "" {
		t.Schema = dialect.DefaultSchema()
	}
	if t.Name == "" {
		t.Name = inbox.DefaultTable
	}
	if err := dialect.Validate(t); err != nil {
		return nil, fmt.Errorf("inboxsql: %w", err)
	}
	if dialect == MySQL {
		return withMySQLLock(ctx, db, t, fn)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("inboxsql: migrate %s: %w", t, err)
	}
	defer tx.Rollback()
	vs, err := fn(migrations.SQLTx(tx), t)
	if err != nil {
		return nil, fmt.Errorf("inboxsql: migrate %s: %w", t, err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("inboxsql: migrate %s: commit: %w", t, err)
	}
	return vs, nil
}

// withMySQLLock runs a MySQL migration on one connection holding a named
// lock (GET_LOCK) that serialises migrators of t across processes. An
// empty schema becomes the connection's current database.
func withMySQLLock(ctx context.Context, db *sql.DB, t outboxdriver.Table, fn func(inboxschema.Tx, outboxdriver.Table) ([]int, error)) ([]int, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("inboxsql: migrate %s: %w", t.Name, err)
	}
	defer conn.Close()
	if t.Schema == "" {
		var cur sql.NullString
		if err := conn.QueryRowContext(ctx, `SELECT DATABASE()`).Scan(&cur); err != nil {
			return nil, fmt.Errorf("inboxsql: migrate %s: %w", t.Name, err)
		}
		if !cur.Valid {
			return nil, fmt.Errorf("inboxsql: migrate %s: no schema given and the connection has no current database: name one in the DSN", t.Name)
		}
		t.Schema = cur.String
		if err := t.Validate(); err != nil {
			return nil, fmt.Errorf("inboxsql: current database: %w", err)
		}
	}
	h := sha1.Sum([]byte(t.Schema + "." + t.Name))
	lock := "outbox.inbox.migrate." + hex.EncodeToString(h[:]) // 61 of MySQL's 64 characters
	for {
		var got sql.NullInt64
		if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, 1)`, lock).Scan(&got); err != nil {
			return nil, fmt.Errorf("inboxsql: migrate %s: take the migration lock: %w", t, err)
		}
		if got.Valid && got.Int64 == 1 {
			break
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("inboxsql: migrate %s: wait for another migration: %w", t, err)
		}
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = conn.ExecContext(rctx, `DO RELEASE_LOCK(?)`, lock)
	}()
	vs, err := fn(migrations.SQLTx(conn), t)
	if err != nil {
		return vs, fmt.Errorf("inboxsql: migrate %s: %w", t, err)
	}
	return vs, nil
}
