package outboxpgx

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Audit actions of pauses and releases.
const (
	actionPause   = "pause"
	actionResume  = "resume"
	actionRelease = "release"
)

func pauseTable(t outboxdriver.Table) string { return t.WithDefaults().Qualified("_pause") }

// listPauses reads the pauses in force on t: nil (not empty) when the
// table predates schema version 6 (no pause table).
func listPauses(ctx context.Context, q interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, t outboxdriver.Table) ([]outboxdriver.Pause, error) {
	rows, err := q.Query(ctx, `SELECT scope, value, actor, role, reason, since FROM `+pauseTable(t)+` ORDER BY since, scope, value`)
	if err != nil {
		if isUndefinedTable(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("outboxpgx: pauses of %s: %w", t, err)
	}
	ps, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outboxdriver.Pause, error) {
		var p outboxdriver.Pause
		err := r.Scan(&p.Kind, &p.Value, &p.Actor, &p.Role, &p.Reason, &p.Since)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("outboxpgx: pauses of %s: %w", t, err)
	}
	if ps == nil {
		ps = []outboxdriver.Pause{}
	}
	return ps, nil
}

func isUndefinedTable(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == "42P01"
}

// Pauses reads the pauses in force: one small query.
func (s *source) Pauses(ctx context.Context) ([]outboxdriver.Pause, error) {
	ps, err := listPauses(ctx, s.pool, s.Table)
	switch {
	case err != nil:
	case ps == nil:
		s.pauseTable.Store(pauseTableAbsent)
	default:
		s.pauseTable.Store(pauseTablePresent)
	}
	return ps, err
}

// What the source's reads of the pauses found of the pause table.
const (
	pauseTableUnknown = iota // no read succeeded yet
	pauseTableAbsent         // the table predates schema version 6
	pauseTablePresent
)

// Pauses reads the pauses in force in the claim's transaction, on the
// batch's connection (outboxdriver.PauseReader): the relay reads them
// before it publishes the batch, and needs no second connection for it.
// Only once a read of the source found the pause table (a query of a
// missing table would end the claim's transaction); before, it says so,
// and the relay keeps the pauses it knows.
func (b *batch) Pauses(ctx context.Context) ([]outboxdriver.Pause, error) {
	switch b.src.pauseTable.Load() {
	case pauseTableAbsent:
		return nil, nil
	case pauseTablePresent:
		if b.conn != nil {
			return listPauses(ctx, b.conn, b.src.Table)
		}
		return b.src.Pauses(ctx)
	}
	return nil, errors.New("outboxpgx: no read of the pauses has succeeded yet")
}

// ExcludeAggregateTypes leaves the events of types out of the next claims.
func (s *source) ExcludeAggregateTypes(types []string) { s.exclude.Store(&types) }

// excluded returns the aggregate types the claim leaves out (never nil:
// the claim compares with every element of the array).
func (s *source) excluded() []string {
	if p := s.exclude.Load(); p != nil && *p != nil {
		return *p
	}
	return []string{}
}

// ListPauses lists the pauses in force on t, oldest first. A table that
// predates the pause table has none; one that does not exist wraps
// outboxdriver.ErrNotMigrated.
func (d *Driver) ListPauses(ctx context.Context, t outboxdriver.Table) ([]outboxdriver.Pause, error) {
	if _, err := d.names(t); err != nil {
		return nil, err
	}
	ps, err := listPauses(ctx, d.pool, t)
	if err == nil && ps == nil {
		switch ok, err := migrated(ctx, d.pool, t); {
		case err != nil:
			return nil, fmt.Errorf("outboxpgx: pauses of %s: %w", t, err)
		case !ok:
			return nil, driverkit.NotMigrated("outboxpgx", t)
		}
	}
	return ps, err
}

// SetPause pauses s on t and writes the audit row in the same
// transaction; it reports false, writing nothing, when s was paused
// already. Relays see it within one poll interval; the channel's wake-up
// tells idle ones at once.
func (d *Driver) SetPause(ctx context.Context, t outboxdriver.Table, s outboxdriver.PauseScope, by outboxdriver.Acting) (bool, error) {
	return d.changePause(ctx, t, s, by, actionPause, `INSERT INTO `+pauseTable(t)+` (scope, value, actor, role, reason)
VALUES ($1, $2, $3, $4, $5) ON CONFLICT (scope, value) DO NOTHING RETURNING 1`, string(s.Kind), s.Value, by.Name, by.Role, by.Reason)
}

