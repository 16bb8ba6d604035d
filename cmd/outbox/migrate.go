package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/outboxkit/outbox/outboxdriver"
)

func newMigrate() *cobra.Command {
	var f dbFlags
	var down int
	var opts outboxdriver.MigrateOptions
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade the outbox table, its dead-letter table and wake-up trigger",
		Long: `Create or upgrade the outbox table in one transaction. Migrations are
versioned; a second run changes nothing. --down N reverts to version N
(--down 0 drops the outbox tables and their data).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
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
	return cmd
}
