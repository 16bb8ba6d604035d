// Package migrations reads numbered SQL migrations from a file system and
// walks them up or down for the drivers, which render and run the SQL
// themselves (Tx and SQLTx are the shape of a runner's transaction).
//
// A migration is a pair of files NNN_name.up.sql and NNN_name.down.sql:
// NNN is the version (any number of digits), name the part up to the
// suffix. The down file may be missing; its SQL is then empty.
//
// An up file may declare, in a comment line of its own, the oldest relay
// it still works with: "-- relays: from N" says that relays of an older
// schema version than N cannot work with the table once the migration ran
// (docs/operations.md, Upgrades). Without the line every relay can.
package migrations

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/outboxkit/outbox/outboxdriver"
)

// Migration is one numbered schema change.
type Migration struct {
	Version int
	Name    string
	Up      string
	Down    string
	// RelaysFrom is the oldest relay schema version that still works with
	// the table once this migration ran (its "-- relays: from N" line); 0
	// when every relay does.
	RelaysFrom int
}

// relaysFromPrefix opens the line of an up file that declares its
// RelaysFrom.
const relaysFromPrefix = "-- relays: from "

// relaysFrom reads the "-- relays: from N" line of an up file: 0 when
// there is none. N must be a version from 1 up to the migration's own.
func relaysFrom(version int, up string) (int, error) {
	from := 0
	for line := range strings.SplitSeq(up, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), relaysFromPrefix)
		if !ok {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(rest))
		if err != nil || n < 1 || n > version {
			return 0, fmt.Errorf("migration %d: bad line %q: want %sN with N from 1 to %d", version, strings.TrimSpace(line), relaysFromPrefix, version)
		}
		if from != 0 {
			return 0, fmt.Errorf("migration %d: two %q lines", version, strings.TrimSpace(relaysFromPrefix))
		}
		from = n
	}
	return from, nil
}