// LiftPause resumes s on t and writes the audit row in the same
// transaction; it reports false, writing nothing, when s was not paused.
func (d *Driver) LiftPause(ctx context.Context, t outboxdriver.Table, s outboxdriver.PauseScope, by outboxdriver.Acting) (bool, error) {
	return d.changePause(ctx, t, s, by, actionResume, `DELETE FROM `+pauseTable(t)+` WHERE scope = $1 AND value = $2 RETURNING 1`,
		string(s.Kind), s.Value)
}

func (d *Driver) changePause(ctx context.Context, t outboxdriver.Table, s outboxdriver.PauseScope, by outboxdriver.Acting, action, change string, args ...any) (bool, error) {
	n, err := d.names(t)
	if err != nil {
		return false, err
	}
	if err := s.Validate(); err != nil {
		return false, fmt.Errorf("outboxpgx: %w", err)
	}
	var changed bool
	err = pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		var one int
		switch err := tx.QueryRow(ctx, change, args...).Scan(&one); {
		case errors.Is(err, pgx.ErrNoRows):
			return nil
		case err != nil:
			return err
		}
		changed = true
		if _, err := tx.Exec(ctx, `INSERT INTO `+n.Audit+` (actor, role, action, detail, reason) VALUES ($1, $2, $3, $4, $5)`,
			by.Name, by.Role, action, s.String(), by.Reason); err != nil {
			return err
		}
		// Wake idle relays: a resumed scope flows at once.
		_, err := tx.Exec(ctx, `SELECT pg_notify($1, '')`, t.WithDefaults().Channel())
		return err
	})
	if err != nil {
		return false, d.fail(ctx, t, action+" of", err)
	}
	return changed, nil
}

// HeldAggregates lists up to limit held aggregates of t, longest held
// first, with the event each waits behind and how many events wait.
func (d *Driver) HeldAggregates(ctx context.Context, t outboxdriver.Table, limit int) ([]outboxdriver.HeldAggregate, error) {
	n, err := d.names(t)
	if err != nil {
		return nil, err
	}
	if limit <= 0 {
		return nil, fmt.Errorf("outboxpgx: held aggregates of %s: limit %d, want a positive one", t, limit)
	}
	// The reason is what holds the aggregate now: a dead letter, or an
	// event in the outbox (retrying, or a dead letter retried by an
	// operator and not yet published).
	// The events waiting behind each are counted while the backlog is
	// small enough to read (no index finds an aggregate's events: one
	// would cost every write); above ExactUpTo they are not (-1).
	var small bool
	if err := d.pool.QueryRow(ctx, `SELECT count(*) <= $1 FROM (SELECT 1 FROM `+n.Table+` WHERE published_at IS NULL LIMIT $1 + 1) b`, ExactUpTo).Scan(&small); err != nil {
		return nil, d.fail(ctx, t, "held aggregates of", err)
	}
	waiting := `-1::bigint`
	if small {
		waiting = `(SELECT count(*) FROM ` + n.Table + ` o
        WHERE o.aggregatetype = h.aggregatetype AND o.aggregateid = h.aggregateid
          AND o.published_at IS NULL AND o.id <> h.event_id)`
	}
	rows, err := d.pool.Query(ctx, `SELECT h.aggregatetype, h.aggregateid, h.event_id::text,
       CASE WHEN dl.id IS NOT NULL THEN 'dead-lettered' ELSE 'retrying' END,
       h.held_at,
       `+waiting+`,
       coalesce(dl.last_error, (SELECT o.last_error FROM `+n.Table+` o WHERE o.seq = h.seq AND o.published_at IS NULL AND o.id = h.event_id), '')
FROM (SELECT * FROM `+n.Held+` ORDER BY held_at, aggregatetype, aggregateid LIMIT $1) h
LEFT JOIN `+n.DeadLetter+` dl ON dl.id = h.event_id AND dl.seq = h.seq
ORDER BY h.held_at, h.aggregatetype, h.aggregateid`, limit)
	if err != nil {
		return nil, d.fail(ctx, t, "held aggregates of", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outboxdriver.HeldAggregate, error) {
		var h outboxdriver.HeldAggregate
		err := r.Scan(&h.AggregateType, &h.AggregateID, &h.EventID, &h.Reason, &h.Since, &h.Waiting, &h.LastError)
		return h, err
	})
	if err != nil {
		return nil, d.fail(ctx, t, "held aggregates of", err)
	}
	return out, nil
}

