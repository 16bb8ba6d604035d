package outboxpgx

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// source is the relay's view of an outbox table in PostgreSQL.
type source struct {
	driverkit.SourceBase
	pool  *pgxpool.Pool
	q     queries
	names driverkit.Names

	lockKey int32 // first key of the partitions' advisory locks

	mu       sync.Mutex // guards listener
	listener *pgxpool.Conn

	floors floors

	exclude    atomic.Pointer[[]string] // aggregate types the claim leaves out (paused)
	pauseTable atomic.Int32             // what the last read of the pauses found (pauseTable*)
	delays     driverkit.ColumnProbe    // the deliver_at column (schema version 12)
	versions   driverkit.ColumnProbe    // the relays' schema_version column (pgschema.RelayVersionsSince)
	// latest is the newest schema version this relay's code knows, which
	// it records and checks the table against (CheckSchema): the
	// migrations' latest; tests set a lower one to play a relay of the
	// release before.
	latest  int
	release string
	byTime  atomic.Int32 // whether the table is partitioned by time: 0 not known yet, 1 no, 2 yes
}

// claimSQL returns the claim for the table's schema: with the deliver_at
// conditions once the column exists (schema version 12). A table not
// migrated yet holds no delayed events and is claimed as before.
func (s *source) claimSQL(ctx context.Context, conn *pgxpool.Conn) string {
	has := s.delays.Has(func() (bool, error) {
		return hasColumn(ctx, conn, s.names.Table, "deliver_at")
	}, func() {
		s.Log.Warn("outboxpgx: the table has no deliver_at column (schema before version 12): claiming as before until `outbox migrate` adds it", "table", s.Table.String())
	})
	if has {
		return s.q.claim
	}
	return s.q.claimNoDelays
}

var _ outboxdriver.Source = (*source)(nil)

// hasColumn reports whether table (qualified and quoted) has column.
func hasColumn(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, table, column string) (bool, error) {
	var has bool
	err := db.QueryRow(ctx, pgschema.HasColumnSQL, table, column).Scan(&has)
	return has, err
}

type queries struct {
	// claimNoDelays is claim for a table before schema version 12 (no
	// deliver_at column): a relay of this build on a table not migrated
	// yet relays on.
	claimNoDelays string
	// markPublishedIn is markPublished for a table partitioned by time,
	// with the batch's range of created_at.
	markPublishedIn                                                                            string
	settings, claim, markPublished, unhold, retry, holdRetry, deadLetter, holdDead, idle, busy string
	heartbeat, relays, acquire, renew, release, unregister, fence, cleanup                     string
	// heartbeatVersions and relaysVersions are heartbeat and relays for a
	// registry that records the relays' versions: the heartbeat records
	// this relay's, and the count leaves out relays too old for the table
	// (they stop claiming: docs/operations.md, Upgrades).
	heartbeatVersions, relaysVersions string
	// cleanupDefault is cleanup for a table partitioned by time: only the
	// default partition's rows are deleted one by one; the others go with
	// their partition (docs/retention.md).
	cleanupDefault                      string
	floors, lastSeq, writers, lastAudit string
}

// waitingSQL is the claim's condition on deliver_at (schema version 12):
// the row's own time has come, and no earlier pending row of its
// aggregate is waiting (delayed, or a retry's next_attempt_at ahead),
// found through the partial index of the rows that wait.
func waitingSQL(n driverkit.Names) string {
	return `
  AND (o.deliver_at IS NULL OR o.deliver_at <= now())
  AND NOT EXISTS (SELECT 1 FROM ` + n.Table + ` w
                  WHERE w.published_at IS NULL AND (w.deliver_at IS NOT NULL OR w.next_attempt_at IS NOT NULL)
                    AND w.aggregatetype = o.aggregatetype AND w.aggregateid = o.aggregateid
                    AND w.seq < o.seq AND (w.deliver_at > now() OR w.next_attempt_at > now()))`
}

// cleanupWhere is the Source's cleanup condition on table t.
func cleanupWhere(t outboxdriver.Table) string {
	return `published_at < clock_timestamp() - $2 * interval '1 millisecond' AND ` + pgschema.PartitionOf("", t) + ` = ANY($1::integer[])`
}