// Load reads the migrations in dir of fsys, oldest first. A file whose
// name does not follow NNN_name.up.sql or NNN_name.down.sql, a version
// without an up file, and two files for the same version and direction
// are errors.
func Load(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	byVersion := map[int]*Migration{}
	hasUp, hasDown := map[int]bool{}, map[int]bool{}
	for _, e := range entries {
		name := e.Name()
		num, rest, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v < 0 || e.IsDir() {
			return nil, fmt.Errorf("bad migration file name %s", name)
		}
		var up bool
		switch {
		case strings.HasSuffix(rest, ".up.sql"):
			up = true
		case strings.HasSuffix(rest, ".down.sql"):
		default:
			return nil, fmt.Errorf("bad migration file name %s", name)
		}
		seen := hasDown
		if up {
			seen = hasUp
		}
		if seen[v] {
			return nil, fmt.Errorf("migration file %s: version %d is there twice", name, v)
		}
		seen[v] = true
		body, err := fs.ReadFile(fsys, path.Join(dir, name))
		if err != nil {
			return nil, err
		}
		m := byVersion[v]
		if m == nil {
			m = &Migration{Version: v}
			byVersion[v] = m
		}
		if up {
			m.Name = strings.TrimSuffix(rest, ".up.sql")
			m.Up = string(body)
			if m.RelaysFrom, err = relaysFrom(v, m.Up); err != nil {
				return nil, err
			}
		} else {
			m.Down = string(body)
		}
	}
	out := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		if !hasUp[m.Version] {
			return nil, fmt.Errorf("migration %d has a down file but no up file", m.Version)
		}
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// MustLoad is Load for migrations embedded at build time: it panics on an
// error, which only a broken build can cause.
func MustLoad(fsys fs.FS, dir string) []Migration {
	ms, err := Load(fsys, dir)
	if err != nil {
		panic("migrations: " + err.Error())
	}
	return ms
}

// Latest is the newest version of ms, which Load sorted; 0 if ms is empty.
func Latest(ms []Migration) int {
	if len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Version
}

// RelaysFrom is the oldest relay schema version that works with a table
// at which the migrations of ms that done holds have run: the highest of
// their RelaysFrom, 0 when every relay does.
func RelaysFrom(ms []Migration, done map[int]bool) int {
	from := 0
	for _, m := range ms {
		if done[m.Version] {
			from = max(from, m.RelaysFrom)
		}
	}
	return from
}

// Relay is a live relay as a migration sees it: its name, the release of
// its code, the newest schema version its code knows (0: unknown, a relay
// of a release that did not record it) and when it last renewed.
type Relay = outboxdriver.RelayStatus

// Behind returns the pending migrations of ms (those done lacks) that a
// relay of relays cannot work with, and those relays, in the error that
// Migrate returns unless forced: nil when there is none. A relay of an
// unknown version counts as older than every version.
func Behind(ms []Migration, done map[int]bool, relays []Relay) error {
	var blocking []outboxdriver.PendingMigration
	var behind []Relay
	seen := map[string]bool{}
	for _, m := range ms {
		if done[m.Version] || m.RelaysFrom == 0 {
			continue
		}
		hit := false
		for _, r := range relays {
			if r.SchemaVersion < m.RelaysFrom {
				hit = true
				if !seen[r.Name] {
					seen[r.Name] = true
					behind = append(behind, r)
				}
			}
		}
		if hit {
			blocking = append(blocking, outboxdriver.PendingMigration{Version: m.Version, Name: m.Name, RelaysFrom: m.RelaysFrom})
		}
	}
	if len(blocking) == 0 {
		return nil
	}
	return &outboxdriver.RelaysBehindError{Migrations: blocking, Relays: behind}
}

// Up calls apply for every migration of ms whose version is not in done,
// oldest first, and returns the versions it applied. When apply fails it
// stops and returns the versions applied before, with apply's error.
func Up(ms []Migration, done map[int]bool, apply func(Migration) error) ([]int, error) {
	var ran []int
	for _, m := range ms {
		if done[m.Version] {
			continue
		}
		if err := apply(m); err != nil {
			return ran, err
		}
		ran = append(ran, m.Version)
	}
	return ran, nil
}

// Down calls revert for every migration of ms whose version is in done and
// newer than target, newest first, and returns the versions it reverted.
// When revert fails it stops and returns the versions reverted before,
// with revert's error.
func Down(ms []Migration, done map[int]bool, target int, revert func(Migration) error) ([]int, error) {
	var ran []int
	for i := len(ms) - 1; i >= 0; i-- {
		m := ms[i]
		if m.Version <= target || !done[m.Version] {
			continue
		}
		if err := revert(m); err != nil {
			return ran, err
		}
		ran = append(ran, m.Version)
	}
	return ran, nil
}

// Tx is the part of a database transaction a runner needs.
type Tx interface {
	Exec(ctx context.Context, sql string, args ...any) error
	// Versions returns the first column of every row of sql as ints.
	Versions(ctx context.Context, sql string, args ...any) ([]int, error)
	// Each calls row for every row of sql, with the function that scans
	// the row's columns into dest.
	Each(ctx context.Context, sql string, args []any, row func(scan func(dest ...any) error) error) error
}

// SQLConn is what SQLTx needs: a *sql.Tx, a *sql.Conn or a *sql.DB.
type SQLConn interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// SQLTx adapts a database/sql transaction or connection to Tx.
func SQLTx(c SQLConn) Tx { return sqlTx{c} }

type sqlTx struct{ c SQLConn }

func (s sqlTx) Exec(ctx context.Context, q string, args ...any) error {
	_, err := s.c.ExecContext(ctx, q, args...)
	return err
}

func (s sqlTx) Each(ctx context.Context, q string, args []any, row func(scan func(dest ...any) error) error) error {
	rows, err := s.c.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := row(rows.Scan); err != nil {
			return err
		}
	}
	return rows.Err()
}

func (s sqlTx) Versions(ctx context.Context, q string, args ...any) ([]int, error) {
	rows, err := s.c.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// Statements splits a migration into its statements, for drivers that run
// one at a time: comment lines are dropped, and a statement ends with ";"
// at the end of a line. A compound statement (the body of a stored
// procedure) opens with a line that is BEGIN alone and closes with one
// that is END; alone: the lines between, and the blocks they open the same
// way, are part of it whatever they end with.
func Statements(sqlText string) []string {
	var out []string
	var cur strings.Builder
	depth := 0
	for line := range strings.SplitSeq(sqlText, "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteString("\n")
		switch upper := strings.ToUpper(trimmed); {
		case upper == "BEGIN":
			depth++
			continue
		case upper == "END;" && depth > 0:
			depth--
		}
		if depth == 0 && strings.HasSuffix(trimmed, ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}
