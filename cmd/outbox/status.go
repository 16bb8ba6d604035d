package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/outboxkit/outbox/internal/grants"
	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
)

// statusJSON is the stable JSON shape of `outbox status --json`.
type statusJSON struct {
	// Source is the source's name in a relay's configuration file
	// (status --config); absent otherwise.
	Source string `json:"source,omitempty"`
	Schema string `json:"schema"`
	Table  string `json:"table"`
	ops.StatusJSON
	// Roles says whether the table's jobs run under separate database
	// roles (outbox grants); absent where it could not be read.
	Roles *rolesJSON `json:"roles,omitempty"`
	// RelaysBehind are the live relays older than relays_from (schema
	// version 0: a release that records none); absent when there is none.
	RelaysBehind []outboxdriver.RelayStatus `json:"relays_behind,omitempty"`
}

// relaysBehind lists the live relays of t older than the oldest relay
// schema version st says the table works with.
func relaysBehind(ctx context.Context, db outboxdriver.Store, t outboxdriver.Table, st outboxdriver.Status) []outboxdriver.RelayStatus {
	if st.RelaysFrom == 0 {
		return nil
	}
	rs, err := db.Relays(ctx, t)
	if err != nil {
		return nil
	}
	var out []outboxdriver.RelayStatus
	for _, r := range rs {
		if r.ExpiresIn > 0 && r.SchemaVersion < st.RelaysFrom {
			out = append(out, r)
		}
	}
	return out
}

// rolesJSON is grants.Separation in `outbox status --json`.
type rolesJSON struct {
	Separated     bool     `json:"separated"`
	Owner         string   `json:"owner,omitempty"`
	Granted       []string `json:"granted,omitempty"`
	AuditChangers []string `json:"audit_changers,omitempty"`
	Text          string   `json:"text"`
}

func newStatus() *cobra.Command {
	var f dbFlags
	var asJSON bool
	var config string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the backlog, the age of the oldest unpublished event and the dead letters",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if config != "" {
				return fleetStatus(cmd, &f, config, asJSON)
			}
			return f.withDB(cmd, func(ctx context.Context, t outboxdriver.Table, db outboxdriver.Store) error {
				return printStatus(ctx, cmd.OutOrStdout(), "", t, db, asJSON)
			})
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object (with --config: one per source, a line each)")
	cmd.Flags().StringVar(&config, "config", "", "report every source the relay's configuration file lists (outbox relay --config), one after another")
	return cmd
}

