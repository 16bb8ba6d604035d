package outboxmysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/migrations"
	"github.com/outboxkit/outbox/outboxdriver"
)

// source is the relay's view of an outbox table in MySQL or MariaDB.
type source struct {
	driverkit.SourceBase
	db *sql.DB
	n  driverkit.Names

	idleVar atomic.Value             // string: the server variable that bounds a claim's idle time ("" until known)
	exclude atomic.Pointer[[]string] // aggregate types the claims leave out (paused)
	delays  driverkit.ColumnProbe    // the deliver_at column (schema version 4)
	// versions is the relays' schema_version column (relayVersionsSince).
	versions driverkit.ColumnProbe
	// latest is the newest schema version this relay's code knows, which
	// it records and checks the table against (CheckSchema).
	latest  int
	release string
}

var _ outboxdriver.Source = (*source)(nil)

// NewSource returns the relay's view of table t, using the Driver's
// database for every query. It does no I/O. t.Schema is the MySQL
// database; empty means the connection's current one.
func (d *Driver) NewSource(t outboxdriver.Table, cfg *outboxdriver.SourceConfig) (outboxdriver.Source, error) {
	db, err := d.pool.Need()
	if err != nil {
		return nil, err
	}
	if err := validate(t); err != nil {
		return nil, err
	}
	s := &source{db: db, n: namesOf(t), latest: migrations.Latest(all()), release: driverkit.Release()}
	if err := s.Init(t, cfg); err != nil {
		return nil, fmt.Errorf("outboxmysql: %w", err)
	}
	return s, nil
}

// chunk bounds the ids of one IN list.
const chunk = 1000

// placeholders returns "?, ?, ..." for n arguments.
func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

// ints converts to []any.
func ints[T int | int64](xs []T) []any {
	out := make([]any, len(xs))
	for i, x := range xs {
		out[i] = x
	}
	return out
}

func strs(xs []string) []any {
	out := make([]any, len(xs))
	for i, x := range xs {
		out[i] = x
	}
	return out
}

// querier is a *sql.Tx, *sql.Conn or *sql.DB.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// heldLeases returns the partitions of leases that the relay still holds,
// by the database clock, at the epoch it acquired them.
func (s *source) heldLeases(ctx context.Context, q querier, leases []outboxdriver.Lease) (map[int]bool, error) {
	out := map[int]bool{}
	if len(leases) == 0 {
		return out, nil
	}
	want := make(map[int]int64, len(leases))
	parts := make([]int, len(leases))
	for i, l := range leases {
		want[l.Partition], parts[i] = l.Epoch, l.Partition
	}
	rows, err := q.QueryContext(ctx, `SELECT `+"`partition`"+`, epoch FROM `+s.n.Leases+`
WHERE owner = ? AND expires_at > UTC_TIMESTAMP(6) AND `+"`partition`"+` IN (`+placeholders(len(parts))+`)`,
		append([]any{s.Cfg.RelayName}, ints(parts)...)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var p int
		var e int64
		if err := rows.Scan(&p, &e); err != nil {
			return nil, err
		}
		if we, ok := want[p]; ok && we == e {
			out[p] = true
		}
	}
	return out, rows.Err()
}

// idleVariable returns the session variable that makes the server end a
// claim's transaction left idle: idle_transaction_timeout on MariaDB, and
// wait_timeout (which ends the idle connection) on MySQL, which has no
// transaction-level one.
func (s *source) idleVariable(ctx context.Context, conn *sql.Conn) (string, error) {
	if v, ok := s.idleVar.Load().(string); ok && v != "" {
		return v, nil
	}
	var version string
	if err := conn.QueryRowContext(ctx, `SELECT VERSION()`).Scan(&version); err != nil {
		return "", err
	}
	v := "wait_timeout"
	if strings.Contains(strings.ToLower(version), "mariadb") {
		v = "idle_transaction_timeout"
	}
	s.idleVar.Store(v)
	return v, nil
}

// batch is a claim: an open transaction on its own connection holding the
// claimed rows and the partitions' claim rows locked.
type batch struct {
	driverkit.BatchState
	src     *source
	conn    *sql.Conn
	tx      *sql.Tx
	idleVar string
}

