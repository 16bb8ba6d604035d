package outboxsqlite

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/migrations"
	"github.com/outboxkit/outbox/outboxdriver"
)

// WatchInterval is how often a waiting Source looks at PRAGMA
// data_version for a commit by another connection.
const WatchInterval = 10 * time.Millisecond

// source is the relay's view of an outbox table in SQLite.
//
// A claim is one short write transaction: it selects the due records of
// the leased partitions that no batch holds, and marks their partitions
// with the batch's token (claimed_by in the leases table) for one lease
// TTL. Finish checks the leases and the marks (the fence), records the
// outcome and clears the marks in a second short transaction. Between the
// two, while the batch is published, no lock is held.
type source struct {
	driverkit.SourceBase // its TTL: how long a claim's marks last
	db                   *sql.DB
	q                    queries

	// seen is the data_version that Wait compares against: read before
	// every claim, so a commit after it ends the next Wait at once.
	exclude atomic.Pointer[[]string] // aggregate types the claims leave out (paused)
	delays  driverkit.ColumnProbe    // the deliver_at column (schema version 3)
	// versions is the relays' schema_version column (relayVersionsSince).
	versions driverkit.ColumnProbe
	// latest is the newest schema version this relay's code knows, which
	// it records and checks the table against (CheckSchema).
	latest  int
	release string

	seen   atomic.Int64
	seenOK atomic.Bool

	wmu    sync.Mutex // guards the watcher
	wconn  *sql.Conn
	wstmt  *sql.Stmt
	closed bool
}

var _ outboxdriver.Source = (*source)(nil)

type queries struct {
	claim, mark, unclaim, fence, claimedByMe                                 string
	claimNoDelays                                                            string // claim before schema version 3 (no deliver_at)
	markPublished, unhold, retry, holdRetry, deadLetter, deleteOne, holdDead string
	heartbeat, relays, acquire, renew, release, unregister, cleanup          string
	// heartbeatVersions and relaysVersions are heartbeat and relays for a
	// registry that records the relays' versions: relays too old for the
	// table are left out of the share (docs/operations.md, Upgrades).
	heartbeatVersions, relaysVersions, checkSchema string
}

// leasePairs matches the rows of a leases table l against the JSON object
// {"partition": epoch, ...} in parameter ?n. The subquery is not
// correlated: SQLite reads the JSON once per statement.
func leasePairs(n int) string {
	return fmt.Sprintf(`(l.partition, l.epoch) IN (SELECT CAST(key AS INTEGER), value FROM json_each(?%d))`, n)
}

