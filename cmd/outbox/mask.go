package main

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/outboxkit/outbox/contract"
	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
)

// newMask is `outbox mask`: the masking stored with the table, which
// every command, the console and its JSON API apply.
func newMask() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "mask",
		Short: "Add, remove, list or import the payload paths masked everywhere, stored with the table (audited)",
		Long: `The masking stored with the table: payload paths (customer.email,
cards.*.number; * matches any key or array index) that 'outbox dlq show', the
console and its JSON API mask in every payload they show, without flags on
each command. A path applies to every event, or to the events of one
aggregate type (--aggregate-type), one event type (--type) or both. Running
consoles see a change within two seconds. Each change writes an audit row.
--sensitive-path and --contracts keep working and add to what is stored.

Run it as the table's owner: 'outbox grants' gives the relay and the console
read access only (docs/security.md).`,
	}
	cmd.AddCommand(newMaskChange(true), newMaskChange(false), newMaskList(), newMaskImport())
	return cmd
}

// maskScope are the flags that narrow a stored path to some events.
type maskScope struct {
	aggregateType, typ string
}

func (s *maskScope) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&s.aggregateType, "aggregate-type", "", "only the events of this aggregate type (default: every event)")
	cmd.Flags().StringVar(&s.typ, "type", "", "only the events of this event type (default: every event)")
}

func newMaskChange(add bool) *cobra.Command {
	var f dbFlags
	var scope maskScope
	var actor, reason string
	use, short := "add", "Mask a payload path wherever a payload of the table is shown (audited)"
	if !add {
		use, short = "remove", "Stop masking a stored payload path (audited; a reason is required)"
	}
	cmd := &cobra.Command{
		Use:   use + " PATH [--aggregate-type T] [--type E]",
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p := outboxdriver.MaskPath{AggregateType: scope.aggregateType, Type: scope.typ, Path: args[0], Source: outboxdriver.MaskSourceOperator}
			if err := ops.CheckMaskPath(p); err != nil {
				return fmt.Errorf("mask %s: %w", use, err)
			}
			return f.withOps(cmd, 2, nil, func(ctx context.Context, o *ops.Ops, _ outboxdriver.Store) error {
				do := o.AddMaskPath
				if !add {
					do = o.RemoveMaskPath
				}
				changed, err := do(ctx, cliActor(actor), p, reason)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				switch {
				case add && changed:
					fmt.Fprintf(out, "masked %s: every command and console shows %q instead\n", p, ops.Mask)
				case add:
					fmt.Fprintf(out, "%s was masked already\n", p)
				case changed:
					fmt.Fprintf(out, "no longer masked by the table: %s\n", p)
				default:
					return fmt.Errorf("mask remove: %s is not stored (list them with `outbox mask list`)", p)
				}
				return nil
			})
		},
	}
	f.register(cmd)
	scope.register(cmd)
	cmd.Flags().StringVar(&actor, "actor", "", "who acts, for the audit table (default user@host); the command line acts with the operator role")
	if add {
		cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit table")
	} else {
		cmd.Flags().StringVar(&reason, "reason", "", "why (required), for the audit table")
	}
	return cmd
}

func newMaskList() *cobra.Command {
	var f dbFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the payload paths stored with the table as masked",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.withOps(cmd, 2, nil, func(ctx context.Context, o *ops.Ops, _ outboxdriver.Store) error {
				ps, err := o.MaskPaths(ctx, cliActor(""))
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				if asJSON {
					return json.NewEncoder(out).Encode(map[string]any{"paths": ps})
				}
				if len(ps) == 0 {
					fmt.Fprintln(out, "no path is stored as masked")
					return nil
				}
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "PATH\tSCOPE\tSOURCE\tBY\tAT")
				for _, p := range ps {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.Path, p.Scope(), p.Source, p.Actor, p.At.UTC().Format("2006-01-02 15:04:05Z"))
				}
				return tw.Flush()
			})
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the paths as JSON")
	return cmd
}

func newMaskImport() *cobra.Command {
	var f dbFlags
	var dir, actor, reason string
	cmd := &cobra.Command{
		Use:   "import --contracts DIR",
		Short: "Store the sensitive and forbidden paths of a contract registry with the table (audited)",
		Long: `Store the sensitive and forbidden paths a contract registry names: each
contract's for its aggregate type and event type, the registry's own for every
event. Paths stored already are left as they are; paths a registry no longer
names stay until 'outbox mask remove' removes them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			reg, err := contract.Load(dir)
			if err != nil {
				return fmt.Errorf("--contracts: %w", err)
			}
			want := ops.ContractMaskPaths(reg)
			for _, p := range want {
				if err := ops.CheckMaskPath(p); err != nil {
					return fmt.Errorf("--contracts %s: %w", dir, err)
				}
			}
			return f.withOps(cmd, 2, nil, func(ctx context.Context, o *ops.Ops, _ outboxdriver.Store) error {
				added := 0
				for _, p := range want {
					changed, err := o.AddMaskPath(ctx, cliActor(actor), p, reason)
					if err != nil {
						if added == 0 {
							return err
						}
						return fmt.Errorf("mask import: after %d path(s) stored: %w", added, err)
					}
					if changed {
						added++
					}
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%d path(s) from %s: %d stored, %d there already\n", len(want), dir, added, len(want)-added)
				return nil
			})
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&dir, "contracts", "", "contract registry folder (with contracts.json)")
	cmd.Flags().StringVar(&actor, "actor", "", "who acts, for the audit table (default user@host); the command line acts with the operator role")
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit table")
	_ = cmd.MarkFlagRequired("contracts")
	return cmd
}