// Claim opens a READ COMMITTED transaction, locks the claim row of every
// leased partition no other transaction is relaying (FOR UPDATE SKIP
// LOCKED on <table>_claims: a stale owner's batch keeps its partitions
// until it ends), and reads up to limit due, unpublished rows of those
// partitions in seq order, skipping held aggregates and every row behind
// an earlier one of its aggregate that is not due (claimScan). A row is
// due when neither its deliver_at nor its next_attempt_at is ahead of
// UTC_TIMESTAMP(6). The claim rows make
// the batch the only one of its partitions in the whole cluster, so the
// outbox rows themselves are read without locks, as of the statement's
// start: uncommitted rows are invisible, and no row is ever skipped
// because another claim's scan locked it for a moment. (InnoDB locks a
// row before it filters it, so FOR UPDATE SKIP LOCKED on the outbox rows
// would let one relay skip an earlier event of an aggregate that a
// concurrent claim on other partitions had just scanned, and take a later
// one: out of order.) A plain SELECT ... LIMIT n never returns more than
// n rows (MySQL does not even allow LIMIT in an IN subquery). The
// transaction may stay idle while the batch is published at most one
// lease TTL: on MariaDB the server then ends it (idle_transaction_timeout);
// on MySQL it closes the idle connection (wait_timeout). Either releases a
// paused relay's claim.
func (s *source) Claim(ctx context.Context, leases []outboxdriver.Lease, limit int) (outboxdriver.Batch, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("outboxmysql: claim limit %d must be positive", limit)
	}
	b := &batch{src: s, BatchState: driverkit.NewBatchState("outboxmysql", leases)}
	if len(leases) == 0 {
		return b, nil
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("outboxmysql: claim: %w", err)
	}
	b.conn = conn
	b.Open()
	records, err := b.claim(ctx, limit)
	if err != nil {
		b.Release(ctx)
		return nil, fmt.Errorf("outboxmysql: claim from %s: %w", s.Table, err)
	}
	b.Recs = records
	return b, nil
}

func (b *batch) claim(ctx context.Context, limit int) ([]outboxdriver.Record, error) {
	s := b.src
	v, err := s.idleVariable(ctx, b.conn)
	if err != nil {
		return nil, err
	}
	secs := max(1, (s.TTL().Milliseconds()+999)/1000)
	if _, err := b.conn.ExecContext(ctx, `SET SESSION `+v+` = `+strconv.FormatInt(secs, 10)); err != nil {
		return nil, err
	}
	b.idleVar = v
	// The transaction outlives ctx: a relay that stops claiming still
	// finishes (or releases) the batch in flight.
	tx, err := b.conn.BeginTx(context.WithoutCancel(ctx), &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, err
	}
	b.tx = tx
	held, err := s.heldLeases(ctx, tx, b.Leases)
	if err != nil {
		return nil, err
	}
	if len(held) == 0 {
		return nil, nil
	}
	parts := make([]int, 0, len(held))
	for p := range held {
		parts = append(parts, p)
	}
	sort.Ints(parts)
	rows, err := tx.QueryContext(ctx, `SELECT `+"`partition`"+` FROM `+s.n.Claims+`
WHERE `+"`partition`"+` IN (`+placeholders(len(parts))+`) FOR UPDATE SKIP LOCKED`, ints(parts)...)
	if err != nil {
		return nil, err
	}
	locked := parts[:0]
	for rows.Next() {
		var p int
		if err := rows.Scan(&p); err != nil {
			rows.Close()
			return nil, err
		}
		locked = append(locked, p)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return nil, err
	}
	if len(locked) == 0 {
		return nil, nil
	}
	excludeSQL, excludeArgs := "", []any(nil)
	if p := s.exclude.Load(); p != nil && len(*p) > 0 {
		excludeSQL, excludeArgs = "\n  AND o.aggregatetype NOT IN ("+placeholders(len(*p))+")", strs(*p)
	}
	due := dueNoDelaysSQL
	if s.delays.Has(func() (bool, error) {
		var n int
		err := tx.QueryRowContext(ctx, `SELECT count(*) FROM information_schema.columns
WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ? AND column_name = 'deliver_at'`, schemaArg(s.Table), s.Table.Name).Scan(&n)
		return n > 0, err
	}, func() {
		s.Log.Warn("outboxmysql: the table has no deliver_at column (schema before version 4): claiming as before until `outbox migrate` adds it", "table", s.Table.String())
	}) {
		due = dueSQL
	}
	q := `SELECT o.id, o.seq, o.` + "`partition`" + `, o.aggregatetype, o.aggregateid, o.type,
       IF(` + due + `, o.payload, NULL), IF(` + due + `, o.payload_raw, NULL), IF(` + due + `, o.headers, NULL),
       COALESCE(o.tracingspancontext, ''), TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', o.created_at), o.attempts,
       ` + due + `
FROM ` + s.n.Table + ` AS o
WHERE o.` + "`partition`" + ` IN (` + placeholders(len(locked)) + `)
  AND o.published_at IS NULL
  AND o.seq > ?
  AND NOT EXISTS (SELECT 1 FROM ` + s.n.Held + ` AS h
                  WHERE h.aggregatetype = o.aggregatetype AND h.aggregateid = o.aggregateid AND h.seq < o.seq)` + excludeSQL + `
ORDER BY o.seq
LIMIT ?`
	c := claimScan{limit: limit, out: driverkit.NewRecords(limit)}
	for page := limit; ; page = max(limit, min(2*page, maxClaimPage)) {
		rows, err := tx.QueryContext(ctx, q, append(append(append(ints(locked), c.after), excludeArgs...), page)...)
		if err != nil {
			return nil, err
		}
		n, err := c.scan(rows)
		if err != nil {
			return nil, err
		}
		if len(c.out) == limit || n < page {
			return c.out, nil
		}
	}
}

