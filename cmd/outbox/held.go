package main

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
)

func newHeld() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "held",
		Short: "List aggregates held behind a failed event, or release one (audited)",
	}
	cmd.AddCommand(newHeldList(), newHeldRelease())
	return cmd
}

func newHeldList() *cobra.Command {
	var f dbFlags
	var asJSON bool
	var limit int
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List held aggregates, longest held first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := intIn("limit", limit, 1, 1_000_000); err != nil {
				return err
			}
			return f.withOps(cmd, 2, &ops.Config{MaxPage: limit}, func(ctx context.Context, o *ops.Ops, _ outboxdriver.Store) error {
				hs, err := o.Held(ctx, cliActor(""), limit)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				if asJSON {
					if hs == nil {
						hs = []outboxdriver.HeldAggregate{}
					}
					return json.NewEncoder(out).Encode(hs)
				}
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "AGGREGATE\tHELD BEHIND\tREASON\tSINCE\tWAITING\tLAST ERROR")
				for _, h := range hs {
					waiting := fmt.Sprint(h.Waiting)
					if h.Waiting < 0 {
						waiting = "-" // not counted: the backlog is too large
					}
					fmt.Fprintf(tw, "%s/%s\t%s\t%s\t%s\t%s\t%s\n", h.AggregateType, h.AggregateID, h.EventID, h.Reason,
						h.Since.UTC().Format("2006-01-02 15:04:05Z"), waiting, oneLineText(h.LastError, 100))
				}
				return tw.Flush()
			})
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	cmd.Flags().IntVar(&limit, "limit", 1000, "most aggregates listed")
	return cmd
}

func newHeldRelease() *cobra.Command {
	var f dbFlags
	var actor, reason string
	cmd := &cobra.Command{
		Use:   "release DEAD-LETTER-ID --reason TEXT",
		Short: "Let the aggregate held behind a dead letter flow on (the dead letter stays; order is given up)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return f.withOps(cmd, 2, nil, func(ctx context.Context, o *ops.Ops, _ outboxdriver.Store) error {
				h, err := o.Release(ctx, cliActor(actor), args[0], reason)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "released %s/%s (it was held behind dead letter %s)\n", h.AggregateType, h.AggregateID, h.EventID)
				return nil
			})
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&actor, "actor", "", "who acts, for the audit table (default user@host); the command line acts with the operator role")
	cmd.Flags().StringVar(&reason, "reason", "", "why (required), for the audit table")
	return cmd
}
