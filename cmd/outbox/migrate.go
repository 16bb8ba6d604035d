package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outboxkit/outbox/inbox/inboxpgx"
	"github.com/outboxkit/outbox/inbox/inboxsql"
	"github.com/outboxkit/outbox/outboxdriver"
)

func newMigrate() *cobra.Command {
	var f dbFlags
	var down int
	var opts outboxdriver.MigrateOptions
	var inboxOnly bool
	var inboxTable string
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade the outbox table, its dead-letter table and wake-up trigger",
		Long: `Create or upgrade the outbox table in one transaction. Migrations are
versioned; a second run changes nothing. --down N reverts to version N
(--down 0 drops the outbox tables and their data).

--inbox creates or upgrades a consumer's inbox tables (--inbox-table, its
_versions, _dead_letter and _migrations companions) instead of the outbox:
a service that consumes and publishes runs migrate once with and once
without it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if inboxOnly {
				return f.migrateInbox(cmd, inboxTable, down)
			}
			return f.withDB(cmd, func(ctx context.Context, t outboxdriver.Table, st outboxdriver.Store) error {
				out := cmd.OutOrStdout()
				if cmd.Flags().Changed("down") {
					if down < 0 || down > st.LatestVersion() {
						return fmt.Errorf("--down %d: use a version between 0 and %d", down, st.LatestVersion())
					}
					vs, err := st.MigrateDown(ctx, t, down)
					if err != nil {
						return err
					}
					fmt.Fprintf(out, "%s: reverted %d migration(s) %v, now at version %d\n", t, len(vs), vs, down)
					return nil
				}
				vs, err := st.Migrate(ctx, t, &opts)
				if err != nil {
					return err
				}
				if len(vs) == 0 {
					fmt.Fprintf(out, "%s: already at version %d, nothing to do\n", t, st.LatestVersion())
				} else {
					fmt.Fprintf(out, "%s: applied migration(s) %v, now at version %d\n", t, vs, st.LatestVersion())
				}
				return nil
			})
		},
	}
	f.register(cmd)
	cmd.Flags().IntVar(&down, "down", 0, "revert to this schema version instead of upgrading")
	cmd.Flags().IntVar(&opts.Partitions, "partitions", 64, "number of partitions aggregates hash into (fixed at creation; bounds how many relays share the table)")
	cmd.Flags().BoolVar(&inboxOnly, "inbox", false, "migrate the consumer-side inbox tables instead of the outbox (PostgreSQL, MySQL/MariaDB and SQLite)")
	cmd.Flags().StringVar(&inboxTable, "inbox-table", "inbox", "name of the inbox table, with --inbox")
	return cmd
}

// migrateInbox creates, upgrades or (--down) reverts the inbox tables
// named by --schema and --inbox-table.
func (f *dbFlags) migrateInbox(cmd *cobra.Command, name string, down int) error {
	if err := outboxdriver.ValidateIdent("--inbox-table", name); err != nil {
		return err
	}
	return f.withDB(cmd, func(ctx context.Context, t outboxdriver.Table, st outboxdriver.Store) error {
		t.Name = name
		if err := t.Validate(); err != nil {
			return fmt.Errorf("--inbox-table: %w", err)
		}
		raw, _ := f.dbURL()
		scheme, _, _ := strings.Cut(strings.ToLower(raw), "://")
		var (
			migrate     func(context.Context, outboxdriver.Table) ([]int, error)
			migrateDown func(context.Context, outboxdriver.Table, int) ([]int, error)
			latest      int
		)
		pg, isPG := st.(interface{ Pool() *pgxpool.Pool })
		lite, isSQL := st.(interface{ DB() *sql.DB })
		switch {
		case isPG && (scheme == "postgres" || scheme == "postgresql"):
			migrate = func(ctx context.Context, t outboxdriver.Table) ([]int, error) {
				return inboxpgx.Migrate(ctx, pg.Pool(), t)
			}
			migrateDown = func(ctx context.Context, t outboxdriver.Table, v int) ([]int, error) {
				return inboxpgx.MigrateDown(ctx, pg.Pool(), t, v)
			}
			latest = inboxpgx.LatestVersion()
		case isSQL && (scheme == "sqlite" || scheme == "mysql"):
			dialect := inboxsql.SQLite
			if scheme == "mysql" {
				dialect = inboxsql.MySQL
			}
			migrate = func(ctx context.Context, t outboxdriver.Table) ([]int, error) {
				return inboxsql.Migrate(ctx, lite.DB(), dialect, t)
			}
			migrateDown = func(ctx context.Context, t outboxdriver.Table, v int) ([]int, error) {
				return inboxsql.MigrateDown(ctx, lite.DB(), dialect, t, v)
			}
			latest = inboxsql.LatestVersion(dialect)
		default:
			return fmt.Errorf("--inbox: %s:// is not supported; use postgres://, mysql:// or sqlite://", scheme)
		}
		out := cmd.OutOrStdout()
		if cmd.Flags().Changed("down") {
			if down < 0 || down > latest {
				return fmt.Errorf("--down %d: use an inbox version between 0 and %d", down, latest)
			}
			vs, err := migrateDown(ctx, t, down)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "inbox %s: reverted %d migration(s) %v, now at version %d\n", t, len(vs), vs, down)
			return nil
		}
		vs, err := migrate(ctx, t)
		if err != nil {
			return err
		}
		if len(vs) == 0 {
			fmt.Fprintf(out, "inbox %s: already at version %d, nothing to do\n", t, latest)
		} else {
			fmt.Fprintf(out, "inbox %s: applied migration(s) %v, now at version %d\n", t, vs, latest)
		}
		return nil
	})
}
