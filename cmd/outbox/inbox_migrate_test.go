package main

// `outbox migrate --inbox` on every database the inbox supports: the
// first run creates the inbox tables, the second has nothing to do, and
// --down 0 removes them.

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/outboxkit/outbox/inbox/inboxsql"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxsqlite"
)

// inboxTarget is a fresh place for inbox tables: the CLI flags that name
// it, and a query listing the tables there whose names start with a
// prefix (the prefix is its only parameter).
type inboxTarget struct {
	flags  []string
	db     *sql.DB
	tables string
	// schema and dialect reach the inbox tables through db (inboxsql).
	schema  string
	dialect inboxsql.Dialect
}

// list returns the names of the target's tables starting with prefix.
func (it inboxTarget) list(t *testing.T, prefix string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := it.db.QueryContext(ctx, it.tables, prefix+"%")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		names = append(names, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(names, ",")
}

func inboxOnPostgres(t *testing.T) inboxTarget {
	pool := testenv.Pool(t) // fails with a hint when PostgreSQL is down
	schema := testenv.Table(t, pool).Schema
	db, err := sql.Open("pgx", dbURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return inboxTarget{
		flags:   []string{"--db", dbURL(), "--schema", schema},
		db:      db,
		tables:  `SELECT table_name FROM information_schema.tables WHERE table_schema = '` + schema + `' AND table_name LIKE $1 ORDER BY table_name`,
		schema:  schema,
		dialect: inboxsql.Postgres,
	}
}

func inboxOnSQLite(t *testing.T) inboxTarget {
	path := filepath.Join(t.TempDir(), "app.db")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := outboxsqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return inboxTarget{
		flags:   []string{"--db", "sqlite://" + path},
		db:      db,
		tables:  `SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE ? ORDER BY name`,
		schema:  "main",
		dialect: inboxsql.SQLite,
	}
}

func inboxOnMySQL(t *testing.T) inboxTarget {
	admin := mysqlDB(t, mysqlServerURL()) // fails with a hint when MariaDB is down
	name := testenv.MySQLDatabase(t, admin, "t")
	return inboxTarget{
		flags:   []string{"--db", mysqlURL(t, name)}, // the schema is the URL's database
		db:      admin,
		tables:  `SELECT table_name FROM information_schema.tables WHERE table_schema = '` + name + `' AND table_name LIKE ? ORDER BY table_name`,
		schema:  name,
		dialect: inboxsql.MySQL,
	}
}

func TestInboxMigrate(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		target func(t *testing.T) inboxTarget
	}{
		{"postgres", inboxOnPostgres},
		{"sqlite", inboxOnSQLite},
		{"mysql", inboxOnMySQL},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			it := c.target(t)
			args := append([]string{"migrate", "--inbox", "--inbox-table", "events_in"}, it.flags...)
			migrate := func(extra ...string) string {
				t.Helper()
				out, stderr, code := run(t, []string{"OUTBOX_DB="}, append(args, extra...)...)
				if code != 0 {
					t.Fatalf("migrate --inbox %v: exit %d: %s", extra, code, stderr)
				}
				return out
			}
			if out := migrate(); !strings.Contains(out, "applied migration(s) [1 2], now at version 2") {
				t.Fatalf("first run: %q", out)
			}
			want := "events_in,events_in_dead_letter,events_in_migrations,events_in_versions"
			if got := it.list(t, "events_in"); got != want {
				t.Fatalf("tables after migrate: %s, want %s", got, want)
			}
			if out := migrate(); !strings.Contains(out, "already at version 2, nothing to do") {
				t.Fatalf("second run: %q", out)
			}
			if got := it.list(t, "outbox"); got != "" {
				t.Fatalf("--inbox created outbox tables: %s", got)
			}
			if out := migrate("--down", "0"); !strings.Contains(out, "reverted 2 migration(s) [2 1], now at version 0") {
				t.Fatalf("--down 0: %q", out)
			}
			if got := it.list(t, "events_in"); got != "" {
				t.Fatalf("tables after --down 0: %s", got)
			}
			// Bad input: one clear line, nothing created.
			for _, bad := range [][]string{{"--inbox-table", "x`; DROP TABLE y; --"}, {"--down", "7"}} {
				_, stderr, code := run(t, []string{"OUTBOX_DB="}, append(append([]string{"migrate", "--inbox"}, it.flags...), bad...)...)
				line := strings.TrimRight(stderr, "\n")
				if code == 0 || strings.Contains(line, "\n") || !strings.HasPrefix(line, "outbox: ") {
					t.Fatalf("migrate --inbox %v: exit %d, stderr %q; want one error line", bad, code, stderr)
				}
			}
			if got := it.list(t, "events_in") + it.list(t, "x") + it.list(t, "inbox"); got != "" {
				t.Fatalf("tables after refused runs: %s", got)
			}
		})
	}
}
