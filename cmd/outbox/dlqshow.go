package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
)

func newDLQShow() *cobra.Command {
	var f dbFlags
	var masks maskFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show one dead letter with its headers and payload, sensitive fields masked",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg := &ops.Config{}
			if err := masks.apply(cfg); err != nil {
				return err
			}
			return f.withOps(cmd, 2, cfg, func(ctx context.Context, o *ops.Ops, _ outboxdriver.Store) error {
				v, err := o.DeadLetter(ctx, cliActor(""), args[0])
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				if asJSON {
					return json.NewEncoder(out).Encode(v)
				}
				var b strings.Builder
				fmt.Fprintf(&b, "id:              %s\naggregate:       %s/%s\ntype:            %s\n", v.ID, v.AggregateType, v.AggregateID, v.Type)
				fmt.Fprintf(&b, "attempts:        %d\nholds aggregate: %v\ndead-lettered:   %s\nlast error:      %s\n",
					v.Attempts, v.Held, v.DeadLetteredAt.UTC().Format("2006-01-02 15:04:05Z"), oneLineText(v.LastError, 2000))
				for _, k := range slices.Sorted(maps.Keys(v.Headers)) {
					fmt.Fprintf(&b, "header %s: %s\n", k, v.Headers[k])
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