func newQueries(t outboxdriver.Table, r outboxdriver.Retention) queries {
	n := namesOf(t)
	// The deliver_at conditions (schema version 3): the row's own time
	// has come, and no earlier pending row of its aggregate waits
	// (delayed, or a retry's next_attempt_at ahead), found through the
	// partial index of the rows that wait, whose condition the probe
	// repeats word for word so that SQLite uses it.
	waiting := `
  AND (o.deliver_at IS NULL OR o.deliver_at <= ` + nowSQL + `)
  AND NOT EXISTS (SELECT 1 FROM ` + n.Table + ` AS w
                  WHERE w.published_at IS NULL AND (w.next_attempt_at IS NOT NULL OR w.deliver_at IS NOT NULL)
                    AND w.aggregatetype = o.aggregatetype AND w.aggregateid = o.aggregateid AND w.seq < o.seq
                    AND (w.deliver_at > ` + nowSQL + ` OR w.next_attempt_at > ` + nowSQL + `))`
	q := queries{
		claim: `SELECT o.id, o.seq, o.partition, o.aggregatetype, o.aggregateid, o.type, o.payload, o.payload_raw,
       o.headers, coalesce(o.tracingspancontext, ''), o.created_at, o.attempts
FROM ` + n.Table + ` AS o
WHERE o.partition IN (
        SELECT l.partition FROM ` + n.Leases + ` AS l
        WHERE l.owner = ?2 AND l.expires_at > ` + nowSQL + ` AND ` + leasePairs(1) + `
          AND (l.claimed_by IS NULL OR l.claim_expires_at <= ` + nowSQL + `))
  AND o.published_at IS NULL
  AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= ` + nowSQL + `)
` + waiting + `
  AND NOT EXISTS (SELECT 1 FROM ` + n.Held + ` AS h
                  WHERE h.aggregatetype = o.aggregatetype AND h.aggregateid = o.aggregateid AND h.seq < o.seq)
  AND o.aggregatetype NOT IN (SELECT value FROM json_each(?4))
ORDER BY o.seq
LIMIT ?3`,
		mark: `UPDATE ` + n.Leases + ` SET claimed_by = ?1, claim_expires_at = ` + nowPlusSQL(2) + `
WHERE partition IN (SELECT value FROM json_each(?3))`,
		unclaim: `UPDATE ` + n.Leases + ` SET claimed_by = NULL, claim_expires_at = NULL WHERE claimed_by = ?1`,
		fence: `SELECT count(*) FROM ` + n.Leases + ` AS l
WHERE l.owner = ?2 AND l.expires_at > ` + nowSQL + ` AND ` + leasePairs(1),
		claimedByMe: `SELECT count(*) FROM ` + n.Leases + ` WHERE claimed_by = ?1`,
		unhold:      `DELETE FROM ` + n.Held + ` WHERE event_id IN (SELECT value FROM json_each(?1))`,
		retry: `UPDATE ` + n.Table + ` SET attempts = attempts + 1, last_error = ?2, next_attempt_at = ` + nowPlusSQL(3) + `
WHERE id = ?1`,
		holdRetry: `INSERT INTO ` + n.Held + ` (aggregatetype, aggregateid, seq, event_id, reason)
SELECT aggregatetype, aggregateid, seq, id, 'retrying' FROM ` + n.Table + ` WHERE id = ?1
ON CONFLICT (aggregatetype, aggregateid) DO NOTHING`,
		deadLetter: `INSERT INTO ` + n.DeadLetter + ` (id, aggregatetype, aggregateid, type, payload, seq, created_at,
    headers, tracingspancontext, payload_raw, attempts, last_error, held)
SELECT id, aggregatetype, aggregateid, type, payload, seq, created_at,
    headers, tracingspancontext, payload_raw, attempts + 1, ?2, ?3
FROM ` + n.Table + ` WHERE id = ?1`,
		deleteOne: `DELETE FROM ` + n.Table + ` WHERE id = ?1`,
		holdDead: `INSERT INTO ` + n.Held + ` (aggregatetype, aggregateid, seq, event_id, reason)
SELECT aggregatetype, aggregateid, seq, id, 'dead-lettered' FROM ` + n.DeadLetter + ` WHERE id = ?1
ON CONFLICT (aggregatetype, aggregateid) DO UPDATE SET reason = excluded.reason, held_at = ` + nowSQL + `
WHERE event_id = excluded.event_id`,
		heartbeat: `INSERT INTO ` + n.Relays + ` (relay, expires_at) VALUES (?1, ` + nowPlusSQL(2) + `)
ON CONFLICT (relay) DO UPDATE SET expires_at = excluded.expires_at`,
		relays: `SELECT (SELECT count(*) FROM ` + n.Relays + ` WHERE expires_at > ` + nowSQL + `),
       (SELECT count(*) FROM ` + n.Leases + `)`,
		heartbeatVersions: `INSERT INTO ` + n.Relays + ` (relay, expires_at, schema_version, "release", renewed_at)
VALUES (?1, ` + nowPlusSQL(2) + `, ?3, ?4, ` + nowSQL + `)
ON CONFLICT (relay) DO UPDATE SET expires_at = excluded.expires_at, schema_version = excluded.schema_version,
    "release" = excluded."release", renewed_at = excluded.renewed_at`,
		relaysVersions: `SELECT (SELECT count(*) FROM ` + n.Relays + ` WHERE expires_at > ` + nowSQL + `
          AND coalesce(schema_version, 0) >= (SELECT coalesce(max(relays_from), 0) FROM ` + n.Migrations + `)),
       (SELECT count(*) FROM ` + n.Leases + `)`,
		checkSchema: `SELECT coalesce(max(version), 0), coalesce(max(relays_from), 0) FROM ` + n.Migrations,
		acquire: `UPDATE ` + n.Leases + ` SET owner = ?1, epoch = epoch + 1, expires_at = ` + nowPlusSQL(3) + `
WHERE partition IN (
    SELECT partition FROM ` + n.Leases + `
    WHERE owner IS NULL OR expires_at IS NULL OR expires_at <= ` + nowSQL + `
    ORDER BY partition
    LIMIT ?2)
RETURNING partition, epoch`,
		renew: `UPDATE ` + n.Leases + ` AS l SET expires_at = ` + nowPlusSQL(3) + `
WHERE l.owner = ?1 AND ` + leasePairs(2) + `
RETURNING partition, epoch`,
		release: `UPDATE ` + n.Leases + ` AS l SET owner = NULL, expires_at = NULL
WHERE l.owner = ?1 AND ` + leasePairs(2),
		unregister: `DELETE FROM ` + n.Relays + ` WHERE relay = ?1`,
		cleanup: `DELETE FROM ` + n.Table + ` WHERE seq IN (
    SELECT seq FROM ` + n.Table + `
    WHERE published_at IS NOT NULL AND published_at < ` + nowPlusSQL(2) + `
      AND partition IN (SELECT value FROM json_each(?1))
    ORDER BY published_at
    LIMIT ?3)`,
	}
	if r == outboxdriver.RetentionKeep {
		q.markPublished = `UPDATE ` + n.Table + ` SET published_at = ` + nowSQL + `, last_error = NULL, next_attempt_at = NULL
WHERE id IN (SELECT value FROM json_each(?1))`
	} else {
		q.markPublished = `DELETE FROM ` + n.Table + ` WHERE id IN (SELECT value FROM json_each(?1))`
	}
	q.claimNoDelays = strings.Replace(q.claim, waiting, "", 1)
	return q
}

