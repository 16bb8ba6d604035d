package cdc

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

// Mode says which writes a CDC source expects, which decides what it
// does when its replication slot was lost (dropped or invalidated). It
// reads every kind of write whatever the mode: rows (plain inserts, and
// insert+delete) and logical decoding messages.
type Mode int

const (
	// ModeTable: events are rows of the outbox table. A lost slot is
	// reported and made again, and the rows still in the table are relayed
	// (drained) before the new slot's stream: nothing is lost. The default.
	ModeTable Mode = iota
	// ModeMessages: events are logical decoding messages
	// (outboxpgx.WithMessages), which exist only in the WAL. A lost slot
	// stops the relay with an error that names the LSN range in which
	// messages may be lost.
	ModeMessages
	// ModeInsertDelete: events are rows deleted again in their own
	// transaction (outboxpgx.WithInsertDelete), which exist only in the
	// WAL too. A lost slot stops the relay as in ModeMessages.
	ModeInsertDelete
)

// String returns "table", "message" or "insert-delete".
func (m Mode) String() string {
	switch m {
	case ModeMessages:
		return "message"
	case ModeInsertDelete:
		return "insert-delete"
	}
	return "table"
}

// ParseMode parses "table", "message" or "insert-delete".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "table":
		return ModeTable, nil
	case "message", "messages":
		return ModeMessages, nil
	case "insert-delete", "insert+delete":
		return ModeInsertDelete, nil
	}
	return 0, fmt.Errorf("unknown CDC mode %q: use table, message or insert-delete", s)
}

// Config configures a Source. The zero value relays the table's
// default slot and publication, creating them when missing.
type Config struct {
	outboxdriver.SourceConfig
	// Slot is the logical replication slot. Defaults to DefaultSlot(t):
	// derived from schema and table, so two outbox tables never share one.
	// Lower-case letters, digits and underscores, at most 63.
	Slot string
	// Publication is the publication of the outbox table's inserts the
	// slot streams. Defaults to the slot's name.
	Publication string
	// NoCreate makes a missing slot or publication an error instead of
	// creating it.
	NoCreate bool
	// Mode says what a lost slot means. Defaults to ModeTable.
	Mode Mode
	// MaxPending bounds the events decoded and not yet published that
	// the source keeps in memory: it stops reading the stream while it
	// holds that many. A larger transaction is handed on in parts (of at
	// most 1000 events) and never held whole. Defaults to 10000.
	MaxPending int
	// SpillDir is where the events of a large transaction that PostgreSQL
	// streams before its commit wait for the commit, in a file per
	// transaction removed at its end. Defaults to the system's temporary
	// directory (os.TempDir).
	SpillDir string
	// StatusInterval is the longest time between two standby status
	// updates to the server, which confirm the LSN the slot may release
	// WAL up to. Defaults to 10s; it must stay below the server's
	// wal_sender_timeout.
	StatusInterval time.Duration
}

const (
	defaultMaxPending     = 10000
	defaultStatusInterval = 10 * time.Second
	drainPage             = 1000
)

// numPartitions is how many partitions a CDC source presents its slot as
// (the most lanes a relay may have). One lease, the slot's, covers them
// all: whoever holds it holds every one, with the same epoch. Each
// aggregate hashes into one of them, so that the relay's lanes
// (relay.Config.Lanes) keep batches of different aggregates in flight at
// once while it works off a backlog, as they do for polling, and an
// aggregate's events never are in two batches at once.
const numPartitions = 64

// partitionOf is the partition of aggregate k.
func partitionOf(k aggKey) int {
	h := fnv.New32a()
	h.Write([]byte(k.typ))
	h.Write([]byte{0})
	h.Write([]byte(k.id))
	return int(h.Sum32() % numPartitions)
}

var slotRE = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// DefaultSlot is the default replication slot (and publication) name of
// table t: "outbox_<schema>_<table>", lower-cased, with a hash of the
// names appended when that was needed to keep it unique (upper-case
// letters) or short enough (63 bytes).
func DefaultSlot(t outboxdriver.Table) string {
	t = t.WithDefaults()
	raw := "outbox_" + t.Schema + "_" + t.Name
	name := strings.ToLower(raw)
	if name == raw && len(name) <= 63 {
		return name
	}
	h := fnv.New32a()
	h.Write([]byte(t.String()))
	return fmt.Sprintf("%s_%08x", name[:min(len(name), 54)], h.Sum32())
}

// resolve fills the defaults of cfg (nil: none) for table t.
func (cfg *Config) resolve(t outboxdriver.Table) (Config, error) {
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.Slot == "" {
		c.Slot = DefaultSlot(t)
	}
	if !slotRE.MatchString(c.Slot) {
		return c, fmt.Errorf("replication slot name %q: use 1 to 63 lower-case letters, digits and underscores", c.Slot)
	}
	if c.Publication == "" {
		c.Publication = c.Slot
	}
	if err := outboxdriver.ValidateIdent("publication", c.Publication); err != nil {
		return c, err
	}
	if c.Mode != ModeTable && c.Mode != ModeMessages && c.Mode != ModeInsertDelete {
		return c, fmt.Errorf("unknown CDC mode %d", c.Mode)
	}
	if c.MaxPending == 0 {
		c.MaxPending = defaultMaxPending
	}
	if c.MaxPending < 1 {
		return c, fmt.Errorf("CDC MaxPending %d must be positive", c.MaxPending)
	}
	if c.StatusInterval == 0 {
		c.StatusInterval = defaultStatusInterval
	}
	if c.StatusInterval < 10*time.Millisecond || c.StatusInterval > time.Minute {
		return c, fmt.Errorf("CDC StatusInterval %s: use 10ms to 1m", c.StatusInterval)
	}
	return c, nil
}

