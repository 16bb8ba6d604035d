package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Audit actions of pauses and releases.
const (
	actionPause   = "pause"
	actionResume  = "resume"
	actionRelease = "release"
)

// ListPauses lists the pauses in force on t, oldest first. A table that
// predates the pause table has none; one that does not exist wraps
// outboxdriver.ErrNotMigrated.
func (s Store) ListPauses(ctx context.Context, t outboxdriver.Table) ([]outboxdriver.Pause, error) {
	db, n, err := s.open(t)
	if err != nil {
		return nil, err
	}
	ps, err := s.listPauses(ctx, db, t, n)
	if err == nil && ps == nil {
		switch ok, err := s.d.Migrated(ctx, db, n.t); {
		case err != nil:
			return nil, fmt.Errorf("%s: pauses of %s: %w", s.d.Driver, t, oneLine(err))
		case !ok:
			return nil, driverkit.NotMigrated(s.d.Driver, t)
		}
	}
	return ps, err
}

// queryer is a pool, a connection or a transaction.
type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func (s Store) listPauses(ctx context.Context, db queryer, t outboxdriver.Table, n tables) ([]outboxdriver.Pause, error) {
	rows, err := db.QueryContext(ctx, "SELECT scope, `value`, actor, role, reason, "+s.d.TimeText("since")+` FROM `+n.pause+" ORDER BY since, scope, `value`")
	if err != nil {
		if s.d.NoTable(err) {
			return nil, nil
		}
		return nil, s.fail(ctx, t, "pauses of", err)
	}
	defer rows.Close()
	out := []outboxdriver.Pause{} // not nil: the table exists
	for rows.Next() {
		var p outboxdriver.Pause
		if err := rows.Scan(&p.Kind, &p.Value, &p.Actor, &p.Role, &p.Reason, timeCol{&p.Since}); err != nil {
			return nil, s.fail(ctx, t, "pauses of", err)
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fail(ctx, t, "pauses of", err)
	}
	return out, nil
}

// SetPause pauses sc on t and writes the audit row in the same
// transaction; it reports false, writing nothing, when sc was paused
// already. Relays see it within one poll interval.
func (s Store) SetPause(ctx context.Context, t outboxdriver.Table, sc outboxdriver.PauseScope, by outboxdriver.Acting) (bool, error) {
	return s.changePause(ctx, t, sc, by, actionPause)
}

// LiftPause resumes sc on t and writes the audit row in the same
// transaction; it reports false, writing nothing, when sc was not paused.
func (s Store) LiftPause(ctx context.Context, t outboxdriver.Table, sc outboxdriver.PauseScope, by outboxdriver.Acting) (bool, error) {
	return s.changePause(ctx, t, sc, by, actionResume)
}

func (s Store) changePause(ctx context.Context, t outboxdriver.Table, sc outboxdriver.PauseScope, by outboxdriver.Acting, action string) (bool, error) {
	db, n, err := s.open(t)
	if err != nil {
		return false, err
	}
	if err := sc.Validate(); err != nil {
		return false, fmt.Errorf("%s: %w", s.d.Driver, err)
	}
	var changed bool
	err = s.inTx(ctx, db, func(tx *sql.Tx) error {
		var res sql.Result
		var err error
		if action == actionPause {
			res, err = tx.ExecContext(ctx, s.d.InsertIgnore+` INTO `+n.pause+" (scope, `value`, actor, role, reason, since) VALUES (?, ?, ?, ?, ?, "+s.d.Now+`)`,
				string(sc.Kind), sc.Value, by.Name, by.Role, by.Reason)
		} else {
			res, err = tx.ExecContext(ctx, `DELETE FROM `+n.pause+" WHERE scope = ? AND `value` = ?", string(sc.Kind), sc.Value)
		}
		if err != nil {
			return err
		}
		if k, err := res.RowsAffected(); err != nil || k == 0 {
			return err
		}
		changed = true
		_, err = tx.ExecContext(ctx, `INSERT INTO `+n.audit+` (actor, role, action, detail, reason) VALUES (?, ?, ?, ?, ?)`,
			by.Name, by.Role, action, sc.String(), by.Reason)
		return err
	})
	if err != nil {
		return false, s.fail(ctx, t, action+" of", err)
	}
	return changed, nil
}

// heldCols are the columns of a held aggregate, for the held table h.
// A dead letter is the held event only with the held row's seq: an
// event kept in the table because the dead letters hold another event
// with its id (driverkit.KeepClashes) is held as retrying.
func (s Store) heldCols(n tables) string {
	return `h.aggregatetype, h.aggregateid, h.event_id,
       CASE WHEN EXISTS (SELECT 1 FROM ` + n.dead + ` dl WHERE dl.id = h.event_id AND dl.seq = h.seq) THEN 'dead-lettered' ELSE 'retrying' END,
       ` + s.d.TimeText("h.held_at") + `,
       (SELECT count(*) FROM ` + n.table + ` o
        WHERE o.aggregatetype = h.aggregatetype AND o.aggregateid = h.aggregateid
          AND o.published_at IS NULL AND o.id <> h.event_id),
       coalesce((SELECT dl.last_error FROM ` + n.dead + ` dl WHERE dl.id = h.event_id AND dl.seq = h.seq),
                (SELECT o.last_error FROM ` + n.table + ` o WHERE o.id = h.event_id), '')`
}

func scanHeld(r interface{ Scan(...any) error }) (outboxdriver.HeldAggregate, error) {
	var h outboxdriver.HeldAggregate
	err := r.Scan(&h.AggregateType, &h.AggregateID, &h.EventID, &h.Reason, timeCol{&h.Since}, &h.Waiting, &h.LastError)
	return h, err
}

// HeldAggregates lists up to limit held aggregates of t, longest held
// first, with the event each waits behind and how many events wait.
func (s Store) HeldAggregates(ctx context.Context, t outboxdriver.Table, limit int) ([]outboxdriver.HeldAggregate, error) {
	db, n, err := s.open(t)
	if err != nil {
		return nil, err
	}
	if limit <= 0 {
		return nil, fmt.Errorf("%s: held aggregates of %s: limit %d, want a positive one", s.d.Driver, t, limit)
	}
	rows, err := db.QueryContext(ctx, `SELECT `+s.heldCols(n)+` FROM `+n.held+` h ORDER BY h.held_at, h.aggregatetype, h.aggregateid LIMIT ?`, limit)
	if err != nil {
		return nil, s.fail(ctx, t, "held aggregates of", err)
	}
	defer rows.Close()
	out := []outboxdriver.HeldAggregate{}
	for rows.Next() {
		h, err := scanHeld(rows)
		if err != nil {
			return nil, s.fail(ctx, t, "held aggregates of", err)
		}
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fail(ctx, t, "held aggregates of", err)
	}
	return out, nil
}

// ReleaseHeld lets the later events of the aggregate held behind the dead
// letter eventID flow on, leaving the dead letter where it is, and writes
// the audit row in the same transaction. An aggregate held behind an
// event that is still being retried is not released: ErrNotFound.
func (s Store) ReleaseHeld(ctx context.Context, t outboxdriver.Table, eventID string, by outboxdriver.Acting) (outboxdriver.HeldAggregate, error) {
	var h outboxdriver.HeldAggregate
	db, n, err := s.open(t)
	if err != nil {
		return h, err
	}
	id, ok := canonID(eventID)
	notHeld := fmt.Errorf("%s: dead letter %s of %s holds no aggregate: %w", s.d.Driver, eventID, t, outboxdriver.ErrNotFound)
	if !ok {
		return h, notHeld
	}
	err = s.inTx(ctx, db, func(tx *sql.Tx) error {
		var err error
		h, err = scanHeld(tx.QueryRowContext(ctx, `SELECT `+s.heldCols(n)+` FROM `+n.held+` h
WHERE h.event_id = ? AND EXISTS (SELECT 1 FROM `+n.dead+` dl WHERE dl.id = h.event_id)`+s.d.ForUpdate, id))
		if errors.Is(err, sql.ErrNoRows) {
			return notHeld
		}
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM `+n.held+` WHERE event_id = ?`, id); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE `+n.dead+` SET held = FALSE WHERE id = ?`, id); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO `+n.audit+` (actor, role, action, event_id, detail, reason) VALUES (?, ?, ?, ?, ?, ?)`,
			by.Name, by.Role, actionRelease, id, "released "+h.AggregateType+"/"+h.AggregateID+" held behind it", by.Reason)
		return err
	})
	if err != nil {
		return h, s.fail(ctx, t, "release held aggregate of", err)
	}
	return h, nil
}

// groupedDeadLetter is one dead letter as grouping reads it.
type groupedDeadLetter struct {
	id, typ, class, key string
	at                  time.Time
}

// grouped reads every dead letter of t, oldest first, with its failure
// group.
func (s Store) grouped(ctx context.Context, t outboxdriver.Table) ([]groupedDeadLetter, error) {
	db, n, err := s.open(t)
	if err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, `SELECT id, type, last_error, `+s.d.TimeText("dead_lettered_at")+` FROM `+n.dead+` ORDER BY dead_lettered_at, seq`)
	if err != nil {
		return nil, s.fail(ctx, t, "failure groups of", err)
	}
	defer rows.Close()
	var out []groupedDeadLetter
	for rows.Next() {
		var g groupedDeadLetter
		var last string
		if err := rows.Scan(&g.id, &g.typ, &last, timeCol{&g.at}); err != nil {
			return nil, s.fail(ctx, t, "failure groups of", err)
		}
		g.class = driverkit.ErrorClass(last)
		g.key = driverkit.FailureGroupKey(g.typ, g.class)
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fail(ctx, t, "failure groups of", err)
	}
	return out, nil
}

// FailureGroups lists up to limit groups of t's dead letters (same event
// type, same error class), largest first. It reads every dead letter.
func (s Store) FailureGroups(ctx context.Context, t outboxdriver.Table, limit int) ([]outboxdriver.FailureGroup, error) {
	all, err := s.grouped(ctx, t)
	if err != nil {
		return nil, err
	}
	byKey := map[string]*outboxdriver.FailureGroup{}
	var groups []*outboxdriver.FailureGroup
	for _, d := range all { // oldest first: the first of a group is its example
		g := byKey[d.key]
		if g == nil {
			g = &outboxdriver.FailureGroup{Key: d.key, Type: d.typ, ErrorClass: d.class, First: d.at, Example: d.id}
			byKey[d.key] = g
			groups = append(groups, g)
		}
		g.Count++
		g.Last = d.at
	}
	slices.SortStableFunc(groups, func(a, b *outboxdriver.FailureGroup) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), a.First.Compare(b.First))
	})
	out := []outboxdriver.FailureGroup{}
	for _, g := range groups[:min(len(groups), max(limit, 0))] {
		out = append(out, *g)
	}
	return out, nil
}

// FailureGroupIDs returns the ids of up to limit dead letters of the
// group key, oldest first.
func (s Store) FailureGroupIDs(ctx context.Context, t outboxdriver.Table, key string, limit int) ([]string, error) {
	all, err := s.grouped(ctx, t)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, d := range all {
		if d.key == key && len(ids) < limit {
			ids = append(ids, d.id)
		}
	}
	return ids, nil
}

// Backlog lists up to limit groups (aggregate type, event type) of t's
// unpublished events, largest first, with the age of each one's oldest.
// It reads every unpublished row.
func (s Store) Backlog(ctx context.Context, t outboxdriver.Table, limit int) ([]outboxdriver.KindBacklog, error) {
	db, n, err := s.open(t)
	if err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, `SELECT aggregatetype, type, count(*), `+s.d.AgeSeconds("min(created_at)")+`
FROM `+n.table+` WHERE published_at IS NULL
GROUP BY aggregatetype, type ORDER BY 3 DESC, 1, 2 LIMIT ?`, limit)
	if err != nil {
		return nil, s.fail(ctx, t, "backlog of", err)
	}
	defer rows.Close()
	var out []outboxdriver.KindBacklog
	for rows.Next() {
		var g outboxdriver.KindBacklog
		var age float64
		if err := rows.Scan(&g.AggregateType, &g.Type, &g.Backlog, &age); err != nil {
			return nil, s.fail(ctx, t, "backlog of", err)
		}
		g.OldestAge = time.Duration(max(age, 0) * float64(time.Second))
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fail(ctx, t, "backlog of", err)
	}
	return out, nil
}

// backlogColumns are the columns BacklogBy groups by, as SQL; created_at
// is rendered by the Dialect's TimeText and turned into RFC 3339 in Go.
var backlogColumns = map[string]string{"aggregatetype": "aggregatetype", "aggregateid": "aggregateid", "type": "type", "id": "id", "created_at": ""}

// BacklogBy groups t's unpublished events by column (aggregatetype,
// aggregateid, type, id or created_at, the latter as RFC 3339 with
// microseconds in UTC, as package route renders it) and returns at most
// limit groups, the largest first, and one more with Rest set holding the
// others when there are more. It reads every unpublished row.
func (s Store) BacklogBy(ctx context.Context, t outboxdriver.Table, column string, limit int) ([]outboxdriver.BacklogGroup, error) {
	expr, ok := backlogColumns[column]
	if !ok {
		return nil, fmt.Errorf("%s: cannot group the backlog by %q", s.d.Driver, column)
	}
	if expr == "" {
		expr = s.d.TimeText("created_at")
	}
	if limit < 1 {
		return nil, fmt.Errorf("%s: backlog groups limit %d: use at least 1", s.d.Driver, limit)
	}
	db, n, err := s.open(t)
	if err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, `WITH g AS (
    SELECT `+expr+` AS v, count(*) AS n, min(created_at) AS oldest
    FROM `+n.table+` WHERE published_at IS NULL GROUP BY `+expr+`
), r AS (SELECT v, n, oldest, row_number() OVER (ORDER BY n DESC, v) AS rn FROM g)
SELECT CASE WHEN rn <= ? THEN v END AS value, rn > ? AS rest, sum(n), `+s.d.AgeSeconds("min(oldest)")+`
FROM r GROUP BY CASE WHEN rn <= ? THEN v END, rn > ? ORDER BY 2, 3 DESC, 1`, limit, limit, limit, limit)
	if err != nil {
		return nil, s.fail(ctx, t, "backlog by "+column+" of", err)
	}
	defer rows.Close()
	var out []outboxdriver.BacklogGroup
	for rows.Next() {
		var g outboxdriver.BacklogGroup
		var v sql.NullString
		var age float64
		if err := rows.Scan(&v, &g.Rest, &g.Events, &age); err != nil {
			return nil, s.fail(ctx, t, "backlog by "+column+" of", err)
		}
		g.Value, g.OldestAge = v.String, time.Duration(max(age, 0)*float64(time.Second))
		if column == "created_at" && !g.Rest {
			at, err := time.Parse("2006-01-02 15:04:05.999999", g.Value)
			if err != nil {
				return nil, s.fail(ctx, t, "backlog by "+column+" of", err)
			}
			g.Value = at.UTC().Format("2006-01-02T15:04:05.000000Z")
		}
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fail(ctx, t, "backlog by "+column+" of", err)
	}
	return out, nil
}

// Relays lists the relays registered on t (alive or not yet cleaned up).
func (s Store) Relays(ctx context.Context, t outboxdriver.Table) ([]outboxdriver.RelayStatus, error) {
	db, n, err := s.open(t)
	if err != nil {
		return nil, err
	}
	// The versions and renewal are there from the schema version that
	// records them (MySQL 6, SQLite 4); before it, unknown.
	relaysSQL := func(withVersions bool) string {
		cols := `0, '', NULL`
		if withVersions {
			cols = "COALESCE(schema_version, 0), `release`, " + s.d.TimeText("renewed_at")
		}
		return `SELECT relay, ` + s.d.TimeText("started_at") + `, ` + s.d.AgeSeconds("expires_at") + `, ` + cols + ` FROM ` + n.relays + ` ORDER BY relay`
	}
	rows, err := db.QueryContext(ctx, relaysSQL(true))
	if err != nil && s.d.NoTable(err) {
		rows, err = db.QueryContext(ctx, relaysSQL(false))
	}
	if err != nil {
		return nil, s.fail(ctx, t, "relays of", err)
	}
	defer rows.Close()
	var out []outboxdriver.RelayStatus
	for rows.Next() {
		var x outboxdriver.RelayStatus
		var age float64
		var renewed *time.Time
		if err := rows.Scan(&x.Name, timeCol{&x.Started}, &age, &x.SchemaVersion, text{&x.Release}, nullTime{&renewed}); err != nil {
			return nil, s.fail(ctx, t, "relays of", err)
		}
		x.ExpiresIn = -time.Duration(age * float64(time.Second))
		if renewed != nil {
			x.RenewedAt = *renewed
		}
		out = append(out, x)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fail(ctx, t, "relays of", err)
	}
	return out, nil
}

// RecordSample stores one sample of t (backlog, oldest age, dead letters,
// the last position handed out) and deletes samples older than keep.
func (s Store) RecordSample(ctx context.Context, t outboxdriver.Table, keep time.Duration) error {
	db, n, err := s.open(t)
	if err != nil {
		return err
	}
	lastSeq, args := s.d.LastSeq(n.t)
	err = s.inTx(ctx, db, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM `+n.samples+` WHERE at < `+s.d.NowMinusMS, keep.Milliseconds()); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, s.d.InsertIgnore+` INTO `+n.samples+` (at, backlog, oldest_age, dead_letters, last_seq)
SELECT `+s.d.Now+`,
       (SELECT count(*) FROM `+n.table+` WHERE published_at IS NULL),
       (SELECT coalesce(`+s.d.AgeSeconds("min(created_at)")+`, 0) FROM `+n.table+` WHERE published_at IS NULL),
       (SELECT count(*) FROM `+n.dead+`),
       coalesce((`+lastSeq+`), 0)`, args...)
		return err
	})
	if err != nil {
		return s.fail(ctx, t, "sample of", err)
	}
	return nil
}

