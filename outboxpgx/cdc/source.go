package cdc

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

// Source is the relay's view of an outbox table through PostgreSQL's
// logical replication (docs/cdc.md): it streams the table's inserts and
// the table's logical decoding messages from a replication slot with the
// pgoutput plugin, and hands them to the relay in commit order, through
// the same outboxdriver.Source seam as the polling source
// (outboxpgx.Driver.NewSource), so routing, sinks, retries, dead letters
// and metrics are the same.
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
	failed     error         // what ended the last stream, until one reads again (Claim)
	deadLSN    pglogrepl.LSN // events of transactions up to it may be dead letters already
	target     pglogrepl.LSN // the LSN to confirm next
	closed     bool

	wake chan struct{} // signalled when something may have become claimable

	lossLogged atomic.Bool // the loss of the slot in message mode was logged
	keepWarned atomic.Bool // the unbounded max_slot_wal_keep_size was logged

	delays   driverkit.ColumnProbe // deliver_at of the parked table (schema version 14)
	backlog  driverkit.ColumnProbe // backlog_events of the _cdc table (schema version 22)
	versions driverkit.ColumnProbe // schema_version of the _cdc table (pgschema.CDCVersionsSince)
	// latest is the newest schema version this relay's code knows, which
	// it records with the slot's lease and checks the table against
	// (CheckSchema): the migrations' latest; tests set a lower one to play
	// a relay of the release before.
	latest  int
	release string
}

var (
	_ outboxdriver.Source        = (*Source)(nil)
	_ outboxdriver.SchemaChecker = (*Source)(nil)
)

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
		latest: pgschema.Latest(), release: driverkit.Release(),
	}
	src.queue.rowsGone = c.Mode == ModeInsertDelete
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
	started := time.Now()
	var pb pgx.Batch
	pb.Queue(s.q.ensure, s.cfg.Slot, s.cfg.Publication)
	var epochs []int64
	acquire, args := s.q.acquire, []any{s.cfg.Slot, s.base.Cfg.RelayName, ttl.Milliseconds()}
	if s.recordsVersions(ctx) {
		acquire, args = s.q.acquireVersions, append(args, s.latest, s.release)
	}
	pb.Queue(acquire, args...).Query(func(rows pgx.Rows) error {
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
	started := time.Now()
	l := leases[0]
	renew, args := s.q.renew, []any{s.cfg.Slot, s.base.Cfg.RelayName, l.Epoch, ttl.Milliseconds()}
	if s.recordsVersions(ctx) {
		renew, args = s.q.renewVersions, append(args, s.latest, s.release)
	}
	rows, err := s.pool.Query(ctx, renew, args...)
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

// recordsVersions reports whether the _cdc table records the streamers'
// versions (pgschema.CDCVersionsSince): a relay of this build on a table
// not migrated yet leases the slot as before, and `outbox migrate` counts
// it as of an unknown version.
func (s *Source) recordsVersions(ctx context.Context) bool {
	return s.versions.Has(func() (bool, error) {
		var has bool
		err := s.pool.QueryRow(ctx, pgschema.HasColumnSQL, s.cn.State, "schema_version").Scan(&has)
		return has, err
	}, nil)
}

// CheckSchema reads the table's schema version and the oldest relay
// version it works with (outboxdriver.SchemaChecker), as the polling
// source does: the relay stops streaming and claiming while the table
// needs a newer relay than this one.
func (s *Source) CheckSchema(ctx context.Context) (outboxdriver.SchemaCheck, error) {
	c, err := pgschema.CheckSchema(ctx, func(ctx context.Context, sql string, args []any, dest ...any) error {
		return s.pool.QueryRow(ctx, sql, args...).Scan(dest...)
	}, s.base.Table, s.latest)
	if err != nil {
		return c, fmt.Errorf("outboxpgx: %w", err)
	}
	return c, nil
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
// The replication slot stays too, keeping the WAL from its confirmed
// position on, so that the next streamer resumes where this one stopped;
// Drop (`outbox cdc drop`) drops it. `outbox status` shows the slot and
// the WAL it retains.
func (s *Source) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.stopStream()
	return nil
}