// Source is the relay's view of an outbox table through PostgreSQL's
// logical replication (docs/cdc.md): it streams the table's inserts and
// the table's logical decoding messages from a replication slot with the
// pgoutput plugin, and hands them to the relay in commit order, through
// the same outboxdriver.Source seam as the polling source
// (outboxpgx.Driver.NewSource), so routing,
// sinks, retries, dead letters and metrics are the same.
//
// One relay streams a slot at a time: the source presents the slot as a
// single partition whose lease (in the table's _cdc companion, with an
// epoch) the relay engine acquires and renews like any other; standbys
// take over once it expires. The slot confirms an LSN only past
// transactions whose every event the broker acknowledged or the relay
// dead-lettered, and only after a batch's outcome was recorded under a
// lease the database still judged valid; after a crash the stream resumes
// from the confirmed LSN.
type Source struct {
	base   driverkit.SourceBase // the table, the resolved SourceConfig, the logger
	pool   *pgxpool.Pool
	drv    *outboxpgx.Driver // on pool: the pauses
	cfg    Config
	names  driverkit.Names
	cn     pgschema.CDCNames
	q      queries
	prefix string

	mu         sync.Mutex
	queue      queue
	gen        int // counts streams started: a batch of an older one records nothing in memory
	republish  int // events done past the confirmed LSN when a stream ended: delivered again
	lease      outboxdriver.Lease
	leased     bool
	leaseUntil time.Time // by the local clock, a bound the database's judgement is no later than
	st         *stream
	deadLSN    pglogrepl.LSN // events of transactions up to it may be dead letters already
	target     pglogrepl.LSN // the LSN to confirm next
	closed     bool

	wake chan struct{} // signalled when something may have become claimable

	delays driverkit.ColumnProbe // deliver_at of the parked table (schema version 14)
}

var _ outboxdriver.Source = (*Source)(nil)

type queries struct {
	ensure, acquire, renew, release, fence, row   string
	deadLetter, mark, isDeadLetter, held, cleanup string
	// unhold releases the aggregates held behind events ($1); holdDead
	// holds aggregates behind their dead letters ($1), as the polling
	// source does.
	unhold, holdDead string
	// setState records a change of the slot's state: under the lease ($2
	// relay, $3 epoch), or, with both NULL, unfenced (Setup).
	setState [5]string
	// drainList lists the rows a new slot's stream does not hold ($1 slot,
	// $2 its consistent point), inside the snapshot the slot exported;
	// dropLists drops the lists of a slot that are not the one it drains.
	drainList, dropLists string
	// park writes events to the parked table; parkedCounts counts them
	// per aggregate; unpark reads the first of some aggregates' in order;
	// unparked deletes the ones published or dead-lettered. parkNoDelay
	// and unparkNoDelay are park and unpark for a parked table without
	// deliver_at (before schema version 14).
	park, parkedCounts, unpark, unparked string
	parkNoDelay, unparkNoDelay           string
}

// parkSQL writes events to the parked table, with their deliver_at
// (schema version 14) when delays is set.
func parkSQL(parked string, delays bool) string {
	col, val, arg, name := ", deliver_at", ", u.da", ", $15::timestamptz[]", ", da"
	if !delays {
		col, val, arg, name = "", "", "", ""
	}
	return `INSERT INTO ` + parked + ` (id, aggregatetype, aggregateid, type, payload, payload_raw, headers,
    tracingspancontext, seq, created_at, bad, is_row, xid, lsn` + col + `)
SELECT u.id, u.at, u.aid, u.ty, u.p, u.raw, u.h, u.tc, u.seq, u.ca, u.bad, u.isrow, u.xid, u.lsn::pg_lsn` + val + `
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::text[], $8::text[],
            $9::bigint[], $10::timestamptz[], $11::text[], $12::boolean[], $13::bigint[], $14::text[]` + arg + `)
  WITH ORDINALITY AS u(id, at, aid, ty, p, raw, h, tc, seq, ca, bad, isrow, xid, lsn` + name + `, i)
ORDER BY u.i
ON CONFLICT (id) DO NOTHING`
}

// unparkSQL reads, per aggregate asked for ($1 types, $2 ids): how many
// events it has parked, when its first parked event not yet due is due
// (NULL: none waits; always NULL without delays, before schema version
// 14), and its events before that one, at most $3, in the order parked
// (none: one row whose event columns are NULL).
func unparkSQL(parked string, delays bool) string {
	stop, due := `min(pos) FILTER (WHERE deliver_at > now())`, `w.deliver_at`
	if !delays {
		stop, due = `NULL::bigint`, `NULL::timestamptz`
	}
	return `SELECT a.t, a.id, c.total, ` + due + `,
       p.id::text, p.aggregatetype, p.aggregateid, p.type, p.payload, p.payload_raw, p.headers,
       p.tracingspancontext, p.seq, p.created_at, p.bad, p.is_row, p.xid
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS a(t, id, i)
CROSS JOIN LATERAL (SELECT count(*) AS total, ` + stop + ` AS stop
                    FROM ` + parked + ` WHERE aggregatetype = a.t AND aggregateid = a.id) c
LEFT JOIN LATERAL (SELECT ` + strings.TrimPrefix(due, "w.") + ` FROM ` + parked + ` WHERE aggregatetype = a.t AND aggregateid = a.id AND pos = c.stop) w ON true
LEFT JOIN LATERAL (SELECT * FROM ` + parked + ` WHERE aggregatetype = a.t AND aggregateid = a.id
                   AND pos < coalesce(c.stop, 9223372036854775807) ORDER BY pos LIMIT $3) p ON true
ORDER BY a.i, p.pos`
}