// NewSource returns the relay's view of table t in the Driver's database.
// It does no I/O.
func (d *Driver) NewSource(t outboxdriver.Table, cfg *outboxdriver.SourceConfig) (outboxdriver.Source, error) {
	t, db, err := d.table(t)
	if err != nil {
		return nil, err
	}
	s := &source{db: db, latest: migrations.Latest(all()), release: driverkit.Release()}
	if err := s.Init(t, cfg); err != nil {
		return nil, fmt.Errorf("outboxsqlite: %w", err)
	}
	s.q = newQueries(t, s.Cfg.Retention)
	return s, nil
}

// batch is a claim: records whose partitions carry the batch's token.
type batch struct {
	driverkit.BatchState
	src   *source
	token string
}

// Claim selects up to limit due, unpublished records of the leased
// partitions that no other batch holds, in seq order, skipping held
// aggregates and every record behind an unpublished one of its aggregate
// that is not due, and marks their partitions as this batch's, all in one
// short write transaction. A record is due when neither its deliver_at
// nor its next_attempt_at is ahead of the database clock; the earlier rows
// that are not due are found through the partial index <table>_waiting,
// which holds only unpublished rows with either column set. Marks last one
// lease TTL: a relay that died with a batch in flight blocks its
// partitions no longer than that.
func (s *source) Claim(ctx context.Context, leases []outboxdriver.Lease, limit int) (outboxdriver.Batch, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("outboxsqlite: claim limit %d must be positive", limit)
	}
	b := &batch{src: s, BatchState: driverkit.NewBatchState("outboxsqlite", leases)}
	if len(leases) == 0 {
		return b, nil
	}
	s.noteVersion(ctx)
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("outboxsqlite: claim from %s: %s", s.Table, oneLine(err))
	}
	defer tx.Rollback()
	var excluded []string
	if p := s.exclude.Load(); p != nil {
		excluded = *p
	}
	claim := s.q.claimNoDelays
	if s.delays.Has(func() (bool, error) {
		var n int
		err := tx.QueryRowContext(ctx, `SELECT count(*) FROM pragma_table_info(?1, ?2) WHERE name = 'deliver_at'`, s.Table.Name, s.Table.Schema).Scan(&n)
		return n > 0, err
	}, func() {
		s.Log.Warn("outboxsqlite: the table has no deliver_at column (schema before version 3): claiming as before until `outbox migrate` adds it", "table", s.Table.String())
	}) {
		claim = s.q.claim
	}
	rows, err := tx.QueryContext(ctx, claim, leasesJSON(leases), s.Cfg.RelayName, limit, stringsJSON(excluded))
	if err != nil {
		return nil, fmt.Errorf("outboxsqlite: claim from %s: %s", s.Table, oneLine(err))
	}
	recs, err := scanRecords(rows, limit)
	if err != nil {
		return nil, fmt.Errorf("outboxsqlite: claim from %s: %s", s.Table, oneLine(err))
	}
	if len(recs) == 0 {
		return b, nil
	}
	token := newToken()
	if _, err := tx.ExecContext(ctx, s.q.mark, token, s.TTL().Milliseconds(), intsJSON(partitionsOf(recs))); err != nil {
		return nil, fmt.Errorf("outboxsqlite: claim from %s: %s", s.Table, oneLine(err))
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("outboxsqlite: claim from %s: commit: %s", s.Table, oneLine(err))
	}
	b.token, b.Recs = token, recs
	b.Open()
	return b, nil
}

