package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
)

// newPauseCmd is `outbox pause` (pause is true) or `outbox resume`.
func newPauseCmd(pause bool) *cobra.Command {
	var f dbFlags
	var scope, actor, reason string
	use, short := "pause", "Stop the relays from publishing everything, one destination or one aggregate type (audited)"
	if !pause {
		use, short = "resume", "Lift a pause: the paused events flow again (audited)"
	}
	cmd := &cobra.Command{
		Use:   use + " --scope all|destination=NAME|aggregatetype=NAME --reason TEXT",
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := outboxdriver.ParsePauseScope(scope)
			if err != nil {
				return fmt.Errorf("%s: %w", use, err)
			}
			return f.withOps(cmd, 2, nil, func(ctx context.Context, o *ops.Ops, _ outboxdriver.Store) error {
				do := o.Pause
				if !pause {
					do = o.Resume
				}
				changed, err := do(ctx, cliActor(actor), s, reason)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				switch {
				case pause && changed:
					fmt.Fprintf(out, "paused %s: every relay stops claiming it within one poll interval\n", s)
				case pause:
					fmt.Fprintf(out, "%s was paused already\n", s)
				case changed:
					fmt.Fprintf(out, "resumed %s\n", s)
				default:
					return fmt.Errorf("resume: %s is not paused", s)
				}
				return nil
			})
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&scope, "scope", "", "what: all, destination=NAME (as routed) or aggregatetype=NAME")
	cmd.Flags().StringVar(&actor, "actor", "", "who acts, for the audit table (default user@host); the command line acts with the operator role")
	if pause {
		cmd.Flags().StringVar(&reason, "reason", "", "why (required), for the audit table and outbox status")
	} else {
		cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit table")
	}
	_ = cmd.MarkFlagRequired("scope")
	return cmd
}

// printPauses lists the pauses in force for `outbox status`.
func printPauses(out io.Writer, ps []outboxdriver.Pause) {
	if len(ps) == 0 {
		fmt.Fprintf(out, "paused                    nothing\n")
		return
	}
	fmt.Fprintf(out, "paused                    %d scope(s)\n", len(ps))
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  SCOPE\tSINCE\tBY\tREASON")
	for _, p := range ps {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", p.PauseScope, p.Since.UTC().Format("2006-01-02 15:04:05Z"), p.Actor, oneLineText(p.Reason, 80))
	}
	tw.Flush()
}