// ReleaseHeld lets the later events of the aggregate held behind the dead
// letter eventID flow on, leaving the dead letter where it is, and writes the
// audit row in the same transaction. An aggregate held behind an event
// that is still being retried is not released (its order would break
// while the event may yet be published): ErrNotFound.
func (d *Driver) ReleaseHeld(ctx context.Context, t outboxdriver.Table, eventID string, by outboxdriver.Acting) (outboxdriver.HeldAggregate, error) {
	var h outboxdriver.HeldAggregate
	n, err := d.names(t)
	if err != nil {
		return h, err
	}
	u, err := uuid.Parse(eventID)
	if err != nil {
		return h, fmt.Errorf("outboxpgx: dead letter %q of %s: %w", eventID, t, outboxdriver.ErrNotFound)
	}
	err = pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `WITH gone AS (
    DELETE FROM `+n.Held+` h
    WHERE h.event_id = $1
      AND EXISTS (SELECT 1 FROM `+n.DeadLetter+` dl WHERE dl.id = h.event_id)
    RETURNING h.aggregatetype, h.aggregateid, h.event_id, h.reason, h.held_at
), unmark AS (
    UPDATE `+n.DeadLetter+` dl SET held = false FROM gone WHERE dl.id = gone.event_id
    RETURNING dl.last_error
)
SELECT g.aggregatetype, g.aggregateid, g.event_id::text, g.reason, g.held_at, coalesce((SELECT last_error FROM unmark), '')
FROM gone g`, u).Scan(&h.AggregateType, &h.AggregateID, &h.EventID, &h.Reason, &h.Since, &h.LastError)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("outboxpgx: dead letter %s of %s holds no aggregate: %w", eventID, t, outboxdriver.ErrNotFound)
		}
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+n.Audit+` (actor, role, action, event_id, detail, reason) VALUES ($1, $2, $3, $4, $5, $6)`,
			by.Name, by.Role, actionRelease, h.EventID, "released "+h.AggregateType+"/"+h.AggregateID+" held behind it", by.Reason); err != nil {
			return err
		}
		// Wake idle relays: the aggregate's later events are claimable.
		_, err = tx.Exec(ctx, `SELECT pg_notify($1, '')`, t.WithDefaults().Channel())
		return err
	})
	if errors.Is(err, outboxdriver.ErrNotFound) {
		return h, err
	}
	if err != nil {
		return h, d.fail(ctx, t, "release held aggregate of", err)
	}
	return h, nil
}

// pausesIn is for Status: the pauses on a table of schema version 6 or
// newer.
func pausesIn(ctx context.Context, pool *pgxpool.Pool, t outboxdriver.Table, version int) ([]outboxdriver.Pause, error) {
	if version < 6 {
		return nil, nil
	}
	return listPauses(ctx, pool, t)
}

// errorClass is the SQL of a dead letter's error class: its last error
// with UUIDs and numbers of four or more digits blanked, cut to 200
// characters. A group of an event type and class is named by the column
// failure_group (schema version 11): md5(length(type) ':' type class),
// computed by the database when the dead letter is written.
const errorClass = `left(regexp_replace(regexp_replace(last_error, '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', '<id>', 'gi'), '[0-9]{4,}', '<n>', 'g'), 200)`

// FailureGroups lists up to limit groups of t's dead letters (same event
// type, same error class), largest first. It reads the index of the
// failure_group column (schema version 11), not the dead letters.
func (d *Driver) FailureGroups(ctx context.Context, t outboxdriver.Table, limit int) ([]outboxdriver.FailureGroup, error) {
	n, err := d.names(t)
	if err != nil {
		return nil, err
	}
	// Each group from the index alone: the groups one after the other (a
	// skip scan), then each one's count, first and last.
	rows, err := d.pool.Query(ctx, `WITH RECURSIVE k AS (
    (SELECT failure_group AS key FROM `+n.DeadLetter+` ORDER BY failure_group LIMIT 1)
    UNION ALL
    SELECT (SELECT failure_group FROM `+n.DeadLetter+` WHERE failure_group > k.key ORDER BY failure_group LIMIT 1) FROM k WHERE k.key IS NOT NULL
), g AS (
    SELECT k.key AS failure_group, c.n, c.first, c.last FROM k CROSS JOIN LATERAL (
        SELECT count(*) AS n, min(dead_lettered_at) AS first, max(dead_lettered_at) AS last FROM `+n.DeadLetter+` WHERE failure_group = k.key
    ) c
    WHERE k.key IS NOT NULL ORDER BY 2 DESC, 3 LIMIT $1
)
SELECT g.failure_group, e.type, `+errorClass+`, g.n, g.first, g.last, e.id::text
FROM g CROSS JOIN LATERAL (
    SELECT type, last_error, id FROM `+n.DeadLetter+` WHERE failure_group = g.failure_group ORDER BY dead_lettered_at, seq LIMIT 1
) e
ORDER BY g.n DESC, g.first`, limit)
	if err != nil {
		return nil, d.fail(ctx, t, "failure groups of", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outboxdriver.FailureGroup, error) {
		var g outboxdriver.FailureGroup
		err := r.Scan(&g.Key, &g.Type, &g.ErrorClass, &g.Count, &g.First, &g.Last, &g.Example)
		return g, err
	})
	if err != nil {
		return nil, d.fail(ctx, t, "failure groups of", err)
	}
	return out, nil
}

