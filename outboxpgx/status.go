package outboxpgx

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Status reports the backlog, the age of the oldest unpublished event, the
// dead letters, the held aggregates and every partition's lease of table
// t. It wraps outboxdriver.ErrNotMigrated when t does not exist. Every
// count is exact: on a large table it reads every unpublished row
// (EstimateStatus does not).
func (d *Driver) Status(ctx context.Context, t outboxdriver.Table) (outboxdriver.Status, error) {
	return d.status(ctx, t, 0)
}

// EstimateStatus is Status with the counts above exactUpTo estimated: the
// backlog, the published rows kept, the dead letters and the held
// aggregates are counted up to exactUpTo+1 rows and, past that, taken from
// the planner's estimate (and the backlog bounded by the span of its
// positions); the partitions' backlogs are then shares of the backlog from
// a sample of the table. The oldest unpublished event is the first by
// position (the pending index's first entry). Nothing reads every row.
func (d *Driver) EstimateStatus(ctx context.Context, t outboxdriver.Table, exactUpTo int64) (outboxdriver.Status, error) {
	if exactUpTo < 1 {
		return outboxdriver.Status{}, fmt.Errorf("outboxpgx: estimate the status of %s: exactUpTo %d, want a positive one", t, exactUpTo)
	}
	return d.status(ctx, t, exactUpTo)
}

