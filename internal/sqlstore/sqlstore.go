// Package sqlstore is the operators' side of an outbox table (what package
// ops and the console need beyond outboxdriver.Store: filtered dead
// letters, the full audit, pauses, held aggregates, failure groups, the
// overview's samples, requests with replay and repair) over database/sql,
// written once for MySQL/MariaDB and SQLite. Each of those drivers embeds
// a Store made with its Dialect: what differs between the two databases
// (time columns, the clock, row locks, "insert or ignore") is the
// Dialect's; the statements and the rules are here.
//
// The statements use only what both databases have: ? placeholders, no
// RETURNING, no common table expressions that change rows. Where
// PostgreSQL's driver does a step in SQL (the error class of a failure
// group, the headers of a replayed copy), this package does it in Go, the
// same way (driverkit.ErrorClass).
package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Dialect is what differs between the databases a Store runs on.
type Dialect struct {
	// Driver names the driver in errors ("outboxmysql").
	Driver string
	// Resolve validates t, fills in its defaults and returns it with the
	// function that quotes and qualifies the name of one of its tables
	// (suffix "" is the outbox table itself, "_audit" its audit...).
	Resolve func(t outboxdriver.Table) (outboxdriver.Table, func(suffix string) string, error)
	// Now is the database clock, in the form of the time columns.
	Now string
	// TimeText renders the time column (or expression) col as text
	// 'YYYY-MM-DD HH:MM:SS[.ffffff]', in UTC.
	TimeText func(col string) string
	// TimeArg renders a time as an argument that compares with the time
	// columns.
	TimeArg func(time.Time) any
	// NowMinusMS is the database clock less the milliseconds of one ?
	// argument, in the form of the time columns.
	NowMinusMS string
	// AgeSeconds is the number of seconds from the time expression col to
	// now, as SQL.
	AgeSeconds func(col string) string
	// ForUpdate locks the rows a SELECT reads until the transaction ends
	// ("" on a database whose write transactions lock it whole).
	ForUpdate string
	// InsertIgnore starts an INSERT that skips rows whose key exists.
	InsertIgnore string
	// LastSeq is the SQL (and its arguments) of the highest position the
	// outbox table t has handed out, deleted rows included.
	LastSeq func(t outboxdriver.Table) (string, []any)
	// NoTable reports the error of a table, column or routine that does
	// not exist.
	NoTable func(error) bool
	// Migrated reports whether the outbox table t and its migrations
	// table exist.
	Migrated func(ctx context.Context, db *sql.DB, t outboxdriver.Table) (bool, error)
	// Latest is the newest schema version the driver knows.
	Latest func() int
	// PruneProc names, quoted and qualified, the stored procedure that
	// prunes t's audit as its definer, the tables' owner (MySQL/MariaDB,
	// schema version 5). Nil where the Store deletes under the marker
	// itself: SQLite has no accounts (whoever can write the file can
	// change anything), and a MySQL table of an earlier version.
	PruneProc func(t outboxdriver.Table) string
	// NoProc reports the error of a stored procedure that does not exist,
	// and Denied that of a right the account lacks.
	NoProc, Denied func(error) bool
	// TxOptions are the options of the Store's write transactions.
	TxOptions *sql.TxOptions
}

// Store answers the operators' queries and actions on the tables of one
// database. The zero value is not usable: make one with New.
type Store struct {
	d  Dialect
	db func() (*sql.DB, error)
}

// New returns the Store of the database db returns (a driver's pool, or
// an error saying it has none).
func New(d Dialect, db func() (*sql.DB, error)) Store { return Store{d: d, db: db} }

// tables is one outbox table's quoted names.
type tables struct {
	t                                         outboxdriver.Table
	table, dead, held, audit, pause, requests string
	samples, relays, prune, migrations        string
	masking                                   string
}

func (s Store) open(t outboxdriver.Table) (*sql.DB, tables, error) {
	n, err := s.d.names(t)
	if err != nil {
		return nil, tables{}, err
	}
	db, err := s.db()
	if err != nil {
		return nil, tables{}, err
	}
	return db, n, nil
}

// names resolves t and names its tables.
func (d Dialect) names(t outboxdriver.Table) (tables, error) {
	t, q, err := d.Resolve(t)
	if err != nil {
		return tables{}, err
	}
	return tables{t: t, table: q(""), dead: q("_dead_letter"), held: q("_held"), audit: q("_audit"), pause: q("_pause"),
		requests: q("_requests"), samples: q("_samples"), relays: q("_relays"), prune: q("_audit_prune"),
		migrations: q("_migrations"), masking: q("_masking")}, nil
}

// fail wraps err of what ("list dead letters of") on t: the one place the
// Store's methods say why they failed. When the database reports a
// missing table, column or routine, fail reads t's schema version: a
// table never migrated wraps outboxdriver.ErrNotMigrated, one at an older
// version says to migrate it (driverkit.MissingSchema).
//
// It reads on the pool: call it once the failed statement's connection is
// back (after the transaction, never inside it).
func (s Store) fail(ctx context.Context, t outboxdriver.Table, what string, err error) error {
	if errors.Is(err, outboxdriver.ErrNotFound) || errors.Is(err, outboxdriver.ErrRequestState) {
		return err
	}
	if s.d.NoTable != nil && s.d.NoTable(err) {
		if v, verr := s.schemaVersion(ctx, t); verr == nil {
			if e := driverkit.MissingSchema(s.d.Driver, what, t, v, s.d.Latest(), err); e != nil {
				return e
			}
		}
	}
	return fmt.Errorf("%s: %s %s: %w", s.d.Driver, what, t, oneLine(err))
}