// newQueries returns the Source's statements for t.
func newQueries(t outboxdriver.Table, r outboxdriver.Retention) queries {
	n := pgschema.NamesOf(t)
	waitingSQL := waitingSQL(n)
	part := pgschema.PartitionOf("o.", t)
	lastAudit := `SELECT coalesce(max(id), 0) FROM ` + n.Audit
	q := queries{
		// The claim's transaction runs with these. Plans must not depend
		// on the table's statistics: an outbox table swings between a
		// handful of live rows and a backlog, or a mass of dead ones an
		// open transaction keeps from VACUUM, and its statistics describe
		// whichever it was when last analyzed.
		//
		// No sequential scans: a plan cached while the table looked tiny
		// (Finish's DELETE by id as a sequential scan) read the whole
		// table for every batch, dead rows a long transaction kept
		// included (docs/benchmarks.md#long-transactions).
		//
		// No sorts: with statistics from when the table held a hundred
		// rows (or none, never analyzed), the claim read every pending row
		// of its partitions through (partition, seq) and sorted them for
		// every claim of a backlog, where the (seq) index hands over the
		// first rows in order and stops at the limit (docs/relay.md, Long
		// transactions). Nothing else in the transaction sorts.
		settings: `SELECT set_config('synchronous_commit', 'off', true), set_config('idle_in_transaction_session_timeout', $1, true),
       set_config('enable_seqscan', 'off', true), set_config('enable_sort', 'off', true)`,
		claim: `WITH mine AS MATERIALIZED (
    SELECT l.partition FROM ` + n.Leases + ` l
    JOIN unnest($2::integer[], $3::bigint[]) AS m(partition, epoch)
      ON l.partition = m.partition AND l.epoch = m.epoch
    WHERE l.owner = $4 AND l.expires_at > clock_timestamp()
), locked AS MATERIALIZED (
    SELECT partition FROM mine WHERE pg_try_advisory_xact_lock($5::integer, partition)
)
SELECT o.id::text, o.seq, ` + part + `, o.aggregatetype, o.aggregateid, o.type, o.payload::text, o.payload_raw,
       o.headers::text, coalesce(o.tracingspancontext, ''), o.created_at, o.attempts
FROM ` + n.Table + ` AS o
WHERE ` + part + ` = ANY (ARRAY(SELECT partition FROM locked))
  AND o.published_at IS NULL
  AND o.seq >= CASE WHEN (` + lastAudit + `) = $7 THEN $6 ELSE 0 END
  AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= now())` + waitingSQL + `
  AND NOT EXISTS (SELECT 1 FROM ` + n.Held + ` h
                  WHERE h.aggregatetype = o.aggregatetype AND h.aggregateid = o.aggregateid AND h.seq < o.seq)
  AND o.aggregatetype <> ALL ($8::text[])
ORDER BY o.seq
LIMIT $1
FOR UPDATE OF o SKIP LOCKED`,
		unhold: pgschema.UnholdSQL(n),
		// The first pending rows from the lowest floor up to the final
		// seq $3, at most floorScan of them, through the pending index. A
		// partition that has none among them has none below the last one
		// read (or none up to $3, when fewer were read): its floor rises
		// to there.
		floors: `WITH scan AS MATERIALIZED (
    SELECT o.seq, ` + part + ` AS partition FROM ` + n.Table + ` AS o
    WHERE o.published_at IS NULL AND o.seq >= (SELECT min(f) FROM unnest($2::bigint[]) AS f) AND o.seq <= $3::bigint
    ORDER BY o.seq LIMIT ` + strconv.Itoa(floorScan) + `
), bound AS (
    SELECT CASE WHEN count(*) < ` + strconv.Itoa(floorScan) + ` THEN $3::bigint + 1 ELSE max(seq) END AS seq FROM scan
)
SELECT array_agg(coalesce((SELECT min(s.seq) FROM scan AS s WHERE s.partition = m.partition AND s.seq >= m.floor),
                          (SELECT seq FROM bound)) ORDER BY m.i)
FROM unnest($1::integer[], $2::bigint[]) WITH ORDINALITY AS m(partition, floor, i)`,
		lastSeq: `SELECT s.seqcache, pg_sequence_last_value(s.seqrelid) FROM pg_sequence s
WHERE s.seqrelid = pg_get_serial_sequence($1, 'seq')::regclass`,
		lastAudit: lastAudit,
		writers: `SELECT coalesce(array_agg(virtualtransaction::text), '{}') FROM pg_locks
WHERE locktype = 'relation' AND mode = 'RowExclusiveLock'
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND relation = $1::text::regclass`,
		retry: `UPDATE ` + n.Table + ` AS o
SET attempts = o.attempts + 1, last_error = f.err,
    next_attempt_at = clock_timestamp() + f.delay_ms * interval '1 millisecond'
FROM unnest($1::bigint[], $2::text[], $3::bigint[]) AS f(seq, err, delay_ms)
WHERE o.seq = f.seq AND o.published_at IS NULL`,
		holdRetry: `INSERT INTO ` + n.Held + ` (aggregatetype, aggregateid, seq, event_id, reason)
SELECT aggregatetype, aggregateid, seq, id, 'retrying' FROM ` + n.Table + ` WHERE seq = ANY($1::bigint[]) AND published_at IS NULL
ORDER BY seq
ON CONFLICT (aggregatetype, aggregateid) DO NOTHING`,
		// A dead letter is kept under its event's id. An event whose id
		// the dead letters hold already (another event written with the
		// same id, or a second row with one id in a table partitioned by
		// time, which has no key on id) is not moved: it stays in the
		// table, retried a minute later and holding its aggregate, with an
		// error that says why, and the statement returns its id for the
		// relay's log. Nothing is dropped for a clash.
		// $4 holds each row's error should it clash
		// (driverkit.DeadLetterClash) and $5 the retry's delay in ms.
		deadLetter: `WITH f AS (SELECT * FROM unnest($1::bigint[], $2::text[], $3::boolean[], $4::text[]) AS f(seq, err, hold, clash_err)),
clash AS (SELECT o.seq, o.id FROM ` + n.Table + ` AS o JOIN f ON o.seq = f.seq
    WHERE o.published_at IS NULL AND (
        EXISTS (SELECT 1 FROM ` + n.DeadLetter + ` AS d WHERE d.id = o.id)
        OR EXISTS (SELECT 1 FROM ` + n.Table + ` AS e JOIN f AS g ON e.seq = g.seq WHERE e.id = o.id AND e.seq < o.seq))),
kept AS (UPDATE ` + n.Table + ` AS o
    SET attempts = o.attempts + 1, next_attempt_at = clock_timestamp() + $5 * interval '1 millisecond',
        last_error = f.clash_err
    FROM clash AS c, f WHERE o.seq = c.seq AND f.seq = c.seq
    RETURNING o.id, o.aggregatetype, o.aggregateid, o.seq),
held AS (INSERT INTO ` + n.Held + ` (aggregatetype, aggregateid, seq, event_id, reason)
    SELECT aggregatetype, aggregateid, seq, id, 'retrying' FROM kept ORDER BY seq
    ON CONFLICT (aggregatetype, aggregateid) DO NOTHING),
moved AS (DELETE FROM ` + n.Table + ` AS o USING f WHERE o.seq = f.seq AND o.published_at IS NULL
    AND o.seq NOT IN (SELECT seq FROM clash) RETURNING o.*, f.err, f.hold),
dead AS (INSERT INTO ` + n.DeadLetter + ` (id, aggregatetype, aggregateid, type, payload, seq, created_at,
    headers, tracingspancontext, payload_raw, attempts, last_error, held)
    SELECT id, aggregatetype, aggregateid, type, payload, seq, created_at,
        headers, tracingspancontext, payload_raw, attempts + 1, err, hold
    FROM moved)
SELECT id::text FROM kept ORDER BY seq`,
		holdDead: pgschema.HoldDeadSQL(n, true),
		idle: `INSERT INTO ` + n.Wakeup + ` (relay, expires_at)
VALUES ($1, now() + $2 * interval '1 millisecond')
ON CONFLICT (relay) DO UPDATE SET expires_at = excluded.expires_at`,
		busy: `DELETE FROM ` + n.Wakeup + ` WHERE relay = $1`,
		heartbeat: `INSERT INTO ` + n.Relays + ` (relay, expires_at)
VALUES ($1, clock_timestamp() + $2 * interval '1 millisecond')
ON CONFLICT (relay) DO UPDATE SET expires_at = excluded.expires_at`,
		relays: `SELECT (SELECT count(*) FROM ` + n.Relays + ` WHERE expires_at > clock_timestamp()),
       (SELECT count(*) FROM ` + n.Leases + `)`,
		heartbeatVersions: `INSERT INTO ` + n.Relays + ` (relay, expires_at, schema_version, release, renewed_at)
VALUES ($1, clock_timestamp() + $2 * interval '1 millisecond', $3, $4, clock_timestamp())
ON CONFLICT (relay) DO UPDATE SET expires_at = excluded.expires_at, schema_version = excluded.schema_version,
    release = excluded.release, renewed_at = excluded.renewed_at`,
		relaysVersions: `SELECT (SELECT count(*) FROM ` + n.Relays + ` WHERE expires_at > clock_timestamp()
          AND coalesce(schema_version, 0) >= (SELECT coalesce(max(relays_from), 0) FROM ` + n.Migrations + `)),
       (SELECT count(*) FROM ` + n.Leases + `)`,
		acquire: `WITH free AS MATERIALIZED (
    SELECT partition FROM ` + n.Leases + `
    WHERE owner IS NULL OR expires_at <= clock_timestamp()
    ORDER BY partition
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE ` + n.Leases + ` AS l
SET owner = $1, epoch = l.epoch + 1, expires_at = clock_timestamp() + $3 * interval '1 millisecond'
FROM free WHERE l.partition = free.partition
RETURNING l.partition, l.epoch`,
		renew: `UPDATE ` + n.Leases + ` AS l
SET expires_at = clock_timestamp() + $4 * interval '1 millisecond'
FROM unnest($2::integer[], $3::bigint[]) AS m(partition, epoch)
WHERE l.partition = m.partition AND l.epoch = m.epoch AND l.owner = $1
RETURNING l.partition, l.epoch`,
		release: `UPDATE ` + n.Leases + ` AS l
SET owner = NULL, expires_at = '-infinity'
FROM unnest($2::integer[], $3::bigint[]) AS m(partition, epoch)
WHERE l.partition = m.partition AND l.epoch = m.epoch AND l.owner = $1`,
		unregister:     `DELETE FROM ` + n.Relays + ` WHERE relay = $1`,
		fence:          `SELECT ` + t.Qualified("_fence") + `($1, $2::integer[], $3::bigint[])`,
		cleanup:        pgschema.CleanupSQL(n.Table, cleanupWhere(t), "$3"),
		cleanupDefault: pgschema.CleanupSQL(pgschema.DefaultPartition(t), cleanupWhere(t), "$3"),
	}
	if r == outboxdriver.RetentionKeep {
		q.markPublished = `UPDATE ` + n.Table + ` SET published_at = clock_timestamp(), last_error = NULL, next_attempt_at = NULL WHERE seq = ANY($1::bigint[]) AND published_at IS NULL`
	} else {
		q.markPublished = `DELETE FROM ` + n.Table + ` WHERE seq = ANY($1::bigint[]) AND published_at IS NULL`
	}
	q.markPublishedIn = q.markPublished + ` AND created_at BETWEEN $2 AND $3`
	q.claimNoDelays = strings.Replace(q.claim, waitingSQL, "", 1)
	return q
}

