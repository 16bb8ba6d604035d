package pgschema

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Names of what time partitions add to table t (migration 13).
const (
	timePartsSuffix   = "_tparts"
	timePartsFnSuffix = "_tparts_run"
	// DefaultPartitionSuffix names the default partition: rows whose
	// created_at no partition covers land there.
	DefaultPartitionSuffix = "_pdefault"
	// timePartsVersion is the migration that knows time partitions.
	timePartsVersion = 13
)

// TimePartsTable is the qualified name of t's time partition settings.
func TimePartsTable(t outboxdriver.Table) string { return t.Qualified(timePartsSuffix) }

// DefaultPartition is the qualified name of t's default partition.
func DefaultPartition(t outboxdriver.Table) string { return t.Qualified(DefaultPartitionSuffix) }

// MaintainSQL is the statement that maintains t's time partitions; its
// arguments are the window as an interval in milliseconds (NULL: drop
// none), the lock timeout as a setting ("500ms") and the actor drops are
// audited under. It returns action,
// partition and detail per partition concerned.
func MaintainSQL(t outboxdriver.Table) string {
	return `SELECT action, partition_name, detail FROM ` + t.Qualified(timePartsFnSuffix) +
		`(CASE WHEN $1::bigint > 0 THEN $1::bigint * interval '1 millisecond' END, $2, $3)`
}

// MaintainArgs are MaintainSQL's arguments for m, which must be resolved.
func MaintainArgs(m outboxdriver.TimePartitionMaintenance) []any {
	return []any{max(m.KeepFor.Milliseconds(), 0), fmt.Sprintf("%dms", m.LockTimeout.Milliseconds()), m.Actor}
}

// PartitionedSQL says whether t is a partitioned table: one row, 1 or 0;
// none when t does not exist.
func PartitionedSQL(t outboxdriver.Table) string {
	return `SELECT CASE WHEN relkind = 'p' THEN 1 ELSE 0 END FROM pg_class WHERE oid = to_regclass(` + QuoteLiteral(NamesOf(t).Table) + `)`
}

// one returns the single int sql yields, and whether it yielded one.
func one(ctx context.Context, tx Tx, sql string, args ...any) (int, bool, error) {
	vs, err := tx.Versions(ctx, sql, args...)
	if err != nil || len(vs) == 0 {
		return 0, false, err
	}
	return vs[0], true, nil
}

var units = map[string]int{outboxdriver.TimePartitionsDay: 1, outboxdriver.TimePartitionsHour: 2}

// setUpTimePartitions records o's time partitions for t, whose migrations
// just ran with o (created is whether they created the table), and makes
// its first partitions. A table created without them is not converted.
func setUpTimePartitions(ctx context.Context, tx Tx, t outboxdriver.Table, o Options) error {
	part, _, err := one(ctx, tx, PartitionedSQL(t))
	if err != nil {
		return err
	}
	if part != 1 {
		return fmt.Errorf("time partitions: table %s exists and is not partitioned; they are chosen when the table is created, an existing table is not converted (docs/retention.md)", t)
	}
	unit, found, err := one(ctx, tx, `SELECT CASE unit WHEN 'day' THEN 1 WHEN 'hour' THEN 2 END FROM `+TimePartsTable(t))
	if err != nil {
		return err
	}
	if found && unit != units[o.TimePartitions] {
		return fmt.Errorf("time partitions: table %s is partitioned by another unit than %s; the unit is chosen when the table is created", t, o.TimePartitions)
	}
	if err := tx.Exec(ctx, `INSERT INTO `+TimePartsTable(t)+` (unit, ahead) VALUES ($1, $2)
ON CONFLICT (unit) DO UPDATE SET ahead = EXCLUDED.ahead`, o.TimePartitions, o.TimePartitionsAhead); err != nil {
		return fmt.Errorf("time partitions: record settings: %w", err)
	}
	m, err := driverkit.ResolveMaintenance(outboxdriver.TimePartitionMaintenance{LockTimeout: 10 * time.Second, Actor: "migrate"})
	if err != nil {
		return err
	}
	if err := tx.Exec(ctx, MaintainSQL(t), MaintainArgs(m)...); err != nil {
		return fmt.Errorf("time partitions: make the first partitions: %w", err)
	}
	return nil
}

// refuseDownBelowTimeParts fails when t is partitioned and target would
// revert the migration that knows time partitions but keep the table:
// relays of earlier versions know nothing of partitions.
func refuseDownBelowTimeParts(ctx context.Context, tx Tx, t outboxdriver.Table, target int) error {
	if target == 0 || target >= timePartsVersion {
		return nil
	}
	part, _, err := one(ctx, tx, PartitionedSQL(t))
	if err != nil {
		return err
	}
	if part == 1 {
		return fmt.Errorf("table %s is partitioned by time and cannot go below version %d: earlier versions know nothing of partitions; migrate --down 0 drops it", t, timePartsVersion)
	}
	return nil
}
