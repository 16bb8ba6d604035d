package outboxpgx

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Time partitions (docs/retention.md): a table migrated with
// MigrateOptions.TimePartitions is partitioned by created_at. The work is
// done by the function migration 13 made (<table>_tparts_run), so that
// every relay, outbox retention and a scheduler running plain SQL do the
// same thing; this file calls it and reads what it recorded.

// MaintainTimePartitions makes t's time partitions ahead and drops the
// old ones m allows; on a table not partitioned by time it does nothing.
func (d *Driver) MaintainTimePartitions(ctx context.Context, t outboxdriver.Table, m outboxdriver.TimePartitionMaintenance) ([]outboxdriver.TimePartitionChange, error) {
	if d.pool == nil {
		return nil, errNoPool
	}
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("outboxpgx: %w", err)
	}
	return maintainTimePartitions(ctx, d.pool, t, m)
}

// MaintainTimePartitions maintains the source's table as the Driver's
// MaintainTimePartitions does.
func (s *source) MaintainTimePartitions(ctx context.Context, m outboxdriver.TimePartitionMaintenance) ([]outboxdriver.TimePartitionChange, error) {
	return maintainTimePartitions(ctx, s.pool, s.Table, m)
}

func maintainTimePartitions(ctx context.Context, pool *pgxpool.Pool, t outboxdriver.Table, m outboxdriver.TimePartitionMaintenance) ([]outboxdriver.TimePartitionChange, error) {
	m, err := driverkit.ResolveMaintenance(m)
	if err != nil {
		return nil, fmt.Errorf("outboxpgx: %w", err)
	}
	rows, err := pool.Query(ctx, pgschema.MaintainSQL(t), pgschema.MaintainArgs(m)...)
	var changes []outboxdriver.TimePartitionChange
	if err == nil {
		changes, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (outboxdriver.TimePartitionChange, error) {
			var c outboxdriver.TimePartitionChange
			return c, row.Scan(&c.Action, &c.Partition, &c.Detail)
		})
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42883" {
		return nil, nil // a schema before version 13: no time partitions
	}
	if err != nil {
		return nil, fmt.Errorf("outboxpgx: maintain the time partitions of %s: %w", t, err)
	}
	return changes, nil
}

// partitioned reports whether t is a partitioned table.
func partitioned(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, t outboxdriver.Table) (bool, error) {
	var kind int
	err := db.QueryRow(ctx, pgschema.PartitionedSQL(t)).Scan(&kind)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return kind == 1, err
}

// timePartitionStatus reads what t's time partitions are, nil when it has
// none. t is at schema version 13 or later.
func timePartitionStatus(ctx context.Context, db *pgxpool.Pool, t outboxdriver.Table) (*outboxdriver.TimePartitionStatus, error) {
	var tp outboxdriver.TimePartitionStatus
	var maintained, oldest, newest *time.Time
	var kept, blocked string
	var hasDefault bool
	err := db.QueryRow(ctx, `WITH bounds AS (
    SELECT (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']+)''\)'))[1]::timestamptz AS lower
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = to_regclass($1)
)
SELECT s.unit, s.ahead, s.maintained_at, s.kept::text, s.blocked::text,
       (SELECT count(lower) FROM bounds), (SELECT min(lower) FROM bounds), (SELECT max(lower) FROM bounds),
       to_regclass($2) IS NOT NULL
FROM `+pgschema.TimePartsTable(t)+` s`, pgschema.NamesOf(t).Table, pgschema.DefaultPartition(t)).
		Scan(&tp.Unit, &tp.Ahead, &maintained, &kept, &blocked, &tp.Partitions, &oldest, &newest, &hasDefault)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("outboxpgx: time partitions of %s: %w", t, err)
	}
	for dst, src := range map[*time.Time]*time.Time{&tp.MaintainedAt: maintained, &tp.Oldest: oldest, &tp.Newest: newest} {
		if src != nil {
			*dst = src.UTC()
		}
	}
	if err := json.Unmarshal([]byte(kept), &tp.Kept); err != nil {
		return nil, fmt.Errorf("outboxpgx: time partitions of %s: kept: %w", t, err)
	}
	var bs []struct {
		Partition string `json:"partition"`
	}
	if err := json.Unmarshal([]byte(blocked), &bs); err != nil {
		return nil, fmt.Errorf("outboxpgx: time partitions of %s: blocked: %w", t, err)
	}
	for _, b := range bs {
		tp.Blocked = append(tp.Blocked, b.Partition)
	}
	if hasDefault {
		if err := db.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM `+pgschema.DefaultPartition(t)+` LIMIT 1000000) d`).Scan(&tp.DefaultRows); err != nil {
			return nil, fmt.Errorf("outboxpgx: time partitions of %s: default partition: %w", t, err)
		}
	}
	return &tp, nil
}