// NewSource returns the relay's view of table t, using the Driver's pool
// for every query and one pooled connection for LISTEN. It does no I/O.
// The returned Source is a *source; Close it after the relay stopped.
func (d *Driver) NewSource(t outboxdriver.Table, cfg *outboxdriver.SourceConfig) (outboxdriver.Source, error) {
	if d.pool == nil {
		return nil, errNoPool
	}
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("outboxpgx: %w", err)
	}
	h := fnv.New32a()
	h.Write([]byte("outbox.partition:" + t.String()))
	src := &source{pool: d.pool, names: pgschema.NamesOf(t), lockKey: int32(h.Sum32()), latest: pgschema.Latest(), release: driverkit.Release()}
	if err := src.Init(t, cfg); err != nil {
		return nil, fmt.Errorf("outboxpgx: %w", err)
	}
	src.q = newQueries(t, src.Cfg.Retention)
	src.floors.zero()
	src.floors.audit = -1
	src.floors.ctx, src.floors.stop = context.WithCancel(context.Background())
	return src, nil
}

// batch is a claim: an open transaction holding row locks on its records.
type batch struct {
	driverkit.BatchState
	src      *source
	conn     *pgxpool.Conn
	listener bool // conn is the source's listener, s.mu held until the batch ends
	byTime   bool // the table is partitioned by time (Source.timePartitioned)
}

