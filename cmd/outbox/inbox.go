package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/spf13/cobra"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/inboxpgx"
	"github.com/outboxkit/outbox/inbox/inboxsql"
	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/relayd"
)

func newInbox() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "inbox",
		Short: "Report on a consumer's inbox and act on its dead letters (every action is audited)",
	}
	dlq := &cobra.Command{
		Use:   "dlq",
		Short: "List, show, retry or discard a consumer's dead letters (every action is audited)",
		Long: `Dead letters are the messages a consumer could not handle (a permanent
error, or every attempt failed), kept as received in <inbox-table>_dead_letter.

retry marks dead letters for retry: a running consumer built on inbox/consumer
(every adapter but webhookconsumer) claims them within its RetryPoll (default
5s) and hands each message to its handler again, with its attempts afresh;
the dead letter is deleted once the message is handled, or replaced by a new
dead letter with the new error. discard deletes dead letters for good.

Retries and discards are written to the audit table of the outbox table
--schema/--table names in the same database (outbox dlq audit shows them),
before the change: run outbox migrate there once if the consumer's database
has no outbox tables.`,
	}
	dlq.AddCommand(newInboxDLQList(), newInboxDLQShow(), newInboxDLQAct("retry"), newInboxDLQAct("discard"))
	cmd.AddCommand(newInboxStatus(), dlq)
	return cmd
}

// inboxFlags are the flags every inbox command takes besides dbFlags.
type inboxFlags struct {
	dbFlags
	inboxTable, consumer string
}

func (f *inboxFlags) register(cmd *cobra.Command) {
	f.dbFlags.register(cmd)
	cmd.Flags().StringVar(&f.inboxTable, "inbox-table", inbox.DefaultTable, "name of the inbox table (in --schema)")
	cmd.Flags().StringVar(&f.consumer, "consumer", "", "the consumer (inbox.Config.Consumer); required")
}

// with opens the database and runs fn with the inbox operations on
// --inbox-table, audited in --table's audit table.
func (f *inboxFlags) with(cmd *cobra.Command, cfg *ops.Config, fn func(ctx context.Context, x *ops.Inbox) error) error {
	if f.consumer == "" {
		return errors.New("--consumer is required: name the consumer whose inbox to read (inbox.Config.Consumer)")
	}
	if err := outboxdriver.ValidateIdent("--inbox-table", f.inboxTable); err != nil {
		return err
	}
	return f.withOpsDB(cmd, 2, cfg, func(ctx context.Context, o *ops.Ops, db *relayd.DB) error {
		adm, err := inboxAdmin(db)
		if err != nil {
			return err
		}
		x, err := ops.NewInbox(o, adm, outboxdriver.Table{Schema: o.Table().Schema, Name: f.inboxTable})
		if err != nil {
			return err
		}
		return fn(ctx, x)
	})
}

// inboxAdmin is the inbox driver on the database the command opened.
func inboxAdmin(db *relayd.DB) (inbox.Admin, error) {
	switch db.Scheme {
	case "postgres":
		return inboxpgx.New(db.Pool), nil
	case "sqlite":
		return inboxsql.New(db.SQL, inboxsql.SQLite)
	case "mysql":
		return inboxsql.New(db.SQL, inboxsql.MySQL)
	}
	return nil, fmt.Errorf("inbox: %s:// is not supported; use postgres://, mysql:// or sqlite://", db.Scheme)
}