// FailureGroupIDs returns the ids of up to limit dead letters of the
// group key, oldest first.
func (d *Driver) FailureGroupIDs(ctx context.Context, t outboxdriver.Table, key string, limit int) ([]string, error) {
	n, err := d.names(t)
	if err != nil {
		return nil, err
	}
	rows, err := d.pool.Query(ctx, `SELECT id::text FROM `+n.DeadLetter+` WHERE failure_group = $1 ORDER BY dead_lettered_at, seq LIMIT $2`, key, limit)
	if err != nil {
		return nil, d.fail(ctx, t, "failure group "+key+" of", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, d.fail(ctx, t, "failure group "+key+" of", err)
	}
	return ids, nil
}

// ExactUpTo is the count up to which the console's numbers are exact
// (EstimateStatus, Backlog, RecordSample, HeldAggregates' waiting events):
// counting that many rows reads no more than that many index entries.
const ExactUpTo = 1_000

// oldestWindow is how many of the oldest unpublished events Backlog reads
// for each kind's oldest when it estimates.
const oldestWindow = 2_000

// Backlog lists up to limit groups (aggregate type, event type) of t's
// unpublished events, largest first, with the age of each one's oldest.
// Up to ExactUpTo unpublished events it counts them; above, each group's
// count is its share of a sample of the table (TABLESAMPLE SYSTEM, about
// sampleBlocks blocks) times the backlog's estimate, and its oldest is
// exact when the group is among the oldestWindow oldest events (else the
// sample's oldest): KindBacklog.Estimated.
func (d *Driver) Backlog(ctx context.Context, t outboxdriver.Table, limit int) ([]outboxdriver.KindBacklog, error) {
	n, err := d.names(t)
	if err != nil {
		return nil, err
	}
	c, err := countTable(ctx, d.pool, n, ExactUpTo)
	if err != nil {
		return nil, d.fail(ctx, t, "backlog of", err)
	}
	if !c.backlog.estimated {
		rows, err := d.pool.Query(ctx, `SELECT aggregatetype, type, count(*), extract(epoch FROM now() - min(created_at))::float8
FROM `+n.Table+` WHERE published_at IS NULL
GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2 LIMIT $1`, limit)
		if err != nil {
			return nil, d.fail(ctx, t, "backlog of", err)
		}
		out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outboxdriver.KindBacklog, error) {
			var g outboxdriver.KindBacklog
			var age float64
			err := r.Scan(&g.AggregateType, &g.Type, &g.Backlog, &age)
			g.OldestAge = time.Duration(max(age, 0) * float64(time.Second))
			return g, err
		})
		if err != nil {
			return nil, d.fail(ctx, t, "backlog of", err)
		}
		return out, nil
	}
	frac, err := sampleFraction(ctx, d.pool, n.Table)
	if err != nil {
		return nil, d.fail(ctx, t, "backlog of", err)
	}
	rows, err := d.pool.Query(ctx, `WITH s AS (
    SELECT aggregatetype, type, count(*) AS n, min(created_at) AS oldest
    FROM `+n.Table+` TABLESAMPLE SYSTEM ($1) WHERE published_at IS NULL GROUP BY 1, 2
), w AS (
    SELECT aggregatetype, type, count(*) AS n, min(created_at) AS oldest
    FROM (SELECT aggregatetype, type, created_at FROM `+n.Table+` WHERE published_at IS NULL ORDER BY seq LIMIT $2) x GROUP BY 1, 2
)
SELECT aggregatetype, type, coalesce(s.n, 0), coalesce(w.n, 0), greatest(extract(epoch FROM now() - least(s.oldest, w.oldest)), 0)::float8
FROM s FULL JOIN w USING (aggregatetype, type)`, frac, oldestWindow)
	if err != nil {
		return nil, d.fail(ctx, t, "backlog of", err)
	}
	type group struct {
		outboxdriver.KindBacklog
		sampled, first int64
	}
	gs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (group, error) {
		var g group
		var age float64
		err := r.Scan(&g.AggregateType, &g.Type, &g.sampled, &g.first, &age)
		g.OldestAge = time.Duration(age * float64(time.Second))
		return g, err
	})
	if err != nil {
		return nil, d.fail(ctx, t, "backlog of", err)
	}
	var sampled int64
	for _, g := range gs {
		sampled += g.sampled
	}
	out := make([]outboxdriver.KindBacklog, len(gs))
	for i, g := range gs {
		g.Backlog, g.Estimated = g.first, true
		if sampled > 0 {
			g.Backlog = max(g.first, int64(math.Round(float64(c.backlog.n)*float64(g.sampled)/float64(sampled))))
		}
		out[i] = g.KindBacklog
	}
	slices.SortFunc(out, func(a, b outboxdriver.KindBacklog) int {
		return cmp.Or(cmp.Compare(b.Backlog, a.Backlog), cmp.Compare(a.AggregateType, b.AggregateType), cmp.Compare(a.Type, b.Type))
	})
	return out[:min(len(out), limit)], nil
}