// claimConn returns the connection a claim runs on: the listener when it
// is connected and free, otherwise one from the pool. On the listener,
// PostgreSQL holds back notifications while the claim's transaction is
// open and sends them together once it ends, right behind the outcome's
// reply: the relay is not woken by every commit while a batch is in
// flight, only once after it: fuller batches and less relay CPU at a
// steady flow (docs/benchmarks.md#latency). The listener stays
// locked (s.mu) until the batch ends, so Wait and a second claim do not
// use it meanwhile; a claim that finds it taken uses the pool.
//
// Notifications that arrived during earlier batches on the listener are
// held by pgx until read; a relay that claims back to back (a steady flow)
// may not Wait for a long time, so the claim reads them first: a rewind
// among them drops the floors before this claim, and none pile up. The
// claim sees every commit that sent one.
func (s *source) claimConn(ctx context.Context) (conn *pgxpool.Conn, listener bool, err error) {
	if s.mu.TryLock() {
		if s.listener != nil {
			s.coalesce()
		}
		if s.listener != nil { // coalesce drops a broken one
			return s.listener, true, nil
		}
		s.mu.Unlock()
	}
	conn, err = s.pool.Acquire(ctx)
	return conn, false, err
}

// end hands the batch's connection back, closing it first when broken (a
// connection in an unknown transaction state is never reused).
func (b *batch) end(ctx context.Context, broken bool) {
	if b.listener {
		if broken {
			b.src.dropListener() // the next Wait reconnects, and rewinds the floors
		}
		b.src.mu.Unlock()
		return
	}
	if broken {
		b.conn.Conn().Close(context.WithoutCancel(ctx))
	}
	b.conn.Release()
}