func newToken() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// leasesJSON renders leases as the JSON object {"partition": epoch, ...}.
func leasesJSON(leases []outboxdriver.Lease) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, l := range leases {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		b.WriteString(strconv.Itoa(l.Partition))
		b.WriteString(`":`)
		b.WriteString(strconv.FormatInt(l.Epoch, 10))
	}
	b.WriteByte('}')
	return b.String()
}

func intsJSON(v []int) string {
	out, _ := json.Marshal(v)
	return string(out)
}

func stringsJSON(v []string) string {
	if v == nil {
		v = []string{}
	}
	out, _ := json.Marshal(v)
	return string(out)
}

// partitionsOf lists the distinct partitions of recs.
func partitionsOf(recs []outboxdriver.Record) []int {
	seen := map[int]bool{}
	var out []int
	for _, r := range recs {
		if !seen[r.Partition] {
			seen[r.Partition] = true
			out = append(out, r.Partition)
		}
	}
	sort.Ints(out)
	return out
}

func scanRecords(rows *sql.Rows, limit int) ([]outboxdriver.Record, error) {
	defer rows.Close()
	out := driverkit.NewRecords(limit)
	for rows.Next() {
		var (
			r       outboxdriver.Record
			payload sql.NullString
			raw     []byte
			headers sql.NullString
			created string
		)
		if err := rows.Scan(&r.ID, &r.Seq, &r.Partition, &r.AggregateType, &r.AggregateID, &r.Type, &payload, &raw, &headers, &r.TraceContext, &created, &r.Attempts); err != nil {
			return nil, err
		}
		driverkit.SetPayload(&r, []byte(payload.String), payload.Valid, raw)
		if headers.Valid {
			r.Headers, r.HeadersErr = driverkit.DecodeHeaders(headers.String)
		}
		r.CreatedAt = parseTime(created)
		out = append(out, r)
	}
	return out, rows.Err()
}

// parseTime reads a time column; a value some other program wrote in
// another format reads as the zero time rather than failing the claim.
func parseTime(s string) time.Time {
	if t, err := time.ParseInLocation(timeLayout, s, time.UTC); err == nil {
		return t
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t
	}
	return time.Time{}
}

