package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/outboxkit/outbox/outboxpgx"
)

// statusJSON is the stable JSON shape of `outbox status --json`.
type statusJSON struct {
	Schema                      string  `json:"schema"`
	Table                       string  `json:"table"`
	Backlog                     int64   `json:"backlog"`
	OldestUnpublishedAgeSeconds float64 `json:"oldest_unpublished_age_seconds"`
	DeadLetters                 int64   `json:"dead_letters"`
	PublishedKept               int64   `json:"published_kept"`
	SchemaVersion               int     `json:"schema_version"`
	LatestSchemaVersion         int     `json:"latest_schema_version"`
}

func newStatus() *cobra.Command {
	var f dbFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the backlog, the age of the oldest unpublished event and the dead letters",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			t, pool, err := f.open(ctx, 2)
			if err != nil {
				return err
			}
			defer pool.Close()
			st, err := outboxpgx.Status(ctx, pool, t)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(statusJSON{
					Schema: t.Schema, Table: t.Name, Backlog: st.Backlog,
					OldestUnpublishedAgeSeconds: st.OldestUnpublishedAge.Seconds(),
					DeadLetters:                 st.DeadLetters, PublishedKept: st.Published,
					SchemaVersion: st.SchemaVersion, LatestSchemaVersion: st.LatestSchemaVersion,
				})
			}
			fmt.Fprintf(out, "table                     %s\n", t)
			fmt.Fprintf(out, "backlog                   %d\n", st.Backlog)
			fmt.Fprintf(out, "oldest unpublished age    %s\n", st.OldestUnpublishedAge.Round(1e6))
			fmt.Fprintf(out, "dead letters              %d\n", st.DeadLetters)
			fmt.Fprintf(out, "published, kept           %d\n", st.Published)
			fmt.Fprintf(out, "schema version            %d (latest %d)\n", st.SchemaVersion, st.LatestSchemaVersion)
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}