func newInboxStatus() *cobra.Command {
	var f inboxFlags
	var asJSON bool
	var metricsURL string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show a consumer's processed events, duplicates suppressed, dead letters and oldest dead letter",
		Long: `status reads the consumer's inbox tables: the events it processed (the
dedupe records kept, within the retention), its dead letters, the oldest of
them and those marked for retry. The database keeps no count of duplicates
suppressed: --metrics reads it from a consumer's Prometheus endpoint
(inbox_messages_total{outcome="duplicate"}, summed over what it serves).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.with(cmd, nil, func(ctx context.Context, x *ops.Inbox) error {
				s, err := x.Status(ctx, cliActor(""), f.consumer)
				if err != nil {
					return err
				}
				var dups *float64
				if metricsURL != "" {
					n, err := scrapeDuplicates(ctx, metricsURL, f.consumer)
					if err != nil {
						return fmt.Errorf("--metrics: %w", err)
					}
					dups = &n
				}
				out := cmd.OutOrStdout()
				if asJSON {
					return json.NewEncoder(out).Encode(struct {
						inbox.Stats
						Duplicates *float64 `json:"duplicates_suppressed,omitempty"`
					}{s, dups})
				}
				var b strings.Builder
				fmt.Fprintf(&b, "consumer:              %s\ninbox:                 %s\n", s.Consumer, x.Table())
				fmt.Fprintf(&b, "processed:             %d (dedupe records kept)\n", s.Processed)
				if dups != nil {
					fmt.Fprintf(&b, "duplicates suppressed: %.0f (since the consumer process started)\n", *dups)
				} else {
					b.WriteString("duplicates suppressed: not kept in the database; pass --metrics http://consumer:port/metrics\n")
				}
				fmt.Fprintf(&b, "dead letters:          %d (%d marked for retry)\n", s.DeadLetters, s.RetryRequested)
				if s.OldestDeadLetter.IsZero() {
					b.WriteString("oldest dead letter:    none\n")
				} else {
					fmt.Fprintf(&b, "oldest dead letter:    %s\n", s.OldestDeadLetter.UTC().Format("2006-01-02 15:04:05Z"))
				}
				_, err = fmt.Fprint(out, b.String())
				return err
			})
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the status as JSON")
	cmd.Flags().StringVar(&metricsURL, "metrics", "", "a consumer process's Prometheus endpoint, to report the duplicates it suppressed")
	return cmd
}

// scrapeDuplicates sums inbox_messages_total{consumer, outcome="duplicate"}
// on the Prometheus text endpoint url.
func scrapeDuplicates(ctx context.Context, url, consumer string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Accept", "text/plain")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", url, err)
	}
	fam, ok := fams["inbox_messages_total"]
	if !ok {
		return 0, fmt.Errorf("%s serves no inbox_messages_total: is it a consumer's endpoint with inboxprom?", url)
	}
	var n float64
	for _, m := range fam.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["consumer"] == consumer && labels["outcome"] == "duplicate" {
			n += m.GetCounter().GetValue()
		}
	}
	return n, nil
}

func newInboxDLQList() *cobra.Command {
	var f inboxFlags
	var asJSON bool
	var limit int
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List a consumer's dead letters, oldest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := intIn("limit", limit, 1, 1_000_000); err != nil {
				return err
			}
			return f.with(cmd, &ops.Config{MaxPage: limit}, func(ctx context.Context, x *ops.Inbox) error {
				dls, err := x.DeadLetters(ctx, cliActor(""), f.consumer, limit)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				if asJSON {
					if dls == nil {
						dls = []inbox.DeadLetter{}
					}
					return json.NewEncoder(out).Encode(dls)
				}
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tEVENT ID\tAGGREGATE\tTYPE\tDEAD-LETTERED\tRETRY\tERROR")
				for _, d := range dls {
					retry := "-"
					if !d.RetryRequestedAt.IsZero() {
						retry = "requested"
					}
					fmt.Fprintf(tw, "%d\t%s\t%s/%s\t%s\t%s\t%s\t%s\n", d.ID, oneLineText(d.EventID, 40),
						oneLineText(d.AggregateType, 40), oneLineText(d.AggregateID, 40), oneLineText(d.Type, 40),
						d.DeadLetteredAt.UTC().Format("2006-01-02 15:04:05Z"), retry, oneLineText(d.Error, 120))
				}
				return tw.Flush()
			})
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array (without payloads)")
	cmd.Flags().IntVar(&limit, "limit", 1000, "most dead letters listed")
	return cmd
}

func newInboxDLQShow() *cobra.Command {
	var f inboxFlags
	var masks maskFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show one of a consumer's dead letters with its headers and payload, sensitive fields masked",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := ops.ParseDeadLetterID(args[0])
			if err != nil {
				return err
			}
			cfg := &ops.Config{}
			if err := masks.apply(cfg); err != nil {
				return err
			}
			return f.with(cmd, cfg, func(ctx context.Context, x *ops.Inbox) error {
				v, err := x.DeadLetter(ctx, cliActor(""), f.consumer, id)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				if asJSON {
					return json.NewEncoder(out).Encode(v)
				}
				var b strings.Builder
				fmt.Fprintf(&b, "id:            %d\nconsumer:      %s\nevent id:      %s\naggregate:     %s/%s\ntype:          %s\ndestination:   %s\n",
					v.ID, v.Consumer, oneLineText(v.EventID, 200), oneLineText(v.AggregateType, 200), oneLineText(v.AggregateID, 200),
					oneLineText(v.Type, 200), oneLineText(v.Destination, 200))
				fmt.Fprintf(&b, "dead-lettered: %s\n", v.DeadLetteredAt.UTC().Format("2006-01-02 15:04:05Z"))
				if !v.RetryRequestedAt.IsZero() {
					fmt.Fprintf(&b, "retry asked:   %s\n", v.RetryRequestedAt.UTC().Format("2006-01-02 15:04:05Z"))
				}
				fmt.Fprintf(&b, "error:         %s\n", oneLineText(v.Error, 2000))
				for _, k := range slices.Sorted(maps.Keys(v.Headers)) {
					fmt.Fprintf(&b, "header %s: %s\n", oneLineText(k, 200), oneLineText(v.Headers[k], 2000))
				}
				if v.PayloadNote != "" {
					fmt.Fprintf(&b, "payload (%s):\n", v.PayloadNote)
				} else {
					b.WriteString("payload:\n")
				}
				b.WriteString(v.Payload)
				b.WriteString("\n")
				_, err = fmt.Fprint(out, b.String())
				return err
			})
		},
	}
	f.register(cmd)
	masks.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the dead letter as JSON")
	return cmd
}

func newInboxDLQAct(action string) *cobra.Command {
	var f inboxFlags
	var all bool
	var actor, reason string
	short := map[string]string{
		"retry":   "Mark a consumer's dead letters for retry: the running consumer hands them to its handler again",
		"discard": "Delete a consumer's dead letters for good",
	}[action]
	cmd := &cobra.Command{
		Use:   action + " ID...|--all",
		Short: short,
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) > 0) {
				return fmt.Errorf("inbox dlq %s: give dead letter ids or --all, not both or neither", action)
			}
			var ids []int64
			for _, a := range args {
				id, err := ops.ParseDeadLetterID(a)
				if err != nil {
					return fmt.Errorf("inbox dlq %s: %w", action, err)
				}
				ids = append(ids, id)
			}
			return f.with(cmd, nil, func(ctx context.Context, x *ops.Inbox) error {
				do := x.Retry
				if action == "discard" {
					do = x.Discard
				}
				done, err := do(ctx, cliActor(actor), f.consumer, ids, reason)
				verb := map[string]string{"retry": "marked for retry", "discard": "discarded"}[action]
				fmt.Fprintf(cmd.OutOrStdout(), "%d dead letter(s) of %s %s\n", len(done), f.consumer, verb)
				if err != nil {
					return err
				}
				if missing := len(ids) - len(done); len(ids) > 0 && missing > 0 {
					var miss []string
					for _, id := range ids {
						if !slices.Contains(done, id) {
							miss = append(miss, fmt.Sprint(id))
						}
					}
					return fmt.Errorf("consumer %s has no dead letter with id %s", f.consumer, strings.Join(miss, ", "))
				}
				return nil
			})
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&all, "all", false, "act on every dead letter of the consumer")
	cmd.Flags().StringVar(&actor, "actor", "", "who acts, for the audit table (default user@host); the command line acts with the operator role")
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit table")
	return cmd
}