// Finish checks, in one write transaction, that the relay still holds
// every lease the batch was claimed under and that no other claim took
// its partitions over (the fence), then records the outcome and clears the
// batch's marks. If the fence fails, nothing is recorded, the marks are
// cleared, and the error wraps outboxdriver.ErrLeaseLost.
func (b *batch) Finish(ctx context.Context, out outboxdriver.Outcome) error {
	if ok, err := b.StartFinish(); !ok {
		return err
	}
	s := b.src
	err := b.finish(ctx, out)
	if err != nil {
		b.unclaim(ctx)
		if errors.Is(err, outboxdriver.ErrLeaseLost) {
			return fmt.Errorf("outboxsqlite: finish batch of %d: %w", len(b.Recs), err)
		}
		return fmt.Errorf("outboxsqlite: finish batch of %d from %s: %s", len(b.Recs), s.Table, oneLine(err))
	}
	return nil
}

func (b *batch) finish(ctx context.Context, out outboxdriver.Outcome) error {
	s, q := b.src, &b.src.q
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	fenced := b.Fenced()
	var held, marked int
	if err := tx.QueryRowContext(ctx, q.fence, leasesJSON(fenced), s.Cfg.RelayName).Scan(&held); err != nil {
		return err
	}
	if held != len(fenced) {
		return driverkit.LeaseLost(s.Cfg.RelayName)
	}
	if err := tx.QueryRowContext(ctx, q.claimedByMe, b.token).Scan(&marked); err != nil {
		return err
	}
	if marked != len(fenced) {
		return fmt.Errorf("%w: the batch's claim expired and another batch took its partitions", outboxdriver.ErrLeaseLost)
	}
	exec := func(query string, args ...any) error {
		_, err := tx.ExecContext(ctx, query, args...)
		return err
	}
	plan := driverkit.PlanOf(out)
	if err := driverkit.KeepClashesTx(ctx, tx, namesOf(s.Table).DeadLetter, &plan, s.Log, s.Table); err != nil {
		return err
	}
	if len(plan.Published) > 0 {
		ids := stringsJSON(plan.Published)
		if err := exec(q.markPublished, ids); err != nil {
			return err
		}
		if err := exec(q.unhold, ids); err != nil {
			return err
		}
	}
	for _, f := range plan.Retries {
		if err := exec(q.retry, f.ID, driverkit.ErrorText(f.Err), f.RetryAfter.Milliseconds()); err != nil {
			return err
		}
		if err := exec(q.holdRetry, f.ID); err != nil {
			return err
		}
	}
	for _, f := range plan.DeadLetters {
		if err := exec(q.deadLetter, f.ID, driverkit.ErrorText(f.Err), f.Hold); err != nil {
			return err
		}
		if err := exec(q.deleteOne, f.ID); err != nil {
			return err
		}
	}
	for _, id := range plan.Hold {
		if err := exec(q.holdDead, id); err != nil {
			return err
		}
	}
	if len(plan.Flow) > 0 {
		if err := exec(q.unhold, stringsJSON(plan.Flow)); err != nil {
			return err
		}
	}
	if err := exec(q.unclaim, b.token); err != nil {
		return err
	}
	return tx.Commit()
}

// Release clears the batch's marks without recording anything.
func (b *batch) Release(ctx context.Context) {
	if !b.StartRelease() {
		return
	}
	b.unclaim(ctx)
}

// unclaim clears the batch's marks; if that fails, they expire after one
// lease TTL.
func (b *batch) unclaim(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, err := b.src.db.ExecContext(ctx, b.src.q.unclaim, b.token); err != nil {
		b.src.Log.Warn("outboxsqlite: cannot release a claim; its partitions wait until it expires",
			"table", b.src.Table.String(), "err", oneLine(err))
	}
}

// noteVersion records the current data_version as the one Wait compares
// against. It is best effort: without it, Wait reads its own.
func (s *source) noteVersion(ctx context.Context) {
	if v, err := s.dataVersion(ctx); err == nil {
		s.seen.Store(v)
		s.seenOK.Store(true)
	}
}

