package main

import (
	"context"
	"errors"
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
	cmd.Flags().StringVar(&c.mode, "cdc-mode", "table", "table, message or insert-delete, as the relay's --cdc-mode (what a lost slot means); message and insert-delete imply --cdc")
}

// source is the log-tailing source of table t on st (PostgreSQL only),
// with the flags' slot, publication and mode; what names the command.
func (c *cdcSetupFlags) source(what string, t outboxdriver.Table, st outboxdriver.Store) (*cdc.Source, error) {
	if cs, ok := st.(closingStore); ok {
		st = cs.Store
	}
	drv, ok := st.(*outboxpgx.Driver)
	if !ok {
		return nil, fmt.Errorf("%s: log tailing needs PostgreSQL", what)
	}
	var err error
	if c.cfg.Mode, err = cdc.ParseMode(c.mode); err != nil {
		return nil, fmt.Errorf("--cdc-mode: %w", err)
	}
	return cdc.NewSource(drv.Pool(), t, &c.cfg)
}

// setup creates the publication and the slot of table t when missing.
func (c *cdcSetupFlags) setup(ctx context.Context, out io.Writer, t outboxdriver.Table, st outboxdriver.Store) error {
	src, err := c.source("--cdc", t, st)
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

// newCDC is `outbox cdc`: log tailing's slot, apart from the table.
func newCDC() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cdc",
		Short: "Manage log tailing's replication slot (PostgreSQL): drop it without dropping the table",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newCDCDrop())
	return cmd
}

func newCDCDrop() *cobra.Command {
	var f dbFlags
	var c cdcSetupFlags
	var force bool
	cmd := &cobra.Command{
		Use:   "drop",
		Short: "Drop the table's replication slot (and its publication), which stops pinning WAL; the table stays",
		Long: `Drop what outbox migrate --cdc or a relay with --source cdc made for the
table: the replication slot (which keeps every WAL segment from its
confirmed position on until it is dropped), its row in <table>_cdc, and
the publication when it publishes this table alone. The table and its
events stay. A relay with --source cdc, or outbox migrate --cdc, makes
them again; in table mode its first act is to publish the rows still in
the table. Writers in message and insert-delete mode are refused until
then, so none of their events is lost.

It refuses while a relay streams the slot. In message and insert-delete
mode (--cdc-mode) the slot's WAL is the only copy of the events it has
not yet relayed: it reads, without consuming, what the slot holds past
its confirmed position, and refuses when that includes events of the
table, unless --force (which loses them).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.withDB(cmd, func(ctx context.Context, t outboxdriver.Table, st outboxdriver.Store) error {
				src, err := c.source("outbox cdc drop", t, st)
				if err != nil {
					return err
				}
				defer src.Close()
				pending, err := src.Drop(ctx, cdc.DropOptions{Force: force})
				if err != nil {
					if errors.Is(err, cdc.ErrPendingInSlot) {
						return fmt.Errorf("%w (--force drops it all the same)", err)
					}
					return err
				}
				out := cmd.OutOrStdout()
				fmt.Fprintf(out, "%s: dropped replication slot %s and its state (publication %s dropped if it published this table alone)\n", t, src.Slot(), src.Publication())
				if pending > 0 {
					fmt.Fprintf(out, "%s: %d event(s) the slot held and no relay published are lost (--force)\n", t, pending)
				}
				return nil
			})
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&c.cfg.Slot, "cdc-slot", "", "replication slot (default outbox_<schema>_<table>)")
	cmd.Flags().StringVar(&c.cfg.Publication, "cdc-publication", "", "publication of the table's inserts (default: the slot's name)")
	cmd.Flags().StringVar(&c.mode, "cdc-mode", "table", "table, message or insert-delete, as the relay's --cdc-mode: in the last two, events the slot holds would be lost")
	cmd.Flags().BoolVar(&force, "force", false, "drop even when, in message or insert-delete mode, the slot holds events not yet relayed (they are lost)")
	return cmd
}
