package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxpgx/cdc"
)

// cdcSetupFlags are migrate's --cdc flags: create the publication and the
// replication slot that `outbox relay --source cdc` streams from.
type cdcSetupFlags struct {
	on   bool
	cfg  cdc.Config
	mode string
}

func (c *cdcSetupFlags) register(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&c.on, "cdc", false, "also create the publication and replication slot of log tailing (relay --source cdc; PostgreSQL)")
	cmd.Flags().StringVar(&c.cfg.Slot, "cdc-slot", "", "with --cdc: replication slot (default outbox_<schema>_<table>)")
	cmd.Flags().StringVar(&c.cfg.Publication, "cdc-publication", "", "with --cdc: publication of the table's inserts (default: the slot's name)")
	cmd.Flags().StringVar(&c.mode, "cdc-mode", "table", "with --cdc: table, message or insert-delete, as the relay's --cdc-mode (what a lost slot means)")
}

// setup creates the publication and the slot of table t when missing.
func (c *cdcSetupFlags) setup(ctx context.Context, out io.Writer, t outboxdriver.Table, st outboxdriver.Store) error {
	if cs, ok := st.(closingStore); ok {
		st = cs.Store
	}
	drv, ok := st.(*outboxpgx.Driver)
	if !ok {
		return fmt.Errorf("--cdc: log tailing needs PostgreSQL")
	}
	var err error
	if c.cfg.Mode, err = cdc.ParseMode(c.mode); err != nil {
		return fmt.Errorf("--cdc-mode: %w", err)
	}
	src, err := cdc.NewSource(drv.Pool(), t, &c.cfg)
	if err != nil {
		return err
	}
	defer src.Close()
	if err := src.Setup(ctx); err != nil {
		return err
	}
	fmt.Fprintf(out, "%s: log tailing from replication slot %s, publication %s\n", t, src.Slot(), src.Publication())
	return nil
}