// dataVersion reads PRAGMA data_version on the Source's own connection: it
// changes whenever another connection (of this process or another)
// commits to the file.
func (s *source) dataVersion(ctx context.Context) (int64, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.closed {
		return 0, errors.New("outboxsqlite: source is closed")
	}
	if s.wconn == nil {
		c, err := s.db.Conn(ctx)
		if err != nil {
			return 0, err
		}
		st, err := c.PrepareContext(ctx, `PRAGMA data_version`)
		if err != nil {
			c.Close()
			return 0, err
		}
		s.wconn, s.wstmt = c, st
	}
	var v int64
	if err := s.wstmt.QueryRowContext(ctx).Scan(&v); err != nil {
		s.dropWatcher()
		return 0, err
	}
	return v, nil
}

func (s *source) dropWatcher() {
	if s.wconn == nil {
		return
	}
	s.wstmt.Close()
	s.wconn.Close()
	s.wconn, s.wstmt = nil, nil
}

// Wait returns when another connection committed to the database since
// the last claim (a wake-up: the relay looks again), after d, or when ctx
// is done. It looks at PRAGMA data_version every WatchInterval; a commit
// that touched no outbox row makes a spurious return, which is allowed.
func (s *source) Wait(ctx context.Context, d time.Duration) error {
	base, ok := s.seen.Load(), s.seenOK.Load()
	if !ok {
		v, err := s.dataVersion(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("outboxsqlite: wait: %s", oneLine(err))
		}
		base = v
		s.seen.Store(v)
		s.seenOK.Store(true)
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	tick := time.NewTicker(WatchInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
			return nil
		case <-tick.C:
		}
		v, err := s.dataVersion(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("outboxsqlite: wait: %s", oneLine(err))
		}
		if v != base {
			s.seen.Store(v)
			return nil
		}
	}
}

// SetIdle does nothing: writers send no wake-ups to SQLite relays; Wait
// watches data_version instead, which costs the writers nothing.
func (s *source) SetIdle(ctx context.Context, ttl time.Duration) error { return nil }

// Close returns the Source's watcher connection to the pool. The pool
// stays open: it belongs to the caller.
func (s *source) Close() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.dropWatcher()
	s.closed = true
	return nil
}

// Heartbeat registers the relay as alive for ttl and counts the live relays
// and the partitions. ttl also becomes the life of a claim's marks.
func (s *source) Heartbeat(ctx context.Context, ttl time.Duration) (relays, partitions int, err error) {
	s.NoteTTL(ttl)
	register, count, args := s.q.heartbeat, s.q.relays, []any{s.Cfg.RelayName, ttl.Milliseconds()}
	if s.hasVersions(ctx) {
		register, count, args = s.q.heartbeatVersions, s.q.relaysVersions, append(args, s.latest, s.release)
	}
	if _, err := s.db.ExecContext(ctx, register, args...); err != nil {
		return 0, 0, fmt.Errorf("outboxsqlite: heartbeat: %s", oneLine(err))
	}
	if err := s.db.QueryRowContext(ctx, count).Scan(&relays, &partitions); err != nil {
		return 0, 0, fmt.Errorf("outboxsqlite: heartbeat: %s", oneLine(err))
	}
	return relays, partitions, nil
}