// Samples lists t's samples since a time, oldest first, each with the
// discards audited since the previous one.
func (s Store) Samples(ctx context.Context, t outboxdriver.Table, since time.Time) ([]outboxdriver.Sample, error) {
	db, n, err := s.open(t)
	if err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, `SELECT `+s.d.TimeText("x.at")+`, x.backlog, x.oldest_age, x.dead_letters, x.last_seq,
       (SELECT count(*) FROM `+n.audit+` a WHERE a.action = 'discard' AND a.at > x.prev AND a.at <= x.at)
FROM (SELECT at, backlog, oldest_age, dead_letters, last_seq, lag(at) OVER (ORDER BY at) AS prev FROM `+n.samples+` WHERE at >= ?) x
ORDER BY x.at`, s.d.TimeArg(since))
	if err != nil {
		return nil, s.fail(ctx, t, "samples of", err)
	}
	defer rows.Close()
	var out []outboxdriver.Sample
	for rows.Next() {
		var x outboxdriver.Sample
		if err := rows.Scan(timeCol{&x.At}, &x.Backlog, &x.OldestAge, &x.DeadLetters, &x.LastSeq, &x.Discarded); err != nil {
			return nil, s.fail(ctx, t, "samples of", err)
		}
		out = append(out, x)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fail(ctx, t, "samples of", err)
	}
	return out, nil
}

// MaintainTimePartitions does nothing: time partitions are made on
// PostgreSQL only (outboxdriver.ErrNoTimePartitions), so no table here has
// any.
func (s Store) MaintainTimePartitions(context.Context, outboxdriver.Table, outboxdriver.TimePartitionMaintenance) ([]outboxdriver.TimePartitionChange, error) {
	return nil, nil
}
