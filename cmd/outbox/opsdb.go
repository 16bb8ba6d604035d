package main

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/relayd"
)

// withOps is withDB for the commands that go through package ops: it
// hands ops the driver itself (not a wrapper), so that ops sees what the
// driver can do beyond a Store (filters, the full audit), and closes the
// pool afterwards.
func (f *dbFlags) withOps(cmd *cobra.Command, maxConns int32, cfg *ops.Config, fn func(ctx context.Context, o *ops.Ops, st outboxdriver.Store) error) error {
	return f.withOpsDB(cmd, maxConns, cfg, func(ctx context.Context, o *ops.Ops, db *relayd.DB) error {
		return fn(ctx, o, db.Store)
	})
}

// withOpsDB is withOps handing fn the database the command opened.
func (f *dbFlags) withOpsDB(cmd *cobra.Command, maxConns int32, cfg *ops.Config, fn func(ctx context.Context, o *ops.Ops, db *relayd.DB) error) error {
	t, err := f.tableName()
	if err != nil {
		return err
	}
	raw, err := f.dbURL()
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	db, err := relayd.OpenDB(ctx, raw, maxConns)
	if err != nil {
		return err
	}
	defer db.Close()
	if t.Schema == "" {
		t.Schema = db.Schema
	}
	o, err := ops.New(db.Store, t, cfg)
	if err != nil {
		return err
	}
	return fn(ctx, o, db)
}