// Relays lists the relays registered on t (alive or not yet cleaned up),
// then the log-tailing relays that hold or held the lease of one of its
// replication slots, each named for its owner and slot (docs/cdc.md).
func (d *Driver) Relays(ctx context.Context, t outboxdriver.Table) ([]outboxdriver.RelayStatus, error) {
	n, err := d.names(t)
	if err != nil {
		return nil, err
	}
	withVersions, err := hasColumn(ctx, d.pool, n.Relays, "schema_version")
	if err != nil {
		return nil, d.fail(ctx, t, "relays of", err)
	}
	rows, err := d.pool.Query(ctx, pgschema.RelaysSQL(t.WithDefaults(), withVersions))
	if err != nil {
		return nil, d.fail(ctx, t, "relays of", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outboxdriver.RelayStatus, error) {
		return pgschema.ScanRelay(r.Scan)
	})
	if err != nil {
		return nil, d.fail(ctx, t, "relays of", err)
	}
	streamers, err := pgschema.Streamers(ctx, pgschema.PgxTx(d.pool), t.WithDefaults())
	if err != nil {
		return nil, d.fail(ctx, t, "relays of", err)
	}
	return append(out, streamers...), nil
}

// RecordSample stores one sample of t (backlog, oldest age, dead letters,
// the sequence's last value) and deletes samples older than keep. The
// counts are exact up to ExactUpTo and estimated above, as
// EstimateStatus's.
func (d *Driver) RecordSample(ctx context.Context, t outboxdriver.Table, keep time.Duration) error {
	n, err := d.names(t)
	if err != nil {
		return err
	}
	c, err := countTable(ctx, d.pool, n, ExactUpTo)
	if err != nil {
		return d.fail(ctx, t, "sample of", err)
	}
	samples := t.WithDefaults().Qualified("_samples")
	_, err = d.pool.Exec(ctx, `WITH gone AS (DELETE FROM `+samples+` WHERE at < clock_timestamp() - $1 * interval '1 millisecond')
INSERT INTO `+samples+` (backlog, oldest_age, dead_letters, last_seq) VALUES ($2, $3, $4, $5)
ON CONFLICT (at) DO NOTHING`, keep.Milliseconds(), c.backlog.n, c.oldestAge, c.dead.n, c.lastSeq)
	if err != nil {
		return d.fail(ctx, t, "sample of", err)
	}
	return nil
}

// Samples lists t's samples since a time, oldest first, each with the
// discards audited since the previous one. A table that predates the
// samples table has none.
func (d *Driver) Samples(ctx context.Context, t outboxdriver.Table, since time.Time) ([]outboxdriver.Sample, error) {
	if _, err := d.names(t); err != nil {
		return nil, err
	}
	t = t.WithDefaults()
	rows, err := d.pool.Query(ctx, `SELECT x.at, x.backlog, x.oldest_age, x.dead_letters, x.last_seq,
       (SELECT count(*) FROM `+t.Qualified("_audit")+` a WHERE a.action = 'discard' AND a.at > x.prev AND a.at <= x.at)
FROM (SELECT at, backlog, oldest_age, dead_letters, last_seq, lag(at) OVER (ORDER BY at) AS prev FROM `+t.Qualified("_samples")+` WHERE at >= $1) x
ORDER BY x.at`, since)
	if err != nil {
		if isUndefinedTable(err) {
			if ok, merr := migrated(ctx, d.pool, t); merr == nil && !ok {
				return nil, driverkit.NotMigrated("outboxpgx", t)
			}
			return nil, nil
		}
		return nil, d.fail(ctx, t, "samples of", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[outboxdriver.Sample])
	if err != nil {
		return nil, d.fail(ctx, t, "samples of", err)
	}
	return out, nil
}