// dueSQL is true for a row that may be published now: neither its
// deliver_at (a delayed event) nor its next_attempt_at (a retry) is
// ahead. UTC_TIMESTAMP(6) is the same throughout a statement.
const dueSQL = `((o.deliver_at IS NULL OR o.deliver_at <= UTC_TIMESTAMP(6)) AND ` + dueNoDelaysSQL + `)`

// dueNoDelaysSQL is dueSQL for a table before schema version 4 (no
// deliver_at column): a relay of this build on a table not migrated yet
// relays on.
const dueNoDelaysSQL = `(o.next_attempt_at IS NULL OR o.next_attempt_at <= UTC_TIMESTAMP(6))`

// maxClaimPage bounds the rows of one page of a claim that reads past
// rows that are not due.
const maxClaimPage = 5000

// aggregate identifies an aggregate.
type aggregate struct{ typ, id string }

// claimScan keeps the order of every aggregate while a claim reads the
// unpublished rows of its partitions in seq order, page after page: a row
// that is not due (deliver_at or next_attempt_at ahead, set by the relay,
// a writer or by hand) is not claimed, and neither is any later row of its
// aggregate. Those rows are all read, before the aggregate's later ones:
// an aggregate's rows share its partition, and the pages read every
// unpublished row of the claimed partitions, in seq order, that is not
// left out with the whole aggregate (held after an earlier seq, or of a
// paused type). This costs no index: MySQL has no partial indexes, and an
// index of the rows that wait would have an entry for every row, paid by
// every INSERT. The rows that are not due are read as before, when the
// claim's WHERE skipped them; their payloads are not sent.
type claimScan struct {
	limit   int
	out     []outboxdriver.Record
	after   int64              // the last seq read
	blocked map[aggregate]bool // aggregates with a row read that is not due
}

// scan reads one page, adds its claimable rows to out (up to limit) and
// returns how many rows the page had.
func (c *claimScan) scan(rows *sql.Rows) (int, error) {
	defer rows.Close()
	n := 0
	for rows.Next() {
		var (
			r       outboxdriver.Record
			payload []byte
			raw     []byte
			headers []byte
			micros  int64
			due     bool
		)
		if err := rows.Scan(&r.ID, &r.Seq, &r.Partition, &r.AggregateType, &r.AggregateID, &r.Type, &payload, &raw, &headers, &r.TraceContext, &micros, &r.Attempts, &due); err != nil {
			return n, err
		}
		n++
		c.after = r.Seq
		if len(c.out) == c.limit {
			continue
		}
		agg := aggregate{r.AggregateType, r.AggregateID}
		if !due {
			if c.blocked == nil {
				c.blocked = map[aggregate]bool{}
			}
			c.blocked[agg] = true
			continue
		}
		if c.blocked[agg] {
			continue
		}
		driverkit.SetPayload(&r, payload, payload != nil, raw)
		r.Headers, r.HeadersErr = driverkit.DecodeHeaders(headers)
		r.CreatedAt = time.UnixMicro(micros).UTC()
		c.out = append(c.out, r)
	}
	return n, rows.Err()
}