// slotState is a change of a slot's state in the _cdc companion.
type slotState int

const (
	slotDrained slotState = iota // the rows the slot does not hold were relayed
	slotCreated                  // the slot exists: missing, it is lost
	slotNew                      // a new slot: the table's rows are to be drained
	slotOwned                    // changes nothing: checks the lease
	slotListed                   // the rows to drain are listed ($4 the slot's consistent point, $5 none: drained)
)

func newQueries(t outboxdriver.Table) queries {
	n, c := pgschema.NamesOf(t), pgschema.CDCNamesOf(t)
	cdc, parked := c.State, c.Parked
	q := queries{
		unhold:        pgschema.UnholdSQL(n),
		holdDead:      pgschema.HoldDeadSQL(n),
		park:          parkSQL(parked, true),
		parkNoDelay:   parkSQL(parked, false),
		parkedCounts:  `SELECT aggregatetype, aggregateid, count(*) FROM ` + parked + ` GROUP BY 1, 2`,
		unpark:        unparkSQL(parked, true),
		unparkNoDelay: unparkSQL(parked, false),
		unparked:      `DELETE FROM ` + parked + ` WHERE id = ANY($1::uuid[])`,
		ensure: `INSERT INTO ` + cdc + ` (slot, publication) VALUES ($1, $2)
ON CONFLICT (slot) DO UPDATE SET publication = excluded.publication WHERE ` + cdc + `.publication <> excluded.publication`,
		acquire: `UPDATE ` + cdc + `
SET owner = $2, epoch = epoch + 1, expires_at = clock_timestamp() + $3 * interval '1 millisecond', updated_at = now()
WHERE slot = $1 AND (owner IS NULL OR expires_at <= clock_timestamp())
RETURNING epoch`,
		renew: `UPDATE ` + cdc + ` SET expires_at = clock_timestamp() + $4 * interval '1 millisecond'
WHERE slot = $1 AND owner = $2 AND epoch = $3
RETURNING epoch`,
		release: `UPDATE ` + cdc + ` SET owner = NULL, expires_at = '-infinity' WHERE slot = $1 AND owner = $2 AND epoch = $3`,
		fence:   `SELECT ` + c.Fence + `($1, $2, $3, $4::pg_lsn, $5::pg_lsn)`,
		row:     `SELECT drained, dead_lsn::text, coalesce(drain_lsn::text, '') FROM ` + cdc + ` WHERE slot = $1`,
		setState: [5]string{
			slotDrained: `UPDATE ` + cdc + ` SET drained = true WHERE slot = $1`,
			slotCreated: `UPDATE ` + cdc + ` SET slot_created = true WHERE slot = $1`,
			slotNew:     `UPDATE ` + cdc + ` SET drained = false, confirmed_lsn = NULL, drain_lsn = NULL WHERE slot = $1`,
			slotOwned:   `UPDATE ` + cdc + ` SET updated_at = now() WHERE slot = $1`,
			slotListed:  `UPDATE ` + cdc + ` SET slot_created = true, drain_lsn = $4::pg_lsn, drained = $5 WHERE slot = $1`,
		},
		drainList: `INSERT INTO ` + c.Drain + ` (slot, lsn, id)
SELECT $1, $2::pg_lsn, id FROM ` + n.Table + ` WHERE published_at IS NULL`,
		dropLists: `DELETE FROM ` + c.Drain + ` d WHERE d.slot = $1 AND NOT EXISTS (
    SELECT 1 FROM ` + cdc + ` c WHERE c.slot = d.slot AND NOT c.drained AND c.drain_lsn = d.lsn)`,
		deadLetter: `INSERT INTO ` + n.DeadLetter + ` (id, aggregatetype, aggregateid, type, payload, seq, created_at,
    headers, tracingspancontext, payload_raw, attempts, last_error, held)
SELECT u.id, u.at, u.aid, u.ty, u.p::json, u.seq, u.ca, coalesce(u.h::jsonb, '{}'::jsonb), u.tc, u.raw, u.att, u.err, u.hold
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::timestamptz[],
            $8::text[], $9::text[], $10::bytea[], $11::integer[], $12::text[], $13::boolean[])
  AS u(id, at, aid, ty, p, seq, ca, h, tc, raw, att, err, hold)
ON CONFLICT (id) DO NOTHING`,
		mark: `SELECT ` + c.Mark + `($1::uuid[], $2::bigint[], $3, $4::bigint[])`,
		// Whether each event ($1, inserted by transaction $2, 32 bits) is
		// in the dead-letter table, and whether its transaction is visible
		// yet: PostgreSQL sends a transaction a moment before other
		// sessions see it, and until then the dead letter an operator's
		// retry moved back is still there to see (the full xid as in
		// cdc_mark_fn).
		isDeadLetter: `WITH s AS (SELECT pg_current_snapshot() AS snap), t AS (SELECT snap, pg_snapshot_xmax(snap)::text::bigint AS top FROM s)
SELECT c.id::text,
       EXISTS (SELECT 1 FROM ` + n.DeadLetter + ` d WHERE d.id = c.id),
       c.x = 0 OR pg_visible_in_snapshot((CASE
           WHEN (((t.top >> 32) << 32) | c.x) < t.top THEN ((t.top >> 32) << 32) | c.x
           ELSE (((t.top >> 32) - 1) << 32) | c.x END)::text::xid8, t.snap)
FROM unnest($1::uuid[], $2::bigint[]) AS c(id, x), t`,
		held:    `SELECT aggregatetype, aggregateid, event_id::text FROM ` + n.Held + ` WHERE reason = 'dead-lettered'`,
		cleanup: pgschema.CleanupSQL(n.Table, `published_at < clock_timestamp() - $1 * interval '1 millisecond'`, "$2"),
	}
	for i, sql := range q.setState {
		// A stale streamer changes nothing.
		q.setState[i] = sql + ` AND ($2::text IS NULL OR (owner = $2 AND epoch = $3::bigint AND expires_at > clock_timestamp()))`
	}
	return q
}

