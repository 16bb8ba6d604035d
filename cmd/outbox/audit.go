package main

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
)

func newAudit() *cobra.Command {
	var f dbFlags
	var asJSON bool
	var limit int
	var q outboxdriver.AuditQuery
	var since, until string
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Show the audit trail, newest first: actions, requests, sign-ins, refusals (append-only; see 'audit prune')",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := intIn("limit", limit, 1, 1_000_000); err != nil {
				return err
			}
			var err error
			if q.Since, err = cliTime("since", since); err != nil {
				return err
			}
			if q.Until, err = cliTime("until", until); err != nil {
				return err
			}
			q.Limit = limit
			return f.withOps(cmd, 2, &ops.Config{MaxPage: limit}, func(ctx context.Context, o *ops.Ops, _ outboxdriver.Store) error {
				records, err := o.Audit(ctx, cliActor(""), q)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				if asJSON {
					enc := json.NewEncoder(out)
					for _, r := range records {
						if err := enc.Encode(r); err != nil {
							return err
						}
					}
					return nil
				}
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tAT\tACTOR\tROLE\tACTION\tEVENT\tREQUEST\tDETAIL\tREASON")
				for _, r := range records {
					fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.At.UTC().Format("2006-01-02 15:04:05Z"), r.Actor, r.Role, r.Action,
						r.EventID, r.RequestID, oneLineText(r.Detail, 100), oneLineText(r.Reason, 60))
				}
				return tw.Flush()
			})
		},
	}
	f.register(cmd)
	fl := cmd.Flags()
	fl.BoolVar(&asJSON, "json", false, "print JSON lines (with the before and after of a repair)")
	fl.IntVar(&limit, "limit", 100, "most rows shown")
	fl.StringVar(&q.Actor, "actor", "", "only rows by this actor")
	fl.StringVar(&q.Action, "action", "", "only rows of this action (retry, discard, pause, resume, release, reveal, request, approve, reject, cancel, expire, execute, finish, fail, repair, login, login-failed, logout, denied, audit-prune)")
	fl.StringVar(&q.EventID, "event", "", "only rows about this event id")
	fl.StringVar(&q.RequestID, "request", "", "only rows about this request id")
	fl.StringVar(&since, "since", "", "only rows at or after this time (RFC 3339, or 2006-01-02T15:04 / 2006-01-02 in UTC)")
	fl.StringVar(&until, "until", "", "only rows before this time")
	cmd.AddCommand(newAuditPrune())
	return cmd
}

func newAuditPrune() *cobra.Command {
	var f dbFlags
	var before, actor, reason string
	cmd := &cobra.Command{
		Use:   "prune --before TIME",
		Short: "Delete audit rows older than TIME: the audit's one retention command (itself audited)",
		Long: `Delete the audit rows older than --before. The audit table refuses UPDATE,
DELETE and TRUNCATE from anyone else; this command goes through the one
database function allowed to delete, which records what it deleted as a
new audit row (action audit-prune) with --actor and --reason.

Run it as the owner role: connect with --db as the role that owns the
tables (on MySQL/MariaDB the account that ran migrate, or one 'outbox grants
--owner' named). The console's, the relay's and the writers' roles are
refused, with an error saying that only the owner prunes (docs/security.md).
SQLite has no roles: whoever can write the file prunes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if before == "" {
				return fmt.Errorf("audit prune: --before is required: rows older than it are deleted")
			}
			t, err := cliTime("before", before)
			if err != nil {
				return err
			}
			return f.withOps(cmd, 2, nil, func(ctx context.Context, o *ops.Ops, _ outboxdriver.Store) error {
				n, err := o.PruneAudit(ctx, cliActor(actor), t, reason)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%d audit row(s) older than %s deleted\n", n, t.Format(time.RFC3339))
				return nil
			})
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&before, "before", "", "delete rows older than this time (RFC 3339, or 2006-01-02 in UTC)")
	cmd.Flags().StringVar(&actor, "actor", "", "who prunes, for the audit (default user@host)")
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit (the retention policy)")
	return cmd
}

// cliTime reads a time flag (ops.ParseTime).
func cliTime(flag, s string) (time.Time, error) {
	t, err := ops.ParseTime(flag, s)
	if err != nil {
		return t, fmt.Errorf("--%s %q: want a time such as 2006-01-02T15:04:05Z or 2006-01-02", flag, s)
	}
	return t, nil
}