// hasVersions reports whether the relays registry records the relays'
// versions (relayVersionsSince): a relay of this build on a table not
// migrated yet registers as before.
func (s *source) hasVersions(ctx context.Context) bool {
	return s.versions.Has(func() (bool, error) {
		var n int
		err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM pragma_table_info(?1, ?2) WHERE name = 'schema_version'`, s.Table.Name+"_relays", s.Table.Schema).Scan(&n)
		return n > 0, err
	}, nil)
}

// CheckSchema reads the table's schema version and the oldest relay
// version it works with (outboxdriver.SchemaChecker).
func (s *source) CheckSchema(ctx context.Context) (outboxdriver.SchemaCheck, error) {
	c := outboxdriver.SchemaCheck{RelayVersion: s.latest}
	if err := s.db.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM `+namesOf(s.Table).Migrations).Scan(&c.TableVersion); err != nil {
		return c, fmt.Errorf("outboxsqlite: read the schema version of %s: %s", s.Table, oneLine(err))
	}
	if c.TableVersion < relayVersionsSince {
		done := map[int]bool{}
		for v := 1; v <= c.TableVersion; v++ {
			done[v] = true
		}
		c.RelaysFrom = migrations.RelaysFrom(all(), done)
		return c, nil
	}
	if err := s.db.QueryRowContext(ctx, s.q.checkSchema).Scan(&c.TableVersion, &c.RelaysFrom); err != nil {
		return c, fmt.Errorf("outboxsqlite: read the schema version of %s: %s", s.Table, oneLine(err))
	}
	return c, nil
}

// Acquire takes up to n free or expired partitions, lowest first, each
// with a new epoch, in one statement: two Sources never get the same one.
func (s *source) Acquire(ctx context.Context, n int, ttl time.Duration) ([]outboxdriver.Lease, error) {
	return s.leaseQuery(ctx, "acquire", s.q.acquire, s.Cfg.RelayName, n, ttl.Milliseconds())
}

// Renew extends leases by ttl and returns those the relay still holds.
func (s *source) Renew(ctx context.Context, leases []outboxdriver.Lease, ttl time.Duration) ([]outboxdriver.Lease, error) {
	return s.leaseQuery(ctx, "renew", s.q.renew, s.Cfg.RelayName, leasesJSON(leases), ttl.Milliseconds())
}

func (s *source) leaseQuery(ctx context.Context, what, query string, args ...any) ([]outboxdriver.Lease, error) {
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("outboxsqlite: %s leases: %s", what, oneLine(err))
	}
	out, err := driverkit.ScanLeases(rows)
	if err != nil {
		return nil, fmt.Errorf("outboxsqlite: %s leases: %s", what, oneLine(err))
	}
	return out, nil
}

// Release gives leases up; with all, it also unregisters the relay. A
// batch still in flight keeps its partitions marked until it ends.
func (s *source) Release(ctx context.Context, leases []outboxdriver.Lease, all bool) error {
	if len(leases) > 0 {
		if _, err := s.db.ExecContext(ctx, s.q.release, s.Cfg.RelayName, leasesJSON(leases)); err != nil {
			return fmt.Errorf("outboxsqlite: release leases: %s", oneLine(err))
		}
	}
	if all {
		if _, err := s.db.ExecContext(ctx, s.q.unregister, s.Cfg.RelayName); err != nil {
			return fmt.Errorf("outboxsqlite: release leases: %s", oneLine(err))
		}
	}
	return nil
}

// Cleanup deletes up to limit published rows of the leased partitions that
// are older than olderThan, oldest first, in one short statement.
func (s *source) Cleanup(ctx context.Context, leases []outboxdriver.Lease, olderThan time.Duration, limit int) (int, error) {
	if len(leases) == 0 || limit <= 0 {
		return 0, nil
	}
	res, err := s.db.ExecContext(ctx, s.q.cleanup, intsJSON(driverkit.Partitions(leases)), -olderThan.Milliseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("outboxsqlite: clean up published rows: %s", oneLine(err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("outboxsqlite: clean up published rows: %w", err)
	}
	return int(n), nil
}

// WakesOnCommit is true: Wait watches PRAGMA data_version, which changes
// with every commit to the file.
func (s *source) WakesOnCommit() bool { return true }

// MaintainTimePartitions does nothing: no table here is partitioned by
// time (outboxdriver.ErrNoTimePartitions).
func (s *source) MaintainTimePartitions(context.Context, outboxdriver.TimePartitionMaintenance) ([]outboxdriver.TimePartitionChange, error) {
	return nil, nil
}