// NewSource returns the relay's view of table t through logical
// replication, on pool (which stays the caller's); cfg nil takes the
// defaults. It does no I/O: the relay's first claim under the slot's lease
// creates what is missing (publication, slot) and starts streaming. Close
// it after the relay stopped.
func NewSource(pool *pgxpool.Pool, t outboxdriver.Table, cfg *Config) (*Source, error) {
	if pool == nil {
		return nil, errors.New("outboxpgx: log tailing needs a pool: pass the *pgxpool.Pool the relay reads with")
	}
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("outboxpgx: %w", err)
	}
	c, err := cfg.resolve(t)
	if err != nil {
		return nil, fmt.Errorf("outboxpgx: %w", err)
	}
	src := &Source{
		pool: pool, drv: outboxpgx.New(pool), cfg: c, names: pgschema.NamesOf(t), cn: pgschema.CDCNamesOf(t), q: newQueries(t),
		prefix: pgschema.MessagePrefix(t), queue: newQueue(), wake: make(chan struct{}, 1),
	}
	if err := src.base.Init(t, &c.SourceConfig); err != nil {
		return nil, fmt.Errorf("outboxpgx: %w", err)
	}
	return src, nil
}

// RelayName is the name the source leases the slot under
// (SourceConfig.RelayName).
func (s *Source) RelayName() string { return s.base.RelayName() }

// Pauses reads the pauses in force: one small query.
func (s *Source) Pauses(ctx context.Context) ([]outboxdriver.Pause, error) {
	return s.drv.ListPauses(ctx, s.base.Table)
}

// ExcludeAggregateTypes leaves the events of types out of the next claims.
func (s *Source) ExcludeAggregateTypes(types []string) {
	m := make(map[string]bool, len(types))
	for _, t := range types {
		m[t] = true
	}
	s.mu.Lock()
	s.queue.skip = m
	s.mu.Unlock()
}

// MaintainTimePartitions does nothing: log tailing refuses a table
// partitioned by time (docs/retention.md).
func (s *Source) MaintainTimePartitions(context.Context, outboxdriver.TimePartitionMaintenance) ([]outboxdriver.TimePartitionChange, error) {
	return nil, nil
}

// Slot is the replication slot the source streams.
func (s *Source) Slot() string { return s.cfg.Slot }

// Publication is the publication the slot streams.
func (s *Source) Publication() string { return s.cfg.Publication }

// signal wakes a Wait.
func (s *Source) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Check fails, with a one-line reason and what to do, when the database
// cannot serve log tailing: wal_level is not logical, the role may not
// replicate, or the table is not migrated for it. It warns when the
// server keeps WAL for slots without bound (max_slot_wal_keep_size).
func (s *Source) Check(ctx context.Context) error {
	var walLevel, keep string
	var replication, migrated, byTime bool
	err := s.pool.QueryRow(ctx, `SELECT current_setting('wal_level'), current_setting('max_slot_wal_keep_size'),
       coalesce((SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user), false),
       to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL,
       coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass($3)), false)`,
		s.cn.State, s.cn.Parked, s.base.Table.Qualified("")).Scan(&walLevel, &keep, &replication, &migrated, &byTime)
	if err != nil {
		return fmt.Errorf("outboxpgx: check log tailing: %w", err)
	}
	switch {
	case walLevel != "logical":
		return fmt.Errorf("outboxpgx: log tailing needs wal_level = logical, and the server runs with %s: run ALTER SYSTEM SET wal_level = logical and restart PostgreSQL", walLevel)
	case !replication:
		return errors.New("outboxpgx: log tailing needs a role with the REPLICATION attribute: run ALTER ROLE <the relay's role> REPLICATION")
	case byTime:
		// Its rows reach the WAL as rows of its partitions, which the
		// publication would have to name (publish_via_partition_root).
		return fmt.Errorf("outboxpgx: %s is partitioned by time, and log tailing does not read partitioned tables: relay it with --source poll (docs/retention.md)", s.base.Table)
	case !migrated:
		return fmt.Errorf("outboxpgx: %s is not migrated for log tailing (no %s_cdc or %s_cdc_parked table): run `outbox migrate`", s.base.Table, s.base.Table.Name, s.base.Table.Name)
	}
	if keep == "-1" {
		s.base.Log.Warn("outboxpgx: max_slot_wal_keep_size is unbounded: a slot that stops moving (a relay down for long) keeps WAL until the disk is full; set it, e.g. ALTER SYSTEM SET max_slot_wal_keep_size = '10GB'",
			"slot", s.cfg.Slot)
	}
	return nil
}