// Finish checks the batch's leases (the fence), records the outcome and
// commits, in the claim's transaction. If a lease was lost, it rolls back
// and nothing is recorded.
func (b *batch) Finish(ctx context.Context, out outboxdriver.Outcome) error {
	if len(b.Recs) == 0 {
		b.Release(ctx)
		return nil
	}
	if ok, err := b.StartFinish(); !ok {
		return err
	}
	err := b.record(ctx, out)
	if err == nil {
		err = b.tx.Commit()
		b.tx = nil
		if err == nil {
			b.closeConn(ctx, false)
			return nil
		}
	}
	// Never return a connection in an unknown transaction state.
	if b.tx != nil {
		_ = b.tx.Rollback()
	}
	b.closeConn(ctx, !errors.Is(err, outboxdriver.ErrLeaseLost))
	return fmt.Errorf("outboxmysql: finish batch of %d: %w", len(b.Recs), err)
}

// record runs the fence and the outcome's statements in the transaction.
func (b *batch) record(ctx context.Context, out outboxdriver.Outcome) error {
	s, tx, n := b.src, b.tx, &b.src.n
	fenced := b.Fenced()
	held, err := s.heldLeases(ctx, tx, fenced)
	if err != nil {
		return err
	}
	if len(held) != len(fenced) {
		return driverkit.LeaseLost(s.Cfg.RelayName)
	}
	exec := func(q string, args ...any) error {
		_, err := tx.ExecContext(ctx, q, args...)
		return err
	}
	plan := driverkit.PlanOf(out)
	if err := driverkit.KeepClashesTx(ctx, tx, n.DeadLetter, &plan, s.Log, s.Table); err != nil {
		return err
	}
	for ids := range chunks(plan.Published) {
		args := strs(ids)
		if s.Cfg.Retention == outboxdriver.RetentionKeep {
			err = exec(`UPDATE `+n.Table+` AS o `+byIDs(len(ids))+` SET o.published_at = UTC_TIMESTAMP(6), o.last_error = NULL, o.next_attempt_at = NULL`, args...)
		} else {
			err = exec(`DELETE o FROM `+n.Table+` AS o `+byIDs(len(ids)), args...)
		}
		if err != nil {
			return err
		}
		if err := exec(`DELETE FROM `+n.Held+` WHERE event_id IN (`+placeholders(len(ids))+`)`, args...); err != nil {
			return err
		}
	}
	for fs := range chunks(plan.Retries) {
		ids := driverkit.FailureIDs(fs)
		in := placeholders(len(ids))
		var errCase, delayCase strings.Builder
		args := strs(ids)
		for _, f := range fs {
			errCase.WriteString(" WHEN ? THEN ?")
			args = append(args, f.ID, driverkit.ErrorText(f.Err))
		}
		for _, f := range fs {
			delayCase.WriteString(" WHEN ? THEN ?")
			args = append(args, f.ID, max(0, f.RetryAfter.Microseconds()))
		}
		if err := exec(`UPDATE `+n.Table+` AS o `+byIDs(len(ids))+` SET o.attempts = o.attempts + 1,
    o.last_error = CASE o.id`+errCase.String()+` END,
    o.next_attempt_at = UTC_TIMESTAMP(6) + INTERVAL (CASE o.id`+delayCase.String()+` END) MICROSECOND`, args...); err != nil {
			return err
		}
		if err := exec(`INSERT INTO `+n.Held+` (aggregatetype, aggregateid, seq, event_id, reason)
SELECT aggregatetype, aggregateid, seq, id, 'retrying' FROM `+n.Table+` WHERE id IN (`+in+`)
ON DUPLICATE KEY UPDATE event_id = event_id`, strs(ids)...); err != nil {
			return err
		}
	}
	for fs := range chunks(plan.DeadLetters) {
		ids := driverkit.FailureIDs(fs)
		in := placeholders(len(ids))
		var errCase, holdCase strings.Builder
		var args []any
		for _, f := range fs {
			errCase.WriteString(" WHEN ? THEN ?")
			args = append(args, f.ID, driverkit.ErrorText(f.Err))
		}
		for _, f := range fs {
			holdCase.WriteString(" WHEN ? THEN ?")
			args = append(args, f.ID, f.Hold)
		}
		args = append(args, strs(ids)...)
		if err := exec(`INSERT INTO `+n.DeadLetter+` (id, aggregatetype, aggregateid, type, payload, seq, created_at,
    headers, tracingspancontext, payload_raw, attempts, last_error, held)
SELECT id, aggregatetype, aggregateid, type, payload, seq, created_at,
    headers, tracingspancontext, payload_raw, attempts + 1, CASE id`+errCase.String()+` END, CASE id`+holdCase.String()+` END
FROM `+n.Table+` WHERE id IN (`+in+`) ORDER BY seq`, args...); err != nil {
			return err
		}
		if err := exec(`DELETE o FROM `+n.Table+` AS o `+byIDs(len(ids)), strs(ids)...); err != nil {
			return err
		}
	}
	for ids := range chunks(plan.Hold) {
		if err := exec(`INSERT INTO `+n.Held+` (aggregatetype, aggregateid, seq, event_id, reason)
SELECT aggregatetype, aggregateid, seq, id, 'dead-lettered' FROM `+n.DeadLetter+` WHERE id IN (`+placeholders(len(ids))+`)
ON DUPLICATE KEY UPDATE
    held_at = IF(event_id = VALUES(event_id), UTC_TIMESTAMP(6), held_at),
    reason = IF(event_id = VALUES(event_id), VALUES(reason), reason)`, strs(ids)...); err != nil {
			return err
		}
	}
	for ids := range chunks(plan.Flow) {
		if err := exec(`DELETE FROM `+n.Held+` WHERE event_id IN (`+placeholders(len(ids))+`)`, strs(ids)...); err != nil {
			return err
		}
	}
	return nil
}