// status is Status (exactUpTo 0) or EstimateStatus.
func (d *Driver) status(ctx context.Context, t outboxdriver.Table, exactUpTo int64) (outboxdriver.Status, error) {
	t = t.WithDefaults()
	st := outboxdriver.Status{Table: t, LatestSchemaVersion: pgschema.Latest()}
	if err := t.Validate(); err != nil {
		return st, fmt.Errorf("outboxpgx: %w", err)
	}
	db := d.pool
	if db == nil {
		return st, errNoPool
	}
	n := pgschema.NamesOf(t)
	exists, err := migrated(ctx, db, t)
	if err != nil {
		return st, fmt.Errorf("outboxpgx: status of %s: %w", t, err)
	}
	if !exists {
		return st, driverkit.NotMigrated("outboxpgx", t)
	}
	var ageSeconds float64
	if exactUpTo > 0 {
		var c counts
		c, err = countTable(ctx, db, n, exactUpTo)
		st.Backlog, st.Published, st.DeadLetters, ageSeconds = c.backlog.n, c.published.n, c.dead.n, c.oldestAge
		st.Estimated = outboxdriver.Estimated{Backlog: c.backlog.estimated, Published: c.published.estimated, DeadLetters: c.dead.estimated}
		if err == nil {
			err = db.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+n.Migrations).Scan(&st.SchemaVersion)
		}
	} else {
		err = db.QueryRow(ctx, `SELECT
    (SELECT count(*) FROM `+n.Table+` WHERE published_at IS NULL),
    (SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 FROM `+n.Table+` WHERE published_at IS NULL),
    (SELECT count(*) FROM `+n.Table+` WHERE published_at IS NOT NULL),
    (SELECT count(*) FROM `+n.DeadLetter+`),
    (SELECT coalesce(max(version), 0) FROM `+n.Migrations+`)`).
			Scan(&st.Backlog, &ageSeconds, &st.Published, &st.DeadLetters, &st.SchemaVersion)
	}
	if err == nil {
		// Recorded from schema version 20; before it, relays record no
		// version to hold against one.
		if st.SchemaVersion >= pgschema.RelayVersionsSince {
			err = db.QueryRow(ctx, pgschema.CheckSchemaSQL(t.WithDefaults())).Scan(&st.SchemaVersion, &st.RelaysFrom)
		}
	}
	if err != nil {
		return st, fmt.Errorf("outboxpgx: status of %s: %w", t, err)
	}
	if ageSeconds > 0 {
		st.OldestUnpublishedAge = time.Duration(ageSeconds * float64(time.Second))
	}
	if st.SchemaVersion < 2 {
		return st, nil
	}
	var heldSeconds float64
	held := `SELECT count(*), coalesce(extract(epoch FROM now() - min(held_at)), 0)::float8 FROM ` + n.Held
	if exactUpTo > 0 {
		// The oldest held through the primary key would need an index on
		// held_at; a table with more held aggregates than the bound shows
		// the estimate and the oldest of the first rows counted.
		held = `SELECT count(*), coalesce(extract(epoch FROM now() - min(held_at)), 0)::float8 FROM (SELECT held_at FROM ` + n.Held + ` LIMIT $1) h`
	}
	args := []any{}
	if exactUpTo > 0 {
		args = append(args, exactUpTo+1)
	}
	if err := db.QueryRow(ctx, held, args...).Scan(&st.Held, &heldSeconds); err != nil {
		return st, fmt.Errorf("outboxpgx: status of %s: %w", t, err)
	}
	if exactUpTo > 0 && st.Held > exactUpTo {
		est, err := plannerRows(ctx, db, `SELECT 1 FROM `+n.Held)
		if err != nil {
			return st, fmt.Errorf("outboxpgx: status of %s: %w", t, err)
		}
		st.Held, st.Estimated.Held = max(est, exactUpTo+1), true
	}
	if heldSeconds > 0 {
		st.OldestHeldAge = time.Duration(heldSeconds * float64(time.Second))
	}
	if st.SchemaVersion >= 9 {
		if err := db.QueryRow(ctx, `SELECT count(*) FROM `+pgschema.CDCNamesOf(t).Parked).Scan(&st.Parked); err != nil {
			return st, fmt.Errorf("outboxpgx: status of %s: %w", t, err)
		}
	}
	if st.SchemaVersion >= 12 {
		// Through the partial index of the rows that wait.
		if err := db.QueryRow(ctx, `SELECT count(*) FROM `+n.Table+`
WHERE published_at IS NULL AND (deliver_at IS NOT NULL OR next_attempt_at IS NOT NULL) AND deliver_at > now()`).Scan(&st.Delayed); err != nil {
			return st, fmt.Errorf("outboxpgx: status of %s: %w", t, err)
		}
	}
	if st.SchemaVersion >= 13 {
		if st.TimePartitions, err = timePartitionStatus(ctx, db, t); err != nil {
			return st, err
		}
	}
	if st.SchemaVersion >= 14 {
		// Delayed events log tailing parked that are not unpublished rows
		// of the table, counted above: messages and deleted rows.
		var parked int64
		if err := db.QueryRow(ctx, `SELECT count(*) FROM `+pgschema.CDCNamesOf(t).Parked+` p
WHERE p.deliver_at > now() AND NOT EXISTS (SELECT 1 FROM `+n.Table+` o WHERE o.published_at IS NULL AND o.seq = p.seq AND o.id = p.id)`).Scan(&parked); err != nil {
			return st, fmt.Errorf("outboxpgx: status of %s: %w", t, err)
		}
		st.Delayed += parked
	}
	if st.Pauses, err = pausesIn(ctx, db, t, st.SchemaVersion); err != nil {
		return st, err
	}
	// Who wakes an idle relay: the notify trigger, or (without it) the
	// library's writers; asked as the writers ask it.
	var awake, now int64
	var trigger bool
	if err := db.QueryRow(ctx, pgschema.WakeViewSQL, pgschema.WakeViewArgs(t)...).Scan(&awake, &now, &trigger); err != nil {
		return st, fmt.Errorf("outboxpgx: status of %s: %w", t, err)
	}
	st.Wakeups = outboxdriver.WakeupsWriters
	if trigger {
		st.Wakeups = outboxdriver.WakeupsTrigger
	}
	// Each partition's backlog: counted, or (with an estimated backlog)
	// its share of a sample.
	part := pgschema.PartitionOf("", t)
	backlog := `SELECT ` + part + ` AS partition, count(*)::float8 AS n FROM ` + n.Table + ` WHERE published_at IS NULL GROUP BY 1`
	args = nil
	if st.Estimated.Backlog {
		st.Estimated.PartitionBacklog = true
		frac, err := sampleFraction(ctx, db, n.Table)
		if err != nil {
			return st, fmt.Errorf("outboxpgx: status of %s: %w", t, err)
		}
		backlog = `SELECT ` + part + ` AS partition, $1::float8 * count(*) / sum(count(*)) OVER () AS n
FROM ` + n.Table + ` TABLESAMPLE SYSTEM ($2) WHERE published_at IS NULL GROUP BY 1`
		args = []any{st.Backlog, frac}
	}
	rows, err := db.Query(ctx, `SELECT l.partition, coalesce(l.owner, ''), l.epoch,
       CASE WHEN l.expires_at = '-infinity' THEN -1e9
            ELSE extract(epoch FROM l.expires_at - clock_timestamp()) END::float8,
       round(coalesce(b.n, 0))::bigint
FROM `+n.Leases+` l
LEFT JOIN (`+backlog+`) b
  ON b.partition = l.partition
ORDER BY l.partition`, args...)
	if err != nil {
		return st, fmt.Errorf("outboxpgx: status of %s: %w", t, err)
	}
	st.Partitions, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (outboxdriver.PartitionStatus, error) {
		var p outboxdriver.PartitionStatus
		var secs float64
		err := row.Scan(&p.Partition, &p.Owner, &p.Epoch, &secs, &p.Backlog)
		p.ExpiresIn = time.Duration(secs * float64(time.Second))
		if p.ExpiresIn <= 0 {
			p.Owner = "" // an expired lease is nobody's
		}
		return p, err
	})
	if err != nil {
		return st, fmt.Errorf("outboxpgx: status of %s: %w", t, err)
	}
	if st.SchemaVersion >= 4 {
		rows, err := db.Query(ctx, pgschema.SlotStatusSQL(t), nil) // every slot
		if err == nil {
			st.Slots, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (outboxdriver.SlotStatus, error) {
				return pgschema.ScanSlotStatus(row.Scan)
			})
		}
		if err != nil {
			return st, fmt.Errorf("outboxpgx: status of %s: replication slots: %w", t, err)
		}
		addSlotBacklogs(&st)
	}
	return st, nil
}