// printStatus prints the status of table t, headed by the source's name
// when there is one.
func printStatus(ctx context.Context, out io.Writer, source string, t outboxdriver.Table, db outboxdriver.Store, asJSON bool) error {
	st, err := db.Status(ctx, t)
	if err != nil {
		return err
	}
	sep, sepErr := separation(ctx, db, t)
	behind := relaysBehind(ctx, db, t, st)
	if asJSON {
		js := statusJSON{Source: source, Schema: t.Schema, Table: t.Name, StatusJSON: ops.NewStatusJSON(st), RelaysBehind: behind}
		if sep != nil {
			js.Roles = &rolesJSON{Separated: sep.Separated, Owner: sep.Owner, Granted: sep.Granted, AuditChangers: sep.AuditChangers, Text: sep.Text}
		}
		return json.NewEncoder(out).Encode(js)
	}
	if source != "" {
		fmt.Fprintf(out, "source                    %s\n", source)
	}
	fmt.Fprintf(out, "table                     %s\n", t)
	fmt.Fprintf(out, "backlog                   %d%s\n", st.Backlog, backlogNote(st))
	age := st.OldestUnpublishedAge.Round(1e6).String()
	if st.OldestAgeEstimated {
		age += " (estimated: since a stopped streamer's last record, see cdc slot)"
	}
	fmt.Fprintf(out, "oldest unpublished age    %s\n", age)
	fmt.Fprintf(out, "dead letters              %d\n", st.DeadLetters)
	fmt.Fprintf(out, "published, kept           %d\n", st.Published)
	fmt.Fprintf(out, "held aggregates           %d\n", st.Held)
	if st.Held > 0 {
		fmt.Fprintf(out, "oldest hold               %s\n", st.OldestHeldAge.Round(1e6))
	}
	if st.Delayed > 0 {
		fmt.Fprintf(out, "delayed events            %d\n", st.Delayed)
	}
	if st.Parked > 0 || len(st.Slots) > 0 {
		fmt.Fprintf(out, "parked events             %d\n", st.Parked)
	}
	fmt.Fprintf(out, "schema version            %d (latest %d)\n", st.SchemaVersion, st.LatestSchemaVersion)
	if st.RelaysFrom > 0 {
		fmt.Fprintf(out, "relays from               schema version %d\n", st.RelaysFrom)
	}
	for _, r := range behind {
		what := "it claims nothing until replaced"
		if r.SchemaVersion == 0 {
			// A relay that records no version cannot tell either.
			what = "it cannot tell, and may skip rows or ignore what the table needs: replace it"
		}
		fmt.Fprintf(out, "relay behind the table    %s (%s): %s (docs/operations.md, Upgrades)\n", r.Name, outboxdriver.DescribeRelayVersion(r), what)
	}
	switch st.Wakeups {
	case outboxdriver.WakeupsTrigger:
		fmt.Fprintf(out, "wake-ups                  the notify trigger, for every writer\n")
	case outboxdriver.WakeupsWriters:
		fmt.Fprintf(out, "wake-ups                  the library's writers (no trigger: plain-SQL writers' events wait for a relay's next look)\n")
	}
	switch {
	case sepErr != nil:
		fmt.Fprintf(out, "roles                     unknown: %v\n", sepErr)
	case sep != nil:
		fmt.Fprintf(out, "roles                     %s\n", sep.Text)
		if len(sep.AuditChangers) > 0 {
			fmt.Fprintf(out, "  audit changeable by     %s (revoke their UPDATE, DELETE and TRUNCATE on the audit: outbox grants)\n", strings.Join(sep.AuditChangers, ", "))
		}
	}
	printTimePartitions(out, st.TimePartitions)
	printPauses(out, st.Pauses)
	printPartitions(out, st.Partitions)
	printSlots(out, st.Slots)
	return nil
}

// printTimePartitions describes a table's time partitions, and says which
// are kept past the window for their unpublished events.
func printTimePartitions(out io.Writer, tp *outboxdriver.TimePartitionStatus) {
	if tp == nil {
		return
	}
	layout := "2006-01-02"
	if tp.Unit == outboxdriver.TimePartitionsHour {
		layout = "2006-01-02 15:00"
	}
	span := "none"
	if tp.Partitions > 0 {
		span = tp.Oldest.Format(layout) + " to " + tp.Newest.Format(layout) + " UTC"
	}
	fmt.Fprintf(out, "time partitions           %d by %s (%s), %d ahead\n", tp.Partitions, tp.Unit, span, tp.Ahead)
	last := "never"
	if !tp.MaintainedAt.IsZero() {
		last = tp.MaintainedAt.Format("2006-01-02 15:04:05Z")
	}
	fmt.Fprintf(out, "  last maintained         %s\n", last)
	fmt.Fprintf(out, "  rows in default         %d\n", tp.DefaultRows)
	for _, k := range tp.Kept {
		fmt.Fprintf(out, "  kept, not dropped       %s: %d unpublished event(s)\n", k.Partition, k.Unpublished)
	}
	for _, b := range tp.Blocked {
		fmt.Fprintf(out, "  not made                %s: the default partition holds rows of its range\n", b)
	}
}

// printPartitions summarises the leases by owner.
func printPartitions(out io.Writer, parts []outboxdriver.PartitionStatus) {
	if len(parts) == 0 {
		return
	}
	type owner struct {
		parts   []int
		backlog int64
	}
	owners := map[string]*owner{}
	var names []string
	for _, p := range parts {
		name := p.Owner
		if name == "" {
			name = "(nobody)"
		}
		o := owners[name]
		if o == nil {
			o = &owner{}
			owners[name] = o
			names = append(names, name)
		}
		o.parts = append(o.parts, p.Partition)
		o.backlog += p.Backlog
	}
	sort.Strings(names)
	fmt.Fprintf(out, "partitions                %d\n", len(parts))
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  OWNER\tPARTITIONS\tBACKLOG\tWHICH")
	for _, n := range names {
		o := owners[n]
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%s\n", n, len(o.parts), o.backlog, ranges(o.parts))
	}
	tw.Flush()
}

