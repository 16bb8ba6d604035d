package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/outboxkit/outbox/inbox/inboxpgx"
	"github.com/outboxkit/outbox/inbox/inboxsql"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/relayd"
)

func newMigrate() *cobra.Command {
	var f dbFlags
	var down int
	var opts outboxdriver.MigrateOptions
	var inboxOnly, force bool
	var inboxTable string
	var cdc cdcSetupFlags
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade the outbox table, its dead-letter table and wake-up trigger",
		Long: `Create or upgrade the outbox table in one transaction. Migrations are
versioned; a second run changes nothing. --down N reverts to version N.
--down 0 drops the outbox tables and their data: it refuses, saying how
many rows would be lost, while the table holds unpublished or kept events
or dead letters, unless --force is given.

--partitions is fixed when the table is created: on an existing table a
different count is refused (drain it, --down 0 and migrate again to
change it).

--time-partitions day|hour creates the outbox table partitioned by
created_at in UTC days or hours, so that published events go by dropping
whole partitions instead of deleting rows (PostgreSQL; docs/retention.md).
Like --partitions it is chosen when the table is created: an existing
table is not converted. Relays (and outbox retention) make the partitions
ahead and drop old ones; a default partition takes any row no partition
covers, so a writer never fails for want of one.

--inbox creates or upgrades a consumer's inbox tables (--inbox-table, its
_versions, _dead_letter and _migrations companions) instead of the outbox:
a service that consumes and publishes runs migrate once with and once
without it.

A new table has no notify trigger (--wakeups writers, the default since
schema version 26): the library's writers (outboxpgx, outboxsql) send the
wake-up themselves, only while a relay waits, and inserts cost less;
events written with plain SQL wake no relay and are found at its next
look (docs/relay.md shows the statement that wakes it). --wakeups trigger
puts the trigger back, for every writer; --wakeups writers drops it.
Either applies to an existing table too (PostgreSQL).

--cdc also creates what log tailing (outbox relay --source cdc) streams
from: the publication of the table's inserts and the replication slot
(PostgreSQL; wal_level = logical, a role with REPLICATION). Writers in
message and insert-delete mode need the slot before their first event:
--cdc-mode message or insert-delete implies --cdc. --down 0 drops them
again.

Before it applies anything, migrate lists the live relays of the table
(name, release, schema version, last renewal; on PostgreSQL also the
log-tailing relays that hold a replication slot's lease, named with the
slot) and refuses a pending migration that needs newer relays than some
of them run with (a relay of a release that records no version counts as
older), naming them: replace them with this release first, or run again
with --force, after which they stop claiming until replaced
(docs/operations.md, Upgrades).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := intIn("partitions", opts.Partitions, 1, outboxdriver.MaxPartitions); err != nil {
				return err
			}
			if force && (inboxOnly || (cmd.Flags().Changed("down") && down != 0)) {
				return fmt.Errorf("--force goes with the outbox tables' migration (it applies migrations older live relays cannot work with) or with --down 0 (it drops the tables with the events still in them), not with --inbox or --down N")
			}
			opts.IgnoreRelaysBehind = force
			if cmd.Flags().Changed("cdc-mode") && cdc.mode != "table" {
				// Their writers need the slot before their first event, as
				// Migrate with a driver in those modes makes it.
				cdc.on = true
			}
			if opts.Wakeups != "" && (inboxOnly || cmd.Flags().Changed("down")) {
				return fmt.Errorf("--wakeups goes with the outbox table's migration, not with --inbox or --down")
			}
			if opts.TimePartitions != "" && (inboxOnly || cdc.on || cmd.Flags().Changed("down")) {
				return fmt.Errorf("--time-partitions goes with the creation of an outbox table only, not with --inbox, --cdc or --down: log tailing does not read partitioned tables")
			}
			if inboxOnly {
				return f.migrateInbox(cmd, inboxTable, down)
			}
			return f.withDB(cmd, func(ctx context.Context, t outboxdriver.Table, st outboxdriver.Store) error {
				out := cmd.OutOrStdout()
				if cmd.Flags().Changed("down") {
					if down < 0 || down > st.LatestVersion() {
						return fmt.Errorf("--down %d: use a version between 0 and %d", down, st.LatestVersion())
					}
					if down == 0 && !force {
						if err := refuseToDropRows(ctx, t, st); err != nil {
							return err
						}
					}
					if down > 0 {
						if err := refuseToDropParked(ctx, t, st, down); err != nil {
							return err
						}
					}
					vs, err := st.MigrateDown(ctx, t, down)
					if err != nil {
						return err
					}
					fmt.Fprintf(out, "%s: reverted %d migration(s) %v, now at version %d\n", t, len(vs), vs, down)
					return nil
				}
				if cmd.Flags().Changed("partitions") {
					if err := refusePartitionChange(ctx, t, st, opts.Partitions); err != nil {
						return err
					}
				}
				listRelays(ctx, out, t, st)
				vs, err := st.Migrate(ctx, t, &opts)
				if err != nil {
					return err
				}
				if len(vs) == 0 {
					fmt.Fprintf(out, "%s: already at version %d, nothing to do\n", t, st.LatestVersion())
				} else {
					fmt.Fprintf(out, "%s: applied migration(s) %v, now at version %d\n", t, vs, st.LatestVersion())
				}
				switch opts.Wakeups {
				case outboxdriver.WakeupsTrigger:
					fmt.Fprintf(out, "%s: idle relays are woken by the notify trigger, for every writer\n", t)
				case outboxdriver.WakeupsWriters:
					fmt.Fprintf(out, "%s: idle relays are woken by the library's writers; no trigger (plain-SQL writers' events wait for a relay's next look)\n", t)
				}
				if cdc.on {
					return cdc.setup(ctx, out, t, st)
				}
				return nil
			})
		},
	}
	f.register(cmd)
	cmd.Flags().IntVar(&down, "down", 0, "revert to this schema version instead of upgrading")
	cmd.Flags().BoolVar(&force, "force", false, "upgrade even though live relays cannot work with a pending migration (they stop claiming until replaced); with --down 0: drop the tables even though they hold events or dead letters")
	cmd.Flags().IntVar(&opts.Partitions, "partitions", outboxdriver.DefaultPartitions, "number of partitions aggregates hash into (fixed at creation; bounds how many relays share the table)")
	cmd.Flags().StringVar(&opts.TimePartitions, "time-partitions", "", "day or hour: create the table partitioned by created_at, so that retention drops partitions (PostgreSQL; fixed at creation)")
	cmd.Flags().IntVar(&opts.TimePartitionsAhead, "time-partitions-ahead", 0, "with --time-partitions: how many days or hours ahead partitions are made (default 7 days, 48 hours)")
	cmd.Flags().StringVar(&opts.Wakeups, "wakeups", "", "trigger or writers: who wakes an idle relay (PostgreSQL; docs/relay.md): the notify trigger on every INSERT, or the library's writers while a relay waits (a new table's default: cheaper inserts; plain-SQL writers' events wait for the relay's next look); unset leaves an existing table as it is")
	cmd.Flags().BoolVar(&inboxOnly, "inbox", false, "migrate the consumer-side inbox tables instead of the outbox (PostgreSQL, MySQL/MariaDB and SQLite)")
	cmd.Flags().StringVar(&inboxTable, "inbox-table", "inbox", "name of the inbox table, with --inbox")
	cdc.register(cmd)
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
		var (
			migrate     func(context.Context, outboxdriver.Table) ([]int, error)
			migrateDown func(context.Context, outboxdriver.Table, int) ([]int, error)
			latest      int
		)
		var db *relayd.DB // the database the command opened, and its pool
		if cs, ok := st.(closingStore); ok {
			db = cs.db
		}
		scheme := ""
		if db != nil {
			scheme = db.Scheme
		}
		switch scheme {
		case "postgres":
			migrate = func(ctx context.Context, t outboxdriver.Table) ([]int, error) {
				return inboxpgx.Migrate(ctx, db.Pool, t)
			}
			migrateDown = func(ctx context.Context, t outboxdriver.Table, v int) ([]int, error) {
				return inboxpgx.MigrateDown(ctx, db.Pool, t, v)
			}
			latest = inboxpgx.LatestVersion()
		case "sqlite", "mysql":
			dialect := inboxsql.SQLite
			if scheme == "mysql" {
				dialect = inboxsql.MySQL
			}
			migrate = func(ctx context.Context, t outboxdriver.Table) ([]int, error) {
				return inboxsql.Migrate(ctx, db.SQL, dialect, t)
			}
			migrateDown = func(ctx context.Context, t outboxdriver.Table, v int) ([]int, error) {
				return inboxsql.MigrateDown(ctx, db.SQL, dialect, t, v)
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

// listRelays prints the live relays of t, with the release and schema
// version each runs with and when it last renewed: nothing for a table
// not made yet.
func listRelays(ctx context.Context, out io.Writer, t outboxdriver.Table, st outboxdriver.Store) {
	rs, err := st.Relays(ctx, t)
	if err != nil {
		return // not made yet, or too old to have relays: the migration says more
	}
	var live []outboxdriver.RelayStatus
	for _, r := range rs {
		if r.ExpiresIn > 0 {
			live = append(live, r)
		}
	}
	fmt.Fprintf(out, "%s: %d live relay(s)\n", t, len(live))
	for _, r := range live {
		renewed := "unknown"
		if !r.RenewedAt.IsZero() {
			renewed = r.RenewedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(out, "  %s: %s, last renewed %s\n", r.Name, outboxdriver.DescribeRelayVersion(r), renewed)
	}
}

// refuseToDropRows returns an error, saying how many of each, when
// dropping t would lose unpublished or kept events or dead letters.
func refuseToDropRows(ctx context.Context, t outboxdriver.Table, st outboxdriver.Store) error {
	s, err := st.Status(ctx, t)
	if errors.Is(err, outboxdriver.ErrNotMigrated) {
		return nil // nothing to lose
	}
	if err != nil {
		return fmt.Errorf("--down 0: cannot count the rows it would drop: %w (--force drops the tables without counting)", err)
	}
	if s.Backlog == 0 && s.Published == 0 && s.DeadLetters == 0 && s.Parked == 0 {
		return nil
	}
	return fmt.Errorf("--down 0 would drop %s with %d unpublished event(s), %d published event(s) kept by --retention keep, %d dead letter(s) and %d parked event(s); "+
		"let the relay publish them and retry or discard the dead letters (outbox dlq), or pass --force to drop them", t, s.Backlog, s.Published, s.DeadLetters, s.Parked)
}

// parkedSince is the PostgreSQL schema version that parks held
// aggregates' events (log tailing).
const parkedSince = 9

// refuseToDropParked returns an error when reverting t to version down
// would drop events that log tailing parked: they exist nowhere else.
func refuseToDropParked(ctx context.Context, t outboxdriver.Table, st outboxdriver.Store, down int) error {
	s, err := st.Status(ctx, t)
	if err != nil || down >= parkedSince || s.Parked == 0 {
		return nil // a table that cannot be read cannot be reverted either
	}
	return fmt.Errorf("--down %d would drop %d event(s) of held aggregates parked by log tailing, which exist nowhere else; "+
		"retry or discard the dead letters they wait behind (outbox dlq) and let the relay publish them first", down, s.Parked)
}

// refusePartitionChange returns an error when t exists with another number
// of partitions than n: the count is fixed when the table is created.
func refusePartitionChange(ctx context.Context, t outboxdriver.Table, st outboxdriver.Store, n int) error {
	s, err := st.Status(ctx, t)
	if err != nil || len(s.Partitions) == 0 || len(s.Partitions) == n {
		// Not created yet (or not yet partitioned): Migrate creates n.
		return nil
	}
	return fmt.Errorf("--partitions %d: %s already has %d partitions, and the count is fixed when the table is created; it cannot change "+
		"(to change it: drain the table, migrate --down 0, then migrate --partitions %d)", n, t, len(s.Partitions), n)
}