// addSlotBacklogs adds to st's backlog and oldest age what the streamers
// of its slots recorded: the events they decoded and have not published
// that are not rows of the table (docs/cdc.md).
func addSlotBacklogs(st *outboxdriver.Status) {
	for _, s := range st.Slots {
		b := s.Backlog
		if b == nil {
			st.BacklogInWAL = true // no streamer of this version recorded one
			continue
		}
		st.Backlog += b.Events
		if b.OldestAge > st.OldestUnpublishedAge {
			st.OldestUnpublishedAge, st.OldestAgeEstimated = b.OldestAge, b.OldestEstimated
		}
		if b.Mode != "table" {
			st.BacklogInWAL = true
		}
	}
}

// backlogColumns are the SQL expressions of the columns BacklogBy groups
// by, each rendered as the route package renders the column.
var backlogColumns = map[string]string{
	"aggregatetype": "aggregatetype",
	"aggregateid":   "aggregateid",
	"type":          "type",
	"id":            "id::text",
	"created_at":    `to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')`,
}

// BacklogBy implements outboxdriver.BacklogGrouper.
func (d *Driver) BacklogBy(ctx context.Context, t outboxdriver.Table, column string, limit int) ([]outboxdriver.BacklogGroup, error) {
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("outboxpgx: %w", err)
	}
	expr, ok := backlogColumns[column]
	if !ok {
		return nil, fmt.Errorf("outboxpgx: cannot group the backlog by %q", column)
	}
	if limit < 1 {
		return nil, fmt.Errorf("outboxpgx: backlog groups limit %d: use at least 1", limit)
	}
	if d.pool == nil {
		return nil, errNoPool
	}
	rows, err := d.pool.Query(ctx, `WITH g AS (
    SELECT `+expr+` AS v, count(*) AS n, min(created_at) AS oldest
    FROM `+pgschema.NamesOf(t).Table+` WHERE published_at IS NULL GROUP BY 1
), r AS (SELECT v, n, oldest, row_number() OVER (ORDER BY n DESC, v) AS rn FROM g)
SELECT coalesce(CASE WHEN rn <= $1 THEN v END, ''), rn > $1, sum(n)::bigint,
       greatest(extract(epoch FROM now() - min(oldest)), 0)::float8
FROM r GROUP BY 1, 2 ORDER BY 2, 3 DESC, 1`, limit)
	if err != nil {
		return nil, d.fail(ctx, t, "backlog by "+column+" of", err)
	}
	groups, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (outboxdriver.BacklogGroup, error) {
		var g outboxdriver.BacklogGroup
		var secs float64
		err := row.Scan(&g.Value, &g.Rest, &g.Events, &secs)
		g.OldestAge = time.Duration(secs * float64(time.Second))
		return g, err
	})
	if err != nil {
		return nil, d.fail(ctx, t, "backlog by "+column+" of", err)
	}
	return groups, nil
}