// Setup creates what the source streams from when it is missing: the
// table's row in its _cdc companion, the publication and the replication
// slot (`outbox migrate --cdc`). It does not stream. Events written as
// logical decoding messages exist for the relay only from the slot's
// creation on: set it up before writers switch to messages. A slot that
// existed and is gone is handled as the streamer does (Mode). Setup
// ignores NoCreate.
func (s *Source) Setup(ctx context.Context) error {
	if err := s.Check(ctx); err != nil {
		return err
	}
	if _, err := s.pool.Exec(ctx, s.q.ensure, s.cfg.Slot, s.cfg.Publication); err != nil {
		return fmt.Errorf("outboxpgx: set up log tailing of %s: %w", s.base.Table, migrateHint(err, s.base.Table))
	}
	if err := s.ensurePublication(ctx, true); err != nil {
		return err
	}
	return s.ensureSlot(ctx, true, func(ctx context.Context, st slotState, args ...any) error {
		_, err := s.pool.Exec(ctx, s.q.setState[st], append([]any{s.cfg.Slot, nil, nil}, args...)...) // not under a lease
		return err
	})
}

// Heartbeat checks the database and releases the aggregates held behind
// dead letters an operator discarded. The slot's lease covers all of the
// source's partitions: every relay's fair share is all of them, and the
// first to lease the slot streams.
func (s *Source) Heartbeat(ctx context.Context, ttl time.Duration) (relays, partitions int, err error) {
	s.base.NoteTTL(ttl)
	// Only holds older than the query may be released: one recorded
	// meanwhile may be missing from its answer.
	s.mu.Lock()
	before := maps.Clone(s.queue.held)
	s.mu.Unlock()
	rows, err := s.pool.Query(ctx, s.q.held)
	if err != nil {
		return 0, 0, fmt.Errorf("outboxpgx: heartbeat: %w", err)
	}
	inDB := map[aggKey]string{}
	var k aggKey
	var id string
	_, err = pgx.ForEachRow(rows, []any{&k.typ, &k.id, &id}, func() error { inDB[k] = id; return nil })
	if err != nil {
		return 0, 0, fmt.Errorf("outboxpgx: heartbeat: %w", err)
	}
	s.mu.Lock()
	released := false
	for k, id := range before {
		if inDB[k] != id && s.queue.held[k] == id {
			delete(s.queue.held, k) // discarded by an operator
			released = true
		}
	}
	s.mu.Unlock()
	if released {
		s.signal()
	}
	return 1, numPartitions, nil
}

// Acquire takes the slot's lease when nobody holds it (free, or
// expired), with a new epoch: the relay's next claim streams under it. It
// returns the first n of the source's partitions (at most all), each
// with the lease's epoch.
func (s *Source) Acquire(ctx context.Context, n int, ttl time.Duration) ([]outboxdriver.Lease, error) {
	if n <= 0 {
		return nil, nil
	}
	started := time.Now()
	var pb pgx.Batch
	pb.Queue(s.q.ensure, s.cfg.Slot, s.cfg.Publication)
	var epochs []int64
	pb.Queue(s.q.acquire, s.cfg.Slot, s.base.Cfg.RelayName, ttl.Milliseconds()).Query(func(rows pgx.Rows) error {
		var err error
		epochs, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		return err
	})
	if err := s.pool.SendBatch(ctx, &pb).Close(); err != nil {
		return nil, fmt.Errorf("outboxpgx: acquire the lease of slot %s: %w", s.cfg.Slot, migrateHint(err, s.base.Table))
	}
	if len(epochs) == 0 {
		return nil, nil
	}
	l := outboxdriver.Lease{Partition: 0, Epoch: epochs[0]}
	s.mu.Lock()
	s.lease, s.leased, s.leaseUntil = l, true, started.Add(ttl)
	s.mu.Unlock()
	s.base.Log.Info("outboxpgx: leased replication slot; streaming", "slot", s.cfg.Slot, "epoch", l.Epoch)
	leases := make([]outboxdriver.Lease, min(n, numPartitions))
	for i := range leases {
		leases[i] = outboxdriver.Lease{Partition: i, Epoch: l.Epoch}
	}
	return leases, nil
}

