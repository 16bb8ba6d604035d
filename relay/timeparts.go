package relay

import (
	"context"
	"github.com/outboxkit/outbox/outboxdriver"
)

// maintainPartitions maintains a time-partitioned table's partitions
// (docs/retention.md) every PartitionsEvery, first at once, until ctx
// ends: it makes those ahead and drops those past DropPartitionsAfter that
// are fully published. On any other table each round is one cheap query.
// It runs beside the lease upkeep, whose timing a wait for a lock must not
// delay.
func (r *Relay) maintainPartitions(ctx context.Context) {
	m := outboxdriver.TimePartitionMaintenance{KeepFor: max(r.cfg.DropPartitionsAfter, 0), LockTimeout: r.cfg.PartitionLockTimeout, Actor: "relay:" + r.src.RelayName()}
	kept := map[string]bool{} // logged already
	for {
		changes, err := r.src.MaintainTimePartitions(ctx, m)
		switch {
		case err == nil:
			r.db.OK()
		case ctx.Err() == nil:
			// Retried next round; logged by the outage tracker.
			r.db.Fail("time partition maintenance", err)
		}
		now := map[string]bool{}
		for _, c := range changes {
			switch c.Action {
			case outboxdriver.PartitionWaiting:
				r.log.Debug("relay: time partition "+c.Action, "partition", c.Partition, "reason", c.Detail)
			case outboxdriver.PartitionCreated, outboxdriver.PartitionDropped:
				r.log.Info("relay: time partition "+c.Action, "partition", c.Partition)
			case outboxdriver.PartitionKept:
				now[c.Partition] = true
				if !kept[c.Partition] {
					r.log.Warn("relay: time partition past the window kept", "partition", c.Partition, "reason", c.Detail)
				}
			default:
				r.log.Warn("relay: time partition "+c.Action, "partition", c.Partition, "reason", c.Detail)
			}
		}
		kept = now
		sleep(ctx, r.cfg.PartitionsEvery)
		if ctx.Err() != nil {
			return
		}
	}
}