// Claim opens a transaction, takes the advisory lock of every leased
// partition no other transaction is relaying (a stale owner's batch keeps
// its partitions until it ends), and locks up to limit due, unpublished rows
// of those partitions in seq order, from the lowest of their floors
// (floor.go), skipping held aggregates. BEGIN, the relay's own settings
// and the SELECT go in one round trip. The transaction
// may stay idle (while the batch is published) at most one lease TTL: a
// paused relay's claim is then ended by the server, releasing its locks.
func (s *source) Claim(ctx context.Context, leases []outboxdriver.Lease, limit int) (outboxdriver.Batch, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("outboxpgx: claim limit %d must be positive", limit)
	}
	b := &batch{src: s, BatchState: driverkit.NewBatchState("outboxpgx", leases)}
	if len(leases) == 0 {
		return b, nil
	}
	s.tickFloors(leases)
	conn, listener, err := s.claimConn(ctx)
	if err != nil {
		return nil, fmt.Errorf("outboxpgx: claim: %w", err)
	}
	// After claimConn: a rewind it read on the listener has dropped them.
	floor, audit := s.floors.below(leases)
	b.conn, b.listener = conn, listener
	// Asked on the claim's connection before its transaction: Finish must
	// not wait for another of the pool's connections while the batch holds
	// its rows (a migration waiting for those, and writers waiting for the
	// migration, may hold all the others). Unknown counts as not
	// partitioned: Finish then records without the created_at range,
	// which is right on any table.
	b.byTime, _ = s.timePartitioned(ctx, conn)
	b.Open()
	parts, epochs := leaseArrays(leases)
	var pb pgx.Batch
	pb.Queue(`BEGIN`)
	// Losing the relay's own commit in a database crash only republishes
	// (a duplicate with the same id); it never loses an event. One
	// statement for all settings: every statement of the batch costs.
	//
	pb.Queue(s.q.settings, strconv.FormatInt(s.TTL().Milliseconds(), 10))
	pb.Queue(s.claimSQL(ctx, conn), limit, parts, epochs, s.Cfg.RelayName, s.lockKey, floor, audit, s.excluded())
	br := conn.SendBatch(ctx, &pb)
	records, err := func() ([]outboxdriver.Record, error) {
		defer br.Close()
		for range 2 {
			if _, err := br.Exec(); err != nil {
				return nil, err
			}
		}
		rows, err := br.Query()
		if err != nil {
			return nil, err
		}
		return scanRecords(rows, limit)
	}()
	if err != nil {
		b.Release(ctx)
		return nil, fmt.Errorf("outboxpgx: claim from %s: %w", s.Table, err)
	}
	b.Recs = records
	return b, nil
}

func leaseArrays(leases []outboxdriver.Lease) ([]int32, []int64) {
	parts, epochs := make([]int32, len(leases)), make([]int64, len(leases))
	for i, l := range leases {
		parts[i], epochs[i] = int32(l.Partition), l.Epoch
	}
	return parts, epochs
}

func scanRecords(rows pgx.Rows, limit int) ([]outboxdriver.Record, error) {
	defer rows.Close()
	out := driverkit.NewRecords(limit)
	for rows.Next() {
		var (
			r       outboxdriver.Record
			payload []byte
			raw     []byte
			headers []byte
		)
		if err := rows.Scan(&r.ID, &r.Seq, &r.Partition, &r.AggregateType, &r.AggregateID, &r.Type, &payload, &raw, &headers, &r.TraceContext, &r.CreatedAt, &r.Attempts); err != nil {
			return nil, err
		}
		driverkit.SetPayload(&r, payload, payload != nil, raw)
		r.Headers, r.HeadersErr = driverkit.DecodeHeaders(headers)
		out = append(out, r)
	}
	return out, rows.Err()
}