// Renew extends the slot's lease. Once it is lost, the stream stops at
// once: the slot is free for the new owner, and nothing of this relay's is
// confirmed any more.
func (s *Source) Renew(ctx context.Context, leases []outboxdriver.Lease, ttl time.Duration) ([]outboxdriver.Lease, error) {
	if len(leases) == 0 {
		return nil, nil
	}
	started := time.Now()
	l := leases[0]
	rows, err := s.pool.Query(ctx, s.q.renew, s.cfg.Slot, s.base.Cfg.RelayName, l.Epoch, ttl.Milliseconds())
	if err != nil {
		return nil, fmt.Errorf("outboxpgx: renew the lease of slot %s: %w", s.cfg.Slot, err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("outboxpgx: renew the lease of slot %s: %w", s.cfg.Slot, err)
	}
	if len(got) == 0 {
		s.base.Log.Warn("outboxpgx: lost the lease of the replication slot; stopping the stream", "slot", s.cfg.Slot, "epoch", l.Epoch)
		s.mu.Lock()
		s.leased = false
		s.mu.Unlock()
		s.stopStream()
		return nil, nil
	}
	s.mu.Lock()
	if s.leased && s.lease.Epoch == l.Epoch {
		s.leaseUntil = started.Add(ttl)
	}
	s.mu.Unlock()
	return leases, nil
}

// Release stops the stream and gives the slot's lease up, so that a
// standby takes over at once.
func (s *Source) Release(ctx context.Context, leases []outboxdriver.Lease, all bool) error {
	if len(leases) == 0 {
		return nil
	}
	s.mu.Lock()
	s.leased = false
	s.mu.Unlock()
	s.stopStream()
	if _, err := s.pool.Exec(ctx, s.q.release, s.cfg.Slot, s.base.Cfg.RelayName, leases[0].Epoch); err != nil {
		return fmt.Errorf("outboxpgx: release the lease of slot %s: %w", s.cfg.Slot, err)
	}
	return nil
}

// Cleanup deletes up to limit rows published (and kept) longer than
// olderThan ago.
func (s *Source) Cleanup(ctx context.Context, leases []outboxdriver.Lease, olderThan time.Duration, limit int) (int, error) {
	if len(leases) == 0 || limit <= 0 {
		return 0, nil
	}
	tag, err := s.pool.Exec(ctx, s.q.cleanup, olderThan.Milliseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("outboxpgx: clean up published rows: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// Wait blocks until events may be claimable (a transaction was decoded, a
// retry is due, an aggregate was released), d has passed, or ctx ends.
func (s *Source) Wait(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	for _, at := range []time.Time{s.queue.nextRetry(), s.queue.nextDue(time.Now())} {
		if !at.IsZero() {
			d = max(0, min(d, time.Until(at)))
		}
	}
	s.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.wake:
		return nil
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// SetIdle does nothing: the stream wakes the relay.
func (s *Source) SetIdle(context.Context, time.Duration) error { return nil }

// WakesOnCommit reports true: a decoded commit ends Wait.
func (s *Source) WakesOnCommit() bool { return true }

// Close stops the stream. The pool stays open: it belongs to the caller.
func (s *Source) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.stopStream()
	return nil
}

// Claim hands out up to limit events of the leased partitions whose
// transactions have committed, in commit order, none of an aggregate whose
// earlier event is still in flight (in this or another batch), waiting for
// a retry or held behind a dead letter. Under a lease
// it does not stream yet, it starts the stream (which first creates what
// is missing) and returns what is decoded so far, often nothing. It
// returns the error that ended the stream before, once, and streams again
// at the next claim.
func (s *Source) Claim(ctx context.Context, leases []outboxdriver.Lease, limit int) (outboxdriver.Batch, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("outboxpgx: claim limit %d must be positive", limit)
	}
	b := &batch{src: s, BatchState: driverkit.NewBatchState("outboxpgx", leases)}
	if len(leases) == 0 {
		return b, nil
	}
	l := leases[0]
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errors.New("outboxpgx: claim: the CDC source is closed")
	}
	st := s.st
	if st != nil && st.epoch != l.Epoch {
		s.mu.Unlock()
		s.stopStream() // streamed under an older lease
		s.mu.Lock()
		st = s.st
	}
	if st != nil && st.ended() {
		err := st.err
		s.st = nil
		s.resetLocked()
		s.mu.Unlock()
		return nil, err
	}
	if st == nil {
		s.startStream(l)
		s.mu.Unlock()
		return b, nil
	}
	gen := s.gen
	s.mu.Unlock()
	if err := s.park(ctx, gen, l.Epoch); err != nil {
		return nil, err
	}
	if err := s.unpark(ctx, gen); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if gen != s.gen {
		s.mu.Unlock()
		return b, nil // the stream restarted meanwhile
	}
	evs := s.queue.claim(limit, time.Now(), partitionsOf(leases))
	b.gen, b.epoch = s.gen, l.Epoch
	check := s.needsCheck(evs)
	s.mu.Unlock()
	if len(check) > 0 {
		var err error
		if evs, err = s.skipDeadLetters(ctx, b.gen, evs, check); err != nil {
			s.mu.Lock()
			if b.gen == s.gen {
				for _, e := range evs {
					s.queue.release(e)
				}
			}
			s.mu.Unlock()
			return nil, err
		}
	}
	b.events = evs
	if len(evs) > 0 {
		b.Open()
		b.Recs = make([]outboxdriver.Record, len(evs))
		for i, e := range evs {
			b.Recs[i] = e.record()
		}
	}
	return b, nil
}

// partitionsOf returns which partitions leases name; nil when they name
// all.
func partitionsOf(leases []outboxdriver.Lease) *[numPartitions]bool {
	if len(leases) >= numPartitions {
		return nil
	}
	var in [numPartitions]bool
	for _, l := range leases {
		if l.Partition >= 0 && l.Partition < numPartitions {
			in[l.Partition] = true
		}
	}
	return &in
}

// needsCheck returns the events of evs that may be in the dead-letter
// table already: replayed after a restart from before the last dead
// letter, or the dead letter an aggregate is held behind. s.mu is held.
func (s *Source) needsCheck(evs []*event) []*event {
	var out []*event
	for _, e := range evs {
		if (e.tx.lsn != 0 && e.tx.lsn <= s.deadLSN) || s.queue.held[e.key()] == e.ID {
			out = append(out, e)
		}
	}
	return out
}

// skipDeadLetters drops from evs, as done, the events of check that are in
// the dead-letter table: they were dead-lettered before (the stream
// replays them), or an aggregate is held behind them and an operator has
// not retried them yet. An event of check whose transaction is not visible
// yet cannot be told (an operator's retry moves the dead letter back in
// that transaction): it goes back to the queue with the later events of
// its aggregate in evs, to be claimed again.
func (s *Source) skipDeadLetters(ctx context.Context, gen int, evs, check []*event) ([]*event, error) {
	ids, xids := make([]string, len(check)), make([]int64, len(check))
	for i, e := range check {
		ids[i], xids[i] = e.ID, e.xid()
	}
	rows, err := s.pool.Query(ctx, s.q.isDeadLetter, pgschema.UUIDArray(ids), xids)
	if err != nil {
		return evs, fmt.Errorf("outboxpgx: claim: look up dead letters: %w", err)
	}
	isDead, unseen := map[string]bool{}, map[string]bool{}
	var (
		id            string
		dead, visible bool
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &dead, &visible}, func() error {
		isDead[id], unseen[id] = dead, !visible
		return nil
	})
	if err != nil {
		return evs, fmt.Errorf("outboxpgx: claim: look up dead letters: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen != s.gen {
		return nil, nil // the stream restarted: it replays them
	}
	kept := evs[:0]
	later := map[aggKey]bool{}
	for _, e := range evs {
		switch k := e.key(); {
		case unseen[e.ID] || later[k]:
			s.queue.release(e)
			later[k] = true
		case isDead[e.ID]:
			s.queue.done(e)
		default:
			kept = append(kept, e)
		}
	}
	if s.queue.advance() {
		s.target = max(s.target, s.queue.mark)
	}
	if s.st != nil {
		s.st.roomy()
	}
	return kept, nil
}

// batch is a claim of a CDC source: events held in memory, marked
// claimed until the outcome is recorded.
type batch struct {
	driverkit.BatchState
	src    *Source
	events []*event
	gen    int
	epoch  int64
}

// Finish records the outcome in one implicit transaction, fenced by the
// slot's lease: published rows are deleted (or marked, with retention
// keep), dead letters are written to the dead-letter table (and their rows
// removed), and the LSN the slot may confirm is recorded. Only once that
// committed does the stream confirm it. Retries wait in memory. If the
// lease was lost, nothing is recorded and Finish wraps ErrLeaseLost.
func (b *batch) Finish(ctx context.Context, out outboxdriver.Outcome) error {
	if ok, err := b.StartFinish(); !ok {
		return err
	}
	s := b.src
	byID := make(map[string][]*event, len(b.events))
	for _, e := range b.events {
		byID[e.ID] = append(byID[e.ID], e)
	}
	plan := driverkit.PlanOf(out)
	var finished []*event
	var rowIDs []string
	var rowXids, rowSeqs []int64
	var unhold []string
	var unparked []string
	s.mu.Lock()
	for _, id := range plan.Published {
		for _, e := range byID[id] {
			finished = append(finished, e)
			if e.row {
				rowIDs, rowXids, rowSeqs = append(rowIDs, id), append(rowXids, e.xid()), append(rowSeqs, e.Seq)
			}
			if e.tx.front {
				unparked = append(unparked, id)
			}
			if s.queue.held[e.key()] == id {
				unhold = append(unhold, id)
			}
		}
	}
	var dead []*event
	var deadErr []string
	var deadHold []bool
	var deadRows []string
	var deadXids, deadSeqs []int64
	var deadLSN pglogrepl.LSN
	var holdIDs []string
	hold := map[aggKey]string{}
	for _, f := range plan.DeadLetters {
		for _, e := range byID[f.ID] {
			finished = append(finished, e)
			dead = append(dead, e)
			deadErr = append(deadErr, driverkit.ErrorText(f.Err))
			deadHold = append(deadHold, f.Hold && !e.orphan)
			if f.Hold && !e.orphan {
				holdIDs = append(holdIDs, f.ID)
				hold[e.key()] = f.ID
			}
			if e.row {
				deadRows, deadXids, deadSeqs = append(deadRows, f.ID), append(deadXids, e.xid()), append(deadSeqs, e.Seq)
			}
			if e.tx.front {
				unparked = append(unparked, f.ID)
			}
			deadLSN = max(deadLSN, e.tx.lsn)
		}
	}
	var lsn pglogrepl.LSN
	var park []*event
	sameGen := b.gen == s.gen
	if sameGen {
		// The aggregates held from now on park the stream's events behind
		// their dead letters in the same transaction.
		if len(hold) > 0 {
			park = s.queue.parkable(hold, time.Now())
			deadLSN = max(deadLSN, parkedLSN(park))
		}
		if m := s.queue.markIf(slices.Concat(finished, park)); m > s.queue.mark {
			lsn = m
		}
	}
	s.mu.Unlock()

	var pb pgx.Batch
	pb.Queue(s.q.fence, s.cfg.Slot, s.base.Cfg.RelayName, b.epoch, lsnArg(lsn), lsnArg(deadLSN))
	if len(unparked) > 0 {
		pb.Queue(s.q.unparked, pgschema.UUIDArray(unparked))
	}
	if len(rowIDs) > 0 {
		pb.Queue(s.q.mark, pgschema.UUIDArray(rowIDs), rowXids, s.base.Cfg.Retention == outboxdriver.RetentionKeep, rowSeqs)
	}
	if len(unhold) > 0 {
		pb.Queue(s.q.unhold, pgschema.UUIDArray(unhold))
	}
	if len(dead) > 0 {
		pb.Queue(s.q.deadLetter, deadArgs(dead, deadErr, deadHold)...)
		if len(deadRows) > 0 {
			pb.Queue(s.q.mark, pgschema.UUIDArray(deadRows), deadXids, false, deadSeqs)
		}
		if len(holdIDs) > 0 {
			pb.Queue(s.q.holdDead, pgschema.UUIDArray(holdIDs))
		}
		if len(plan.Flow) > 0 {
			pb.Queue(s.q.unhold, pgschema.UUIDArray(plan.Flow))
		}
	}
	if len(park) > 0 {
		s.queuePark(ctx, &pb, park)
	}
	// One implicit transaction: the statements of a batch sent without
	// BEGIN commit together or not at all. A transaction the stream sent
	// may not be visible for a moment yet (cq.mark): then again.
	err := s.pool.SendBatch(ctx, &pb).Close()
	for wait := time.Millisecond; notVisible(err) && wait < 2*time.Second; wait *= 2 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		// A fresh batch: a sent one keeps the statements it prepared on
		// its connection, and the pool may hand out another.
		var again pgx.Batch
		for _, q := range pb.QueuedQueries {
			again.Queue(q.SQL, q.Arguments...)
		}
		err = s.pool.SendBatch(ctx, &again).Close()
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	current := b.gen == s.gen
	if err != nil {
		if current {
			for _, e := range slices.Concat(b.events, park) {
				s.queue.release(e)
			}
		}
		s.signal()
		return finishError("finish a batch of", len(b.events), err)
	}
	if len(park) > 0 {
		s.parkedLocked(b.gen, park)
	}
	if !current {
		return nil // the stream restarted meanwhile: it replays these events
	}
	for _, e := range finished {
		s.queue.done(e)
	}
	for _, f := range plan.DeadLetters {
		if f.Hold {
			for _, e := range byID[f.ID] {
				if !e.orphan {
					s.queue.held[e.key()] = f.ID
				}
			}
		}
	}
	for _, id := range unhold {
		for _, e := range byID[id] {
			if s.queue.held[e.key()] == id {
				delete(s.queue.held, e.key())
			}
		}
	}
	now := time.Now()
	for _, f := range plan.Retries {
		for _, e := range byID[f.ID] {
			s.queue.retry(e, now.Add(f.RetryAfter))
		}
	}
	for _, e := range b.events {
		s.queue.release(e) // neither published nor failed: untouched
	}
	if s.queue.advance() {
		s.target = max(s.target, s.queue.mark)
		if s.st != nil {
			s.st.kick()
		}
	}
	if s.st != nil && len(finished) > 0 {
		s.st.roomy()
		if s.queue.drainLeft == 0 && slices.ContainsFunc(finished, func(e *event) bool { return e.tx.drain }) {
			s.st.kick() // the reader records the slot drained
		}
	}
	s.signal()
	return nil
}

// Release makes the batch's events claimable again, untouched.
func (b *batch) Release(context.Context) {
	if !b.StartRelease() {
		return
	}
	s := b.src
	s.mu.Lock()
	if b.gen == s.gen {
		for _, e := range b.events {
			s.queue.release(e)
		}
	}
	s.mu.Unlock()
	s.signal()
}

// Pauses reads the pauses in force through the batch's source: a batch
// of log tailing holds no connection while its events are published.
func (b *batch) Pauses(ctx context.Context) ([]outboxdriver.Pause, error) {
	return b.src.Pauses(ctx)
}

// notVisible reports whether err says that rows of a transaction the
// stream sent are not visible yet.
func notVisible(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Hint == "outbox-not-visible"
}

// lsnArg is an LSN as a pg_lsn argument; 0 is NULL.
func lsnArg(l pglogrepl.LSN) any {
	if l == 0 {
		return nil
	}
	return l.String()
}

// deadArgs are the arguments of the dead-letter insert.
func deadArgs(evs []*event, errs []string, hold []bool) []any {
	n := len(evs)
	ids, ats, aids, tys := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	ps, hs, tcs := make([]*string, n), make([]*string, n), make([]*string, n)
	seqs, atts := make([]int64, n), make([]int32, n)
	cas := make([]time.Time, n)
	raws := make([][]byte, n)
	for i, e := range evs {
		ids[i], ats[i], aids[i], tys[i] = e.ID, pgText(e.AggregateType), pgText(e.AggregateID), pgText(e.Type)
		ps[i], raws[i], tcs[i] = pgschema.NullText(e.Payload), e.RawPayload, pgschema.NullText([]byte(pgText(e.TraceContext)))
		if len(e.HeadersJSON) > 0 && e.bad == nil {
			hs[i] = pgschema.NullText(e.HeadersJSON)
		}
		seqs[i], atts[i], cas[i] = e.Seq, int32(e.attempts+1), e.CreatedAt
	}
	return []any{pgschema.UUIDArray(ids), ats, aids, tys, ps, seqs, cas, hs, tcs, raws, atts, errs, hold}
}

// pgText makes s storable as PostgreSQL text: valid UTF-8, no NUL.
func pgText(s string) string {
	return strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "?")
}

// migrateHint adds what to do to an error about a missing _cdc table.
func migrateHint(err error, t outboxdriver.Table) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return fmt.Errorf("%w: %s is not migrated for log tailing: run `outbox migrate`", outboxdriver.ErrNotMigrated, t)
	}
	return err
}