// byIDs joins the outbox table (as o) to n ids, for statements that
// change the rows of a batch. MariaDB plans `WHERE id IN (...)` over a
// small table as a scan of the whole table, which locks rows of other
// batches: two lanes' finishes deadlocked on it, and the events of the
// refused one were published twice. Joined, each id is one lookup in
// by_id.
func byIDs(n int) string {
	return `JOIN (SELECT ? AS id` + strings.Repeat(` UNION ALL SELECT ?`, n-1) + `) AS x ON o.id = x.id`
}

// chunks yields xs in slices of at most chunk elements.
func chunks[T any](xs []T) func(yield func([]T) bool) {
	return func(yield func([]T) bool) {
		for len(xs) > 0 {
			n := min(len(xs), chunk)
			if !yield(xs[:n]) {
				return
			}
			xs = xs[n:]
		}
	}
}

// Release rolls the claim back.
func (b *batch) Release(ctx context.Context) {
	if !b.StartRelease() {
		return
	}
	bad := false
	if b.tx != nil {
		bad = b.tx.Rollback() != nil
		b.tx = nil
	}
	b.closeConn(ctx, bad)
}

// closeConn resets the idle timeout the claim set and returns the
// connection to the pool, or discards it when bad or when the reset fails:
// a connection of the caller's pool must not keep the relay's settings.
func (b *batch) closeConn(ctx context.Context, bad bool) {
	if b.conn == nil {
		return
	}
	if !bad && b.idleVar != "" {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_, err := b.conn.ExecContext(rctx, `SET SESSION `+b.idleVar+` = DEFAULT`)
		cancel()
		bad = err != nil
	}
	if bad {
		_ = b.conn.Raw(func(any) error { return driver.ErrBadConn })
	}
	_ = b.conn.Close()
	b.conn = nil
}

// Wait sleeps until d has passed or ctx is done: MySQL has no
// LISTEN/NOTIFY, so the poll interval is the latency floor of an idle
// relay.
func (s *source) Wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// WakesOnCommit is false: Wait returns only when d has passed.
func (s *source) WakesOnCommit() bool { return false }

// SetIdle does nothing: writers have no way to wake a MySQL relay.
func (s *source) SetIdle(context.Context, time.Duration) error { return nil }

// Close does nothing: db belongs to the caller.
func (s *source) Close() error { return nil }