// Finish checks the batch's leases (the fence), records the outcome and
// commits, in one round trip. If a lease was lost, the fence aborts the
// transaction and nothing is recorded.
func (b *batch) Finish(ctx context.Context, out outboxdriver.Outcome) error {
	if ok, err := b.StartFinish(); !ok {
		return err
	}
	q := &b.src.q
	var pb pgx.Batch
	parts, epochs := leaseArrays(b.Fenced())
	pb.Queue(q.fence, b.src.Cfg.RelayName, parts, epochs)
	plan := driverkit.PlanOf(out)
	// Rows are recorded by seq, through the pending index: the table has
	// no index on id. An id names every row of the batch that carries it.
	seqs := b.seqsByID()
	if len(plan.Published) > 0 {
		var rows []int64
		for _, id := range plan.Published {
			rows = append(rows, seqs[id]...)
		}
		if b.byTime {
			// The batch's range of created_at lets PostgreSQL skip the
			// partitions none of its rows is in (run-time pruning).
			lo, hi := b.createdRange()
			pb.Queue(q.markPublishedIn, rows, lo, hi)
		} else {
			pb.Queue(q.markPublished, rows)
		}
		pb.Queue(q.unhold, pgschema.UUIDArray(plan.Published))
	}
	if fs := plan.Retries; len(fs) > 0 {
		var rows, delays []int64
		var msgs []string
		for _, f := range fs {
			for _, seq := range seqs[f.ID] {
				rows, msgs, delays = append(rows, seq), append(msgs, driverkit.ErrorText(f.Err)), append(delays, f.RetryAfter.Milliseconds())
			}
		}
		pb.Queue(q.retry, rows, msgs, delays)
		pb.Queue(q.holdRetry, rows)
	}
	if fs := plan.DeadLetters; len(fs) > 0 {
		var rows []int64
		var msgs, clashes []string
		var hold []bool
		for _, f := range fs {
			clash := driverkit.ErrorText(driverkit.DeadLetterClash(f.ID, f.Err))
			for _, seq := range seqs[f.ID] {
				rows, msgs, hold = append(rows, seq), append(msgs, driverkit.ErrorText(f.Err)), append(hold, f.Hold)
				clashes = append(clashes, clash)
			}
		}
		pb.Queue(q.deadLetter, rows, msgs, hold, clashes, driverkit.DeadLetterClashDelay.Milliseconds()).Query(func(rs pgx.Rows) error {
			kept, err := pgx.CollectRows(rs, pgx.RowTo[string])
			if err == nil {
				driverkit.LogClashes(b.src.Log, b.src.Table, kept)
			}
			return err
		})
		if len(plan.Hold) > 0 {
			pb.Queue(q.holdDead, plan.Hold)
		}
		if len(plan.Flow) > 0 {
			pb.Queue(q.unhold, plan.Flow)
		}
	}
	pb.Queue(`COMMIT`)
	err := b.conn.SendBatch(ctx, &pb).Close()
	b.end(ctx, err != nil)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Hint == "outbox-lease-lost" {
			return fmt.Errorf("outboxpgx: finish batch of %d: %w: %s", len(b.Recs), outboxdriver.ErrLeaseLost, pgErr.Message)
		}
		return fmt.Errorf("outboxpgx: finish batch of %d: %w", len(b.Recs), err)
	}
	return nil
}

// createdRange returns the earliest and the latest created_at of the
// batch's records.
func (b *batch) createdRange() (lo, hi time.Time) {
	for i, r := range b.Recs {
		if i == 0 || r.CreatedAt.Before(lo) {
			lo = r.CreatedAt
		}
		if i == 0 || r.CreatedAt.After(hi) {
			hi = r.CreatedAt
		}
	}
	return lo, hi
}

// seqsByID maps the batch's event ids to the seqs of their rows, in the
// order claimed.
func (b *batch) seqsByID() map[string][]int64 {
	m := make(map[string][]int64, len(b.Recs))
	for _, r := range b.Recs {
		m[r.ID] = append(m[r.ID], r.Seq)
	}
	return m
}

// Release rolls the claim back.
func (b *batch) Release(ctx context.Context) {
	if !b.StartRelease() {
		return
	}
	_, err := b.conn.Exec(context.WithoutCancel(ctx), `ROLLBACK`)
	b.end(ctx, err != nil)
}

