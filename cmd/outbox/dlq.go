package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
)

func newDLQ() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "List, retry or discard dead-lettered events (every action is audited)",
	}
	cmd.AddCommand(newDLQList(), newDLQShow(), newDLQAct("retry"), newDLQAct("discard"), newDLQAudit())
	return cmd
}

func newDLQList() *cobra.Command {
	var f dbFlags
	var asJSON bool
	var limit int
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List dead letters, oldest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := intIn("limit", limit, 1, 1_000_000); err != nil {
				return err
			}
			return f.withOps(cmd, 2, &ops.Config{MaxPage: limit}, func(ctx context.Context, o *ops.Ops, _ outboxdriver.Store) error {
				page, err := o.DeadLetters(ctx, cliActor(""), outboxdriver.DeadLetterQuery{Limit: limit})
				if err != nil {
					return err
				}
				dls := page.DeadLetters
				out := cmd.OutOrStdout()
				if asJSON {
					if dls == nil {
						dls = []outboxdriver.DeadLetter{}
					}
					return json.NewEncoder(out).Encode(dls)
				}
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tAGGREGATE\tTYPE\tATTEMPTS\tHOLDS AGGREGATE\tDEAD-LETTERED\tLAST ERROR")
				for _, d := range dls {
					fmt.Fprintf(tw, "%s\t%s/%s\t%s\t%d\t%v\t%s\t%s\n", d.ID, d.AggregateType, d.AggregateID, d.Type, d.Attempts, d.Held,
						d.DeadLetteredAt.UTC().Format("2006-01-02 15:04:05Z"), oneLineText(d.LastError, 120))
				}
				return tw.Flush()
			})
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	cmd.Flags().IntVar(&limit, "limit", 1000, "most dead letters listed")
	return cmd
}

func newDLQAct(action string) *cobra.Command {
	var f dbFlags
	var all bool
	var actor, reason string
	short := map[string]string{
		"retry":   "Move dead letters back into the outbox (same id, same place in their aggregate)",
		"discard": "Delete dead letters for good and release the aggregates held behind them",
	}[action]
	cmd := &cobra.Command{
		Use:   action + " ID...|--all",
		Short: short,
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) > 0) {
				return fmt.Errorf("dlq %s: give event ids or --all, not both or neither", action)
			}
			var ids []string
			for _, a := range args {
				u, err := uuid.Parse(a)
				if err != nil {
					return fmt.Errorf("dlq %s: %q is not an event id (a UUID)", action, a)
				}
				ids = append(ids, u.String())
			}
			return f.withOps(cmd, 2, nil, func(ctx context.Context, o *ops.Ops, _ outboxdriver.Store) error {
				do := o.Retry
				if action == "discard" {
					do = o.Discard
				}
				done, err := do(ctx, cliActor(actor), ids, reason)
				if err != nil {
					return err
				}
				verb := map[string]string{"retry": "moved back into the outbox", "discard": "discarded"}[action]
				fmt.Fprintf(cmd.OutOrStdout(), "%d dead letter(s) %s\n", len(done), verb)
				if missing := len(ids) - len(done); len(ids) > 0 && missing > 0 {
					return errors.New(notFound(ids, done))
				}
				return nil
			})
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&all, "all", false, "act on every dead letter")
	cmd.Flags().StringVar(&actor, "actor", "", "who acts, for the audit table (default user@host); the command line acts with the operator role")
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit table")
	return cmd
}

func newDLQAudit() *cobra.Command {
	var f dbFlags
	var limit int
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Show the newest operator actions on dead letters as JSON lines",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := intIn("limit", limit, 1, 1_000_000); err != nil {
				return err
			}
			return f.withOps(cmd, 2, &ops.Config{MaxPage: limit}, func(ctx context.Context, o *ops.Ops, _ outboxdriver.Store) error {
				records, err := o.Audit(ctx, cliActor(""), outboxdriver.AuditQuery{Limit: limit})
				if err != nil {
					return err
				}
				enc := json.NewEncoder(cmd.OutOrStdout())
				for _, r := range records {
					if err := enc.Encode(r); err != nil {
						return err
					}
				}
				return nil
			})
		},
	}
	f.register(cmd)
	cmd.Flags().IntVar(&limit, "limit", 100, "most entries shown")
	return cmd
}

func notFound(asked, done []string) string {
	got := map[string]bool{}
	for _, id := range done {
		got[id] = true
	}
	var miss []string
	for _, id := range asked {
		if !got[id] {
			miss = append(miss, id)
		}
	}
	return "no dead letter with id " + strings.Join(miss, ", ")
}

// cliActor is who acts on the command line: name (default user@host) with
// the operator role. Whoever can run the command can reach the database
// with its credentials anyway; the console is where roles are enforced.
func cliActor(name string) ops.Actor {
	if name == "" {
		name = defaultActor()
	}
	return ops.Actor{Name: name, Role: ops.Operator}
}

func defaultActor() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, _ := os.Hostname()
	return name + "@" + host
}

func oneLineText(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > max {
		s = s[:max] + "..."
	}
	return s
}