// Heartbeat registers the relay as alive for ttl and counts the live relays
// and the partitions.
func (s *source) Heartbeat(ctx context.Context, ttl time.Duration) (relays, partitions int, err error) {
	s.NoteTTL(ttl)
	register := `INSERT INTO ` + s.n.Relays + ` (relay, expires_at)
VALUES (?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
ON DUPLICATE KEY UPDATE expires_at = VALUES(expires_at)`
	args := []any{s.Cfg.RelayName, ttl.Microseconds()}
	count := `SELECT (SELECT COUNT(*) FROM ` + s.n.Relays + ` WHERE expires_at > UTC_TIMESTAMP(6)),
       (SELECT COUNT(*) FROM ` + s.n.Leases + `)`
	if s.hasVersions(ctx) {
		// Relays too old for the table claim nothing: they are left out
		// of the share (docs/operations.md, Upgrades).
		register = `INSERT INTO ` + s.n.Relays + " (relay, expires_at, schema_version, `release`, renewed_at)" + `
VALUES (?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, ?, ?, UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE expires_at = VALUES(expires_at), schema_version = VALUES(schema_version),
    ` + "`release` = VALUES(`release`)" + `, renewed_at = VALUES(renewed_at)`
		args = append(args, s.latest, s.release)
		count = `SELECT (SELECT COUNT(*) FROM ` + s.n.Relays + ` WHERE expires_at > UTC_TIMESTAMP(6)
          AND COALESCE(schema_version, 0) >= (SELECT COALESCE(MAX(relays_from), 0) FROM ` + s.n.Migrations + `)),
       (SELECT COUNT(*) FROM ` + s.n.Leases + `)`
	}
	if _, err := s.db.ExecContext(ctx, register, args...); err != nil {
		return 0, 0, fmt.Errorf("outboxmysql: heartbeat: %w", err)
	}
	if err = s.db.QueryRowContext(ctx, count).Scan(&relays, &partitions); err != nil {
		return 0, 0, fmt.Errorf("outboxmysql: heartbeat: %w", err)
	}
	return relays, partitions, nil
}