// backlogNote says, after the backlog, when it is a lower bound: events
// of a log-tailing slot may wait in the WAL, not decoded yet.
func backlogNote(st outboxdriver.Status) string {
	if !st.BacklogInWAL {
		return ""
	}
	var wal int64
	for _, s := range st.Slots {
		wal += s.UnconfirmedBytes
	}
	return fmt.Sprintf(" (at least: events still in the WAL, not decoded yet, are not counted; %d bytes of WAL not confirmed)", wal)
}

// printSlots lists the log-tailing replication slots.
func printSlots(out io.Writer, slots []outboxdriver.SlotStatus) {
	for _, s := range slots {
		state := "missing (lost, or not made yet)"
		switch {
		case s.Exists && s.WALStatus == "lost":
			state = "invalidated (wal_status lost)"
		case s.Exists && s.Active:
			state = "active"
		case s.Exists:
			state = "inactive"
		}
		confirmed := s.ConfirmedLSN
		if confirmed == "" {
			confirmed = "-"
		}
		owner := s.Owner
		if owner == "" {
			owner = "(nobody)"
		}
		fmt.Fprintf(out, "cdc slot                  %s (publication %s)\n", s.Slot, s.Publication)
		fmt.Fprintf(out, "  state                   %s\n", state)
		fmt.Fprintf(out, "  lag (retained WAL)      %d bytes\n", s.LagBytes)
		fmt.Fprintf(out, "  confirmed LSN           %s\n", confirmed)
		fmt.Fprintf(out, "  WAL not confirmed       %d bytes\n", s.UnconfirmedBytes)
		fmt.Fprintf(out, "  streamer                %s\n", owner)
		printSlotBacklog(out, s.Backlog)
	}
}

// printSlotBacklog shows what a slot's streamer last recorded of its
// backlog.
func printSlotBacklog(out io.Writer, b *outboxdriver.SlotBacklog) {
	if b == nil {
		fmt.Fprintf(out, "  decoded, not published  unknown: no streamer recorded it (a relay older than schema version 22, or none streamed yet)\n")
		return
	}
	what := "events decoded from the WAL, not yet published (messages"
	switch b.Mode {
	case "insert-delete":
		what += " and rows"
	case "table":
		what += "; rows count in the table's backlog"
	}
	fmt.Fprintf(out, "  decoded, not published  %d %s; mode %s)\n", b.Events, what, b.Mode)
	if !b.OldestCommit.IsZero() {
		fmt.Fprintf(out, "  oldest pending commit   %s (%s ago)\n", b.OldestCommit.Format("2006-01-02 15:04:05.000Z"), b.OldestAge.Round(1e6))
	}
	rec := fmt.Sprintf("%s ago", b.RecordAge.Round(1e6))
	if b.Stale {
		rec += ": stale, the streamer stopped recording (down, or cannot reach the database); events written since are not counted"
		if b.OldestEstimated {
			rec += ", and may have waited since then"
		}
	}
	fmt.Fprintf(out, "  recorded                %s\n", rec)
}

// ranges renders sorted ints as "0-3,7,9-10".
func ranges(xs []int) string {
	var b strings.Builder
	for i := 0; i < len(xs); {
		j := i
		for j+1 < len(xs) && xs[j+1] == xs[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if j > i {
			fmt.Fprintf(&b, "%d-%d", xs[i], xs[j])
		} else {
			fmt.Fprintf(&b, "%d", xs[i])
		}
		i = j + 1
	}
	return b.String()
}

// separation reads whether t runs with separated database roles, on the
// database this command opened (nil for a Store it did not open).
func separation(ctx context.Context, st outboxdriver.Store, t outboxdriver.Table) (*grants.Separation, error) {
	cs, ok := st.(closingStore)
	if !ok {
		return nil, nil
	}
	var sep grants.Separation
	var err error
	switch cs.db.Scheme {
	case "postgres":
		sep, err = grants.CheckPostgres(ctx, cs.db.Pool, t)
	case "mysql":
		sep, err = grants.CheckMySQL(ctx, cs.db.SQL, t)
	default:
		sep = grants.Separation{Text: "none: SQLite has no roles; whoever can write the database file can change anything in it"}
	}
	if err != nil {
		return nil, err
	}
	return &sep, nil
}