// Wait blocks on LISTEN until a notification, d, or ctx. It (re)connects
// the listener when needed; after a reconnect it returns at once, because
// notifications sent meanwhile are lost.
func (s *source) Wait(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.listener == nil {
		conn, err := s.pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("outboxpgx: listen: %w", err)
		}
		if _, err := conn.Exec(ctx, `LISTEN `+outboxdriver.QuoteIdent(s.Table.Channel())); err != nil {
			conn.Conn().Close(context.WithoutCancel(ctx))
			conn.Release()
			return fmt.Errorf("outboxpgx: listen: %w", err)
		}
		s.listener = conn
		s.floors.rewind() // a retry's rewind may have been sent meanwhile
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	n, err := s.listener.Conn().WaitForNotification(wctx)
	switch {
	case err == nil:
		s.notified(n)
		s.coalesce()
		return nil
	case wctx.Err() != nil && ctx.Err() == nil:
		return nil // timed out: the poll interval's safety net
	case ctx.Err() != nil:
		return ctx.Err()
	default:
		s.dropListener()
		return fmt.Errorf("outboxpgx: wait for notification: %w", err)
	}
}

// coalesce consumes the notifications that have already arrived, so that
// one claim answers them all. Every one of them was sent by a commit that
// the relay's next claim sees, so none is lost; without this, a relay
// keeping up with many writers woke once per notification, and every wake
// after the first claimed nothing (a claim and a rollback, two round trips,
// for nothing). It takes only what the wait that just returned has read
// from the socket already (notifications that queued up while the relay
// was busy arrive together): with a read deadline in the past, reading
// more fails at once, with no system call and no timer. A timer would not
// do: the Go runtime sleeps at least a millisecond for one shorter than
// that, which measured as a millisecond more median latency.
func (s *source) coalesce() {
	conn := s.listener.Conn()
	nc := conn.PgConn().Conn()
	if err := nc.SetReadDeadline(time.Unix(1, 0)); err != nil {
		return
	}
	for range 1024 {
		n, err := conn.WaitForNotification(context.Background())
		if err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				s.dropListener() // broken: the next Wait reconnects
				return
			}
			break
		}
		s.notified(n)
	}
	if err := nc.SetReadDeadline(time.Time{}); err != nil {
		s.dropListener()
	}
}

// notified acts on a notification's payload: commits send none; a retry of
// dead letters sends rewindPayload.
func (s *source) notified(n *pgconn.Notification) {
	if n != nil && n.Payload == rewindPayload {
		s.floors.rewind()
	}
}

func (s *source) dropListener() {
	if s.listener == nil {
		return
	}
	s.listener.Conn().Close(context.Background())
	s.listener.Release()
	s.listener = nil
}

// SetIdle registers this relay as idle for ttl (writers then send a
// NOTIFY), or removes it when ttl is 0.
func (s *source) SetIdle(ctx context.Context, ttl time.Duration) error {
	var err error
	if ttl > 0 {
		_, err = s.pool.Exec(ctx, s.q.idle, s.Cfg.RelayName, ttl.Milliseconds())
	} else {
		_, err = s.pool.Exec(ctx, s.q.busy, s.Cfg.RelayName)
	}
	if err != nil {
		return fmt.Errorf("outboxpgx: set idle: %w", err)
	}
	return nil
}

// Close ends the floors' running probe, and drops the listener and the
// wake-up registration. The pool stays open: it belongs to the caller.
func (s *source) Close() error {
	s.floors.close()
	s.mu.Lock()
	s.dropListener()
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, _ = s.pool.Exec(ctx, s.q.busy, s.Cfg.RelayName)
	return nil
}

// Heartbeat registers the relay as alive for ttl and counts the live relays
// and the partitions, in one round trip.
func (s *source) Heartbeat(ctx context.Context, ttl time.Duration) (relays, partitions int, err error) {
	s.NoteTTL(ttl)
	var pb pgx.Batch
	if s.hasVersions(ctx) {
		pb.Queue(s.q.heartbeatVersions, s.Cfg.RelayName, ttl.Milliseconds(), s.latest, s.release)
		pb.Queue(s.q.relaysVersions).QueryRow(func(row pgx.Row) error { return row.Scan(&relays, &partitions) })
	} else {
		pb.Queue(s.q.heartbeat, s.Cfg.RelayName, ttl.Milliseconds())
		pb.Queue(s.q.relays).QueryRow(func(row pgx.Row) error { return row.Scan(&relays, &partitions) })
	}
	if err := s.pool.SendBatch(ctx, &pb).Close(); err != nil {
		return 0, 0, fmt.Errorf("outboxpgx: heartbeat: %w", err)
	}
	return relays, partitions, nil
}