// hasVersions reports whether the relays registry records the relays'
// versions (relayVersionsSince): a relay of this build on a table not
// migrated yet registers as before.
func (s *source) hasVersions(ctx context.Context) bool {
	return s.versions.Has(func() (bool, error) {
		var n int
		err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM information_schema.columns
WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ? AND column_name = 'schema_version'`, schemaArg(s.Table), s.Table.Name+"_relays").Scan(&n)
		return n > 0, err
	}, nil)
}

// CheckSchema reads the table's schema version and the oldest relay
// version it works with (outboxdriver.SchemaChecker).
func (s *source) CheckSchema(ctx context.Context) (outboxdriver.SchemaCheck, error) {
	c := outboxdriver.SchemaCheck{RelayVersion: s.latest}
	if err := s.db.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM `+s.n.Migrations).Scan(&c.TableVersion); err != nil {
		return c, fmt.Errorf("outboxmysql: read the schema version of %s: %w", s.Table, err)
	}
	if c.TableVersion < relayVersionsSince {
		done := map[int]bool{}
		for v := 1; v <= c.TableVersion; v++ {
			done[v] = true
		}
		c.RelaysFrom = migrations.RelaysFrom(all(), done)
		return c, nil
	}
	if err := s.db.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0), COALESCE(MAX(relays_from), 0) FROM `+s.n.Migrations).Scan(&c.TableVersion, &c.RelaysFrom); err != nil {
		return c, fmt.Errorf("outboxmysql: read the schema version of %s: %w", s.Table, err)
	}
	return c, nil
}

// Acquire takes up to n free or expired partitions, lowest first, each
// with a new epoch.
func (s *source) Acquire(ctx context.Context, n int, ttl time.Duration) ([]outboxdriver.Lease, error) {
	out, err := s.inTx(ctx, func(tx *sql.Tx) ([]outboxdriver.Lease, error) {
		rows, err := tx.QueryContext(ctx, `SELECT `+"`partition`"+` FROM `+s.n.Leases+`
WHERE owner IS NULL OR expires_at <= UTC_TIMESTAMP(6)
ORDER BY `+"`partition`"+` LIMIT ? FOR UPDATE SKIP LOCKED`, n)
		if err != nil {
			return nil, err
		}
		var parts []int
		for rows.Next() {
			var p int
			if err := rows.Scan(&p); err != nil {
				rows.Close()
				return nil, err
			}
			parts = append(parts, p)
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil || len(parts) == 0 {
			return nil, err
		}
		in := placeholders(len(parts))
		if _, err := tx.ExecContext(ctx, `UPDATE `+s.n.Leases+`
SET owner = ?, epoch = epoch + 1, expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
WHERE `+"`partition`"+` IN (`+in+`)`, append([]any{s.Cfg.RelayName, ttl.Microseconds()}, ints(parts)...)...); err != nil {
			return nil, err
		}
		return s.leaseRows(ctx, tx, `SELECT `+"`partition`"+`, epoch FROM `+s.n.Leases+` WHERE `+"`partition`"+` IN (`+in+`)`, ints(parts)...)
	})
	if err != nil {
		return nil, fmt.Errorf("outboxmysql: acquire leases: %w", err)
	}
	return out, nil
}

// inTx runs fn in a READ COMMITTED transaction.
func (s *source) inTx(ctx context.Context, fn func(tx *sql.Tx) ([]outboxdriver.Lease, error)) ([]outboxdriver.Lease, error) {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, err
	}
	out, err := fn(tx)
	if err != nil {
		_ = tx.Rollback()
		return nil, err
	}
	return out, tx.Commit()
}

func (s *source) leaseRows(ctx context.Context, q querier, query string, args ...any) ([]outboxdriver.Lease, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return driverkit.ScanLeases(rows)
}

// leaseMatch returns the WHERE condition, and its arguments, that selects
// the relay's rows of leases at their epochs.
func (s *source) leaseMatch(leases []outboxdriver.Lease) (string, []any) {
	var b strings.Builder
	args := []any{s.Cfg.RelayName}
	parts := make([]any, len(leases))
	b.WriteString("owner = ? AND (")
	for i, l := range leases {
		if i > 0 {
			b.WriteString(" OR ")
		}
		b.WriteString("(`partition` = ? AND epoch = ?)")
		args = append(args, l.Partition, l.Epoch)
		parts[i] = l.Partition
	}
	b.WriteString(") AND `partition` IN (" + placeholders(len(leases)) + ")")
	return b.String(), append(args, parts...)
}

// Renew extends leases by ttl and returns those the relay still holds.
func (s *source) Renew(ctx context.Context, leases []outboxdriver.Lease, ttl time.Duration) ([]outboxdriver.Lease, error) {
	where, args := s.leaseMatch(leases)
	if _, err := s.db.ExecContext(ctx, `UPDATE `+s.n.Leases+` SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE `+where,
		append([]any{ttl.Microseconds()}, args...)...); err != nil {
		return nil, fmt.Errorf("outboxmysql: renew leases: %w", err)
	}
	out, err := s.leaseRows(ctx, s.db, `SELECT `+"`partition`"+`, epoch FROM `+s.n.Leases+` WHERE `+where, args...)
	if err != nil {
		return nil, fmt.Errorf("outboxmysql: renew leases: %w", err)
	}
	return out, nil
}

// Release gives leases up; with all, it also unregisters the relay.
func (s *source) Release(ctx context.Context, leases []outboxdriver.Lease, all bool) error {
	if len(leases) > 0 {
		where, args := s.leaseMatch(leases)
		if _, err := s.db.ExecContext(ctx, `UPDATE `+s.n.Leases+` SET owner = NULL, expires_at = '1970-01-01 00:00:00' WHERE `+where, args...); err != nil {
			return fmt.Errorf("outboxmysql: release leases: %w", err)
		}
	}
	if all {
		if _, err := s.db.ExecContext(ctx, `DELETE FROM `+s.n.Relays+` WHERE relay = ?`, s.Cfg.RelayName); err != nil {
			return fmt.Errorf("outboxmysql: unregister relay: %w", err)
		}
	}
	return nil
}

// Cleanup deletes up to limit published rows of the leased partitions that
// are older than olderThan, oldest first, in one short statement. Call it
// repeatedly: one giant DELETE would hold locks for long.
func (s *source) Cleanup(ctx context.Context, leases []outboxdriver.Lease, olderThan time.Duration, limit int) (int, error) {
	if len(leases) == 0 || limit <= 0 {
		return 0, nil
	}
	parts := driverkit.Partitions(leases)
	res, err := s.db.ExecContext(ctx, `DELETE FROM `+s.n.Table+`
WHERE published_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND AND `+"`partition`"+` IN (`+placeholders(len(parts))+`)
ORDER BY published_at LIMIT ?`, append(append([]any{olderThan.Microseconds()}, ints(parts)...), limit)...)
	if err != nil {
		return 0, fmt.Errorf("outboxmysql: clean up published rows: %w", err)
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// MaintainTimePartitions does nothing: no table here is partitioned by
// time (outboxdriver.ErrNoTimePartitions).
func (s *source) MaintainTimePartitions(context.Context, outboxdriver.TimePartitionMaintenance) ([]outboxdriver.TimePartitionChange, error) {
	return nil, nil
}