// schemaVersion is the schema version of t: 0 when it is not migrated.
func (s Store) schemaVersion(ctx context.Context, t outboxdriver.Table) (int, error) {
	if s.db == nil || s.d.Migrated == nil || s.d.Latest == nil {
		return 0, errors.New("no pool to read the schema version with")
	}
	db, n, err := s.open(t)
	if err != nil {
		return 0, err
	}
	if ok, err := s.d.Migrated(ctx, db, n.t); err != nil || !ok {
		return 0, err
	}
	var v int
	err = db.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM `+n.migrations).Scan(&v)
	return v, err
}

// oneLine keeps an error's text on one line (SQLite's span several).
func oneLine(err error) error {
	if !strings.Contains(err.Error(), "\n") {
		return err
	}
	return &lineError{err}
}

type lineError struct{ err error }

func (e *lineError) Error() string { return strings.Join(strings.Fields(e.err.Error()), " ") }
func (e *lineError) Unwrap() error { return e.err }

// inTx runs fn in a write transaction and commits it.
func (s Store) inTx(ctx context.Context, db *sql.DB, fn func(*sql.Tx) error) error {
	return driverkit.InTx(ctx, db, s.d.TxOptions, fn)
}

// timeLayout reads TimeText's text.
const timeLayout = "2006-01-02 15:04:05"

// parseTime reads a time column rendered by TimeText (or stored as RFC
// 3339 by a program of its own).
func parseTime(s string) (time.Time, error) {
	if t, err := time.ParseInLocation(timeLayout, s, time.UTC); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC(), nil
	}
	return time.Time{}, fmt.Errorf("time %q: not a time the outbox wrote", s)
}

// nullTime is a nullable time column read through TimeText.
type nullTime struct{ t **time.Time }

func (n nullTime) Scan(v any) error {
	if v == nil {
		*n.t = nil
		return nil
	}
	var s string
	switch x := v.(type) {
	case string:
		s = x
	case []byte:
		s = string(x)
	default:
		return fmt.Errorf("time column: unexpected %T", v)
	}
	t, err := parseTime(s)
	if err != nil {
		return err
	}
	*n.t = &t
	return nil
}

// timeCol is a time column read through TimeText.
type timeCol struct{ t *time.Time }

func (c timeCol) Scan(v any) error {
	var p *time.Time
	if err := (nullTime{&p}).Scan(v); err != nil {
		return err
	}
	if p == nil {
		return errors.New("time column: NULL")
	}
	*c.t = *p
	return nil
}

// text is a nullable text column read as a string ("" for NULL).
type text struct{ s *string }

func (c text) Scan(v any) error {
	switch x := v.(type) {
	case nil:
		*c.s = ""
	case string:
		*c.s = x
	case []byte:
		*c.s = string(x)
	default:
		*c.s = fmt.Sprint(x)
	}
	return nil
}

// where builds a WHERE clause of conditions joined by AND.
type where struct {
	conds []string
	args  []any
}

func (w *where) add(cond string, args ...any) {
	w.conds = append(w.conds, cond)
	w.args = append(w.args, args...)
}

func (w *where) sql() string {
	if len(w.conds) == 0 {
		return "TRUE"
	}
	return strings.Join(w.conds, " AND ")
}

// placeholders is n question marks, separated by commas.
func placeholders(n int) string { return strings.TrimSuffix(strings.Repeat("?, ", n), ", ") }

func anys[T any](xs []T) []any {
	out := make([]any, len(xs))
	for i, x := range xs {
		out[i] = x
	}
	return out
}

// chunk bounds the ids one statement names (SQLite allows 32,766
// arguments, MySQL 65,535).
const chunk = 1000

func chunks[T any](xs []T) [][]T {
	var out [][]T
	for len(xs) > 0 {
		n := min(len(xs), chunk)
		out = append(out, xs[:n])
		xs = xs[n:]
	}
	return out
}

// canonID returns id as the database stores event ids (a lower-case UUID),
// and false when it is not one: no row has it.
func canonID(id string) (string, bool) {
	u, err := uuid.Parse(id)
	if err != nil {
		return "", false
	}
	return u.String(), true
}

// nullString is s, or NULL when empty.
func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// nullJSON is b as text, or NULL when empty.
func nullJSON(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return string(b)
}

// Pauses reads the pauses in force on t through q: a relay's Source reads
// them on its pool, a batch in the claim's transaction (on the connection
// it holds), and the Store shares the query. A table that predates the
// pause table has none.
func Pauses(ctx context.Context, d Dialect, q queryer, t outboxdriver.Table) ([]outboxdriver.Pause, error) {
	n, err := d.names(t)
	if err != nil {
		return nil, err
	}
	s := New(d, nil)
	return s.listPauses(ctx, q, t, n)
}
