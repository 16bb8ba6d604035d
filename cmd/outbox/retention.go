package main

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/outboxkit/outbox/outboxdriver"
)

func newRetention() *cobra.Command {
	var f dbFlags
	var m outboxdriver.TimePartitionMaintenance
	var actor string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "retention",
		Short: "Make the time partitions ahead and drop the old, fully published ones (PostgreSQL)",
		Long: `Maintain a table partitioned by time (outbox migrate --time-partitions):
make the partitions ahead of now, and drop every partition whose range
ended at least --keep-for ago once none of its events is unpublished and
none was published within --keep-for. A partition that still holds an
unpublished event is never dropped: it is listed as kept, and outbox
status shows it. Relays do the same every minute; run this from a
scheduler when no relay runs, or to drop at once. Each drop is audited.

Making and dropping a partition locks the table exclusively for a moment;
--lock-timeout bounds each wait for that lock (writers queue behind a
waiting lock), and what could not lock is listed as busy and done next
time (docs/retention.md).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := firstError(
				durationIn("keep-for", m.KeepFor, 0, 0),
				durationIn("lock-timeout", m.LockTimeout, time.Millisecond, time.Minute),
			); err != nil {
				return err
			}
			m.Actor = cliActor(actor).Name
			return f.withDB(cmd, func(ctx context.Context, t outboxdriver.Table, st outboxdriver.Store) error {
				if cs, wrapped := st.(closingStore); wrapped && cs.db.Scheme != "postgres" {
					return fmt.Errorf("%s: %w", t, outboxdriver.ErrNoTimePartitions)
				}
				s, err := st.Status(ctx, t)
				if err != nil {
					return err
				}
				if s.TimePartitions == nil {
					return fmt.Errorf("%s is not partitioned by time: nothing to maintain (a table is partitioned when it is created: outbox migrate --time-partitions day|hour)", t)
				}
				changes, err := st.MaintainTimePartitions(ctx, t, m)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				if asJSON {
					if changes == nil {
						changes = []outboxdriver.TimePartitionChange{}
					}
					return json.NewEncoder(out).Encode(changes)
				}
				if len(changes) == 0 {
					fmt.Fprintf(out, "%s: nothing to do\n", t)
					return nil
				}
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ACTION\tPARTITION\tDETAIL")
				for _, c := range changes {
					fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Action, c.Partition, oneLineText(c.Detail, 120))
				}
				return tw.Flush()
			})
		},
	}
	f.register(cmd)
	cmd.Flags().DurationVar(&m.KeepFor, "keep-for", 24*time.Hour, "drop a partition whose range ended this long ago once it is fully published (0 drops none)")
	cmd.Flags().DurationVar(&m.LockTimeout, "lock-timeout", outboxdriver.DefaultPartitionLockTimeout, "longest wait for the table's lock per partition made or dropped")
	cmd.Flags().StringVar(&actor, "actor", "", "who the audit log names for each drop (default: user@host)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array of what was done")
	return cmd
}
