package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
)

// TestUnmigratedTableSaysMigrate: every command that reads or changes
// the outbox's tables, run on a table never migrated, prints the one
// line that says to run `outbox migrate`, the same for every command, on
// PostgreSQL, MySQL/MariaDB and SQLite.
func TestUnmigratedTableSaysMigrate(t *testing.T) {
	t.Parallel()
	const id = "00000000-0000-4000-8000-000000000001"
	commands := []struct {
		args   []string
		pgOnly bool // the other databases refuse it before reading
		code   int
	}{
		{args: []string{"dlq", "list"}, code: 1},
		{args: []string{"dlq", "show", id}, code: 1},
		{args: []string{"dlq", "retry", id, "--reason", "r"}, code: 1},
		{args: []string{"dlq", "discard", id, "--reason", "r"}, code: 1},
		{args: []string{"dlq", "retry", "--all", "--reason", "r"}, code: 1},
		{args: []string{"dlq", "audit"}, code: 1},
		{args: []string{"held", "list"}, code: 1},
		{args: []string{"held", "release", id, "--reason", "r"}, code: 1},
		{args: []string{"pause", "--scope", "all", "--reason", "r"}, code: 1},
		{args: []string{"resume", "--scope", "destination=orders"}, code: 1},
		{args: []string{"audit"}, code: 1},
		{args: []string{"audit", "prune", "--before", "2020-01-01", "--reason", "r"}, code: 1},
		{args: []string{"mask", "list"}, code: 1},
		{args: []string{"mask", "add", "customer.email"}, code: 1},
		{args: []string{"mask", "remove", "customer.email", "--reason", "r"}, code: 1},
		{args: []string{"mask", "import", "--contracts", registryDir}, code: 1},
		{args: []string{"status"}, code: 1},
		{args: []string{"retention"}, pgOnly: true, code: 1},
		{args: []string{"reconcile"}, pgOnly: true, code: 2},
	}

	// A schema that exists, with no outbox table in it.
	pool := testenv.Pool(t)
	pg := testenv.Table(t, pool)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+outboxdriver.QuoteIdent(pg.Schema)); err != nil {
		t.Fatal(err)
	}
	admin := mysqlDB(t, mysqlServerURL())
	my := testenv.MySQLDatabase(t, admin, "t")
	sqliteFile := filepath.Join(t.TempDir(), "app.db")

	databases := []struct {
		name, driver, table string
		flags               []string
	}{
		{"postgres", "outboxpgx", pg.Schema + ".outbox", []string{"--db", dbURL(), "--schema", pg.Schema}},
		{"mysql", "outboxmysql", my + ".outbox", []string{"--db", mysqlURL(t, my)}},
		{"sqlite", "outboxsqlite", "main.outbox", []string{"--db", "sqlite://" + sqliteFile}},
	}
	for _, db := range databases {
		want := "outbox: " + db.driver + ": " + db.table + ": " + outboxdriver.ErrNotMigrated.Error() + "\n"
		for _, c := range commands {
			if c.pgOnly && db.name != "postgres" {
				continue
			}
			t.Run(db.name+"/"+strings.Join(c.args[:min(2, len(c.args))], "_"), func(t *testing.T) {
				t.Parallel()
				_, stderr, code := run(t, []string{"OUTBOX_DB="}, append(c.args, db.flags...)...)
				if code != c.code || stderr != want {
					t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", c.args, code, stderr, c.code, want)
				}
			})
		}
	}
}

// TestReconcileIsPostgreSQLOnly: reconcile's help offers a PostgreSQL URL
// only, and a MySQL or SQLite URL gets the one line saying so (exit 2)
// before anything is opened.
func TestReconcileIsPostgreSQLOnly(t *testing.T) {
	t.Parallel()
	help, _, code := run(t, nil, "reconcile", "--help")
	if code != 0 || !strings.Contains(help, "--db string                    "+pgDBHelp) || strings.Contains(help, "mysql://") || strings.Contains(help, "sqlite://") {
		t.Errorf("reconcile --help (exit %d) = %q; want --db offering a PostgreSQL URL only", code, help)
	}
	file := filepath.Join(t.TempDir(), "app.db")
	for _, url := range []string{"sqlite://" + file, mysqlServerURL()} {
		_, stderr, code := run(t, []string{"OUTBOX_DB="}, "reconcile", "--db", url)
		line := strings.TrimRight(stderr, "\n")
		if code != 2 || strings.Contains(line, "\n") || !strings.HasPrefix(line, "outbox: --db ") ||
			!strings.Contains(line, "reconcile reads PostgreSQL only") {
			t.Errorf("reconcile --db %s: exit %d, stderr %q; want exit 2 and one line saying reconcile reads PostgreSQL only", url, code, stderr)
		}
	}
	if _, err := os.Stat(file); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("reconcile --db sqlite://%s left a file behind (stat: %v); want nothing opened", file, err)
	}
}
