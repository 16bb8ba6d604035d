package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outboxkit/outbox/internal/confval"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/relayd"
)

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "outbox",
		Short:         "Transactional outbox: migrate tables, relay events to a broker, report status",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       versionText(),
	}
	root.SetVersionTemplate("{{.Version}}")
	root.AddCommand(newVersion())
	root.AddCommand(newDemo(), newMigrate(), newRelay(), newStatus(), newDLQ(), newBench(), newConsole())
	root.AddCommand(newPauseCmd(true), newPauseCmd(false), newHeld())
	root.AddCommand(newContract(), newReconcile(), newRetention())
	root.AddCommand(newAudit(), newGrants(), newCDC(), newMask(), newInbox())
	return root
}

// dbFlags are the flags every command that talks to the database takes.
type dbFlags struct {
	db, schema, table string
}

// dbHelp is --db's help.
const dbHelp = "database URL: postgres://user@host:5432/db, mysql://user:pass@host:3306/db, or sqlite://path/to/file.db (or OUTBOX_DB)"

func (f *dbFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.db, "db", "", dbHelp)
	f.registerTable(cmd)
}

// registerPostgres registers --db, --schema and --table for a command
// that reads PostgreSQL only.
func (f *dbFlags) registerPostgres(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.db, "db", "", pgDBHelp)
	cmd.Flags().StringVar(&f.schema, "schema", "", "schema of the outbox table (default public)")
	cmd.Flags().StringVar(&f.table, "table", "outbox", "name of the outbox table")
}

// registerTable registers --schema and --table.
func (f *dbFlags) registerTable(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.schema, "schema", "", "schema of the outbox table (default: public on PostgreSQL, the URL's database on MySQL/MariaDB, main on SQLite)")
	cmd.Flags().StringVar(&f.table, "table", "outbox", "name of the outbox table")
}

func (f *dbFlags) tableName() (outboxdriver.Table, error) {
	t := outboxdriver.Table{Schema: f.schema, Name: f.table}
	// An empty schema is the driver's default; check the rest now.
	check := t
	if check.Schema == "" {
		check.Schema = "default"
	}
	if err := check.Validate(); err != nil {
		return t, fmt.Errorf("--schema/--table: %w", err)
	}
	return t, nil
}

// withDB validates the table flags, opens the database --db names, and
// runs fn with the table and a Store that is closed afterwards.
func (f *dbFlags) withDB(cmd *cobra.Command, fn func(ctx context.Context, t outboxdriver.Table, st outboxdriver.Store) error) error {
	t, err := f.tableName()
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	st, schema, err := f.open(ctx, 2)
	if err != nil {
		return err
	}
	defer st.Close()
	if t.Schema == "" {
		t.Schema = schema
	}
	return fn(ctx, t, st)
}

// dbURL is --db, or OUTBOX_DB.
func (f *dbFlags) dbURL() (string, error) {
	raw := f.db
	if raw == "" {
		raw = os.Getenv("OUTBOX_DB")
	}
	if raw == "" {
		return "", errors.New("no database: pass --db postgres://user@host:5432/db or set OUTBOX_DB")
	}
	return raw, nil
}

// open opens the database --db names, chosen by the URL's scheme, with at
// most maxConns connections. It also returns the schema a table lives in
// when --schema is not given.
func (f *dbFlags) open(ctx context.Context, maxConns int32) (_ outboxdriver.Store, defaultSchema string, _ error) {
	raw, err := f.dbURL()
	if err != nil {
		return nil, "", err
	}
	db, err := relayd.OpenDB(ctx, raw, maxConns)
	if err != nil {
		return nil, "", err
	}
	return closingStore{db.Store, db}, db.Schema, nil
}

// closingStore closes the pool the command opened.
type closingStore struct {
	outboxdriver.Store
	db *relayd.DB
}

func (s closingStore) Close() error { s.db.Close(); return nil }

// connect opens a pool on --db (or OUTBOX_DB), which must name a
// PostgreSQL database, and checks it answers.
func (f *dbFlags) connect(ctx context.Context, maxConns int32) (*pgxpool.Pool, error) {
	raw, err := f.dbURL()
	if err != nil {
		return nil, err
	}
	return connectPostgres(ctx, raw, maxConns)
}

// postgresOnly refuses a database URL raw of another scheme than
// PostgreSQL's before anything is opened; why says which command needs
// PostgreSQL and why ("bench runs on PostgreSQL only (...)").
func postgresOnly(raw, why string) error {
	if scheme, _, ok := strings.Cut(strings.ToLower(raw), "://"); ok && scheme != "postgres" && scheme != "postgresql" {
		return fmt.Errorf("--db %s://...: %s; pass a postgres:// URL", scheme, why)
	}
	return nil
}

// pgDBHelp is --db's help for the commands that read PostgreSQL only.
const pgDBHelp = "PostgreSQL URL, e.g. postgres://user@host:5432/db (or OUTBOX_DB)"

// connectPostgres opens a pool on the PostgreSQL database raw names, and
// refuses any other database.
func connectPostgres(ctx context.Context, raw string, maxConns int32) (*pgxpool.Pool, error) {
	db, err := relayd.OpenDB(ctx, raw, maxConns)
	if err != nil {
		return nil, err
	}
	if db.Pool == nil {
		db.Close()
		return nil, fmt.Errorf("database URL %s: this reads PostgreSQL only (postgres://...)", redact(raw))
	}
	return db.Pool, nil
}

// redact hides a password in a URL.
func redact(raw string) string { return confval.RedactURL(raw) }

func newLogger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: use debug, info, warn or error", level)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}