// hasVersions reports whether the relays registry records the relays'
// versions (schema version 20): a relay of this build on a table not
// migrated yet registers as before.
func (s *source) hasVersions(ctx context.Context) bool {
	return s.versions.Has(func() (bool, error) {
		return hasColumn(ctx, s.pool, s.names.Relays, "schema_version")
	}, nil)
}

// CheckSchema reads the table's schema version and the oldest relay
// version it works with (outboxdriver.SchemaChecker): a table of a newer
// release records the latter with every migration.
func (s *source) CheckSchema(ctx context.Context) (outboxdriver.SchemaCheck, error) {
	c, err := pgschema.CheckSchema(ctx, queryRow(s.pool), s.Table, s.latest)
	if err != nil {
		return c, fmt.Errorf("outboxpgx: %w", err)
	}
	return c, nil
}

// Acquire takes up to n free or expired partitions, lowest first.
func (s *source) Acquire(ctx context.Context, n int, ttl time.Duration) ([]outboxdriver.Lease, error) {
	return s.leaseQuery(ctx, "acquire", s.q.acquire, s.Cfg.RelayName, n, ttl.Milliseconds())
}

// Renew extends leases by ttl and returns those the relay still holds.
func (s *source) Renew(ctx context.Context, leases []outboxdriver.Lease, ttl time.Duration) ([]outboxdriver.Lease, error) {
	parts, epochs := leaseArrays(leases)
	return s.leaseQuery(ctx, "renew", s.q.renew, s.Cfg.RelayName, parts, epochs, ttl.Milliseconds())
}

func (s *source) leaseQuery(ctx context.Context, what, sql string, args ...any) ([]outboxdriver.Lease, error) {
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("outboxpgx: %s leases: %w", what, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (outboxdriver.Lease, error) {
		var l outboxdriver.Lease
		err := row.Scan(&l.Partition, &l.Epoch)
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("outboxpgx: %s leases: %w", what, err)
	}
	driverkit.SortLeases(out)
	return out, nil
}

// Release gives leases up; with all, it also unregisters the relay.
func (s *source) Release(ctx context.Context, leases []outboxdriver.Lease, all bool) error {
	var pb pgx.Batch
	if len(leases) > 0 {
		parts, epochs := leaseArrays(leases)
		pb.Queue(s.q.release, s.Cfg.RelayName, parts, epochs)
	}
	if all {
		pb.Queue(s.q.unregister, s.Cfg.RelayName)
	}
	if pb.Len() == 0 {
		return nil
	}
	if err := s.pool.SendBatch(ctx, &pb).Close(); err != nil {
		return fmt.Errorf("outboxpgx: release leases: %w", err)
	}
	return nil
}

// Cleanup deletes up to limit published rows of the leased partitions that
// are older than olderThan, oldest first, in one short statement. Call it
// repeatedly: one giant DELETE would hold locks and bloat the table at once.
// On a table partitioned by time it deletes rows of the default partition
// only: the others are dropped whole (MaintainTimePartitions).
func (s *source) Cleanup(ctx context.Context, leases []outboxdriver.Lease, olderThan time.Duration, limit int) (int, error) {
	if len(leases) == 0 || limit <= 0 {
		return 0, nil
	}
	q := s.q.cleanup
	byTime, err := s.timePartitioned(ctx, s.pool)
	if err != nil {
		return 0, fmt.Errorf("outboxpgx: clean up published rows: %w", err)
	}
	if byTime {
		q = s.q.cleanupDefault
	}
	parts, _ := leaseArrays(leases)
	tag, err := s.pool.Exec(ctx, q, parts, olderThan.Milliseconds(), limit)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" && q == s.q.cleanupDefault {
		return 0, nil // no default partition yet: nothing in it
	}
	if err != nil {
		return 0, fmt.Errorf("outboxpgx: clean up published rows: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// timePartitioned reports whether the table is partitioned (by time,
// docs/retention.md), asking the database the first time only: a table
// does not become partitioned but by being made anew.
func (s *source) timePartitioned(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) (bool, error) {
	if k := s.byTime.Load(); k != 0 {
		return k == 2, nil
	}
	yes, err := partitioned(ctx, db, s.Table)
	if err != nil {
		return false, err
	}
	s.byTime.Store(map[bool]int32{false: 1, true: 2}[yes])
	return yes, nil
}

// WakesOnCommit implements outboxdriver.Waker: a commit while the relay is
// registered idle sends a NOTIFY that ends Wait.
func (s *source) WakesOnCommit() bool { return true }
