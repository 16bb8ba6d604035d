package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/outboxkit/outbox/internal/grants"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/relayd"
)

func newGrants() *cobra.Command {
	var f dbFlags
	var r grants.Roles
	var apply bool
	cmd := &cobra.Command{
		Use:   "grants --db URL --writer ROLE --relay ROLE --console ROLE [--owner ROLE] [--apply]",
		Short: "Give existing database roles exactly their job on the outbox table: print the GRANTs, or run them",
		Long: `Give existing database roles exactly their job on the outbox table and its
companions (docs/security.md): the writer inserts events and nothing else;
the relay claims, marks, retries, dead-letters and cleans up events and
holds leases; the console does what the operations do (dead letters,
pauses, held aggregates, requests, replay, repair) and reads and appends
the audit; the owner owns the tables and their DDL, and alone prunes the
audit. Whatever the job roles held on these objects before is revoked; a
job left out leaves its role alone.

It prints the SQL to review (and run with psql or mysql), or with --apply
runs it: on PostgreSQL in one transaction; on MySQL/MariaDB, which commits
each GRANT, statement by statement. Run it as a role that may grant (the
owner, or a superuser; on MySQL/MariaDB an account that may read the mysql
schema, such as root), after outbox migrate. The roles must exist; name
MySQL accounts as USER or USER@HOST, or a MariaDB role (CREATE ROLE) by
its name: the accounts that do its job need it as their default role (SET
DEFAULT ROLE). --owner hands the tables to another
role (on PostgreSQL; on MySQL/MariaDB it grants that account every right
on them). Log tailing of PostgreSQL needs what no GRANT gives: the output
says what to run as a superuser; on MySQL/MariaDB --relay-binlog grants a
relay that tails the binary log its replication privileges. SQLite has no roles: whoever can write the file can
change anything.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t, err := f.tableName()
			if err != nil {
				return err
			}
			raw, err := f.dbURL()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			db, err := relayd.OpenDB(ctx, raw, 2)
			if err != nil {
				return err
			}
			defer db.Close()
			if t.Schema == "" {
				t.Schema = db.Schema
			}
			plan, err := planGrants(ctx, db, t, r)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if !apply {
				fmt.Fprint(out, plan.Text())
				return nil
			}
			if db.Pool != nil {
				err = grants.ApplyPostgres(ctx, db.Pool, plan)
			} else {
				err = grants.ApplyMySQL(ctx, db.SQL, plan)
			}
			if err != nil {
				return fmt.Errorf("grants on %s: %w", t, err)
			}
			fmt.Fprintf(out, "%s: %d statement(s) applied\n", t, len(plan.Statements))
			for _, h := range plan.Header[1:] {
				fmt.Fprintf(out, "  %s\n", h)
			}
			for _, n := range plan.Notes {
				fmt.Fprintf(out, "note: %s\n", n)
			}
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&r.Writer, "writer", "", "role of the services that write events: INSERT on the outbox table, nothing else")
	cmd.Flags().StringVar(&r.Relay, "relay", "", "role of the relays")
	cmd.Flags().StringVar(&r.Console, "console", "", "role of the console and of the operators' commands (dlq, held, pause, audit)")
	cmd.Flags().StringVar(&r.Owner, "owner", "", "role that owns the tables, runs migrate and prunes the audit (default: the tables' owner now)")
	cmd.Flags().BoolVar(&r.RelayBinlog, "relay-binlog", false, "MySQL/MariaDB: the relays tail the binary log (relay --source binlog): also grant them REPLICATION SLAVE and REPLICATION CLIENT on the whole server")
	cmd.Flags().BoolVar(&apply, "apply", false, "run the statements instead of printing them")
	return cmd
}

// errNoRoles is the answer on SQLite.
var errNoRoles = errors.New("SQLite has no roles: whoever can write the database file can change anything in it (events, dead letters, the audit); protect the file with the file system's permissions (docs/security.md)")

// planGrants reads the plan for t on the database db opened.
func planGrants(ctx context.Context, db *relayd.DB, t outboxdriver.Table, r grants.Roles) (grants.Plan, error) {
	switch db.Scheme {
	case "postgres":
		return grants.Postgres(ctx, db.Pool, t, r)
	case "mysql":
		return grants.MySQL(ctx, db.SQL, t, r)
	default:
		return grants.Plan{}, errNoRoles
	}
}
