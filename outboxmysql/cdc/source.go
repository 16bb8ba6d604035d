package cdc

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/mysqlbinlog"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxmysql"
)

// Source is the relay's view of an outbox table through the binary log
// (docs/binlog.md): a replication connection streams the table's
// inserted rows, and the source hands them to the relay in commit order,
// an aggregate's events one after the other.
//
// One relay streams the table at a time: the source presents the log as
// a single partition whose lease (a row of <table>_binlog, with an
// epoch) the relay engine acquires and renews like any other; standbys
// take over once it expires. The saved position moves only past
// transactions whose every event the broker acknowledged or the relay
// dead-lettered, and only in a transaction that checked the lease, so a
// stale streamer records nothing; after a crash the stream resumes from
// the saved position (events past it are published again: duplicates
// only after faults, never loss).
type Source struct {
	base driverkit.SourceBase
	db   *sql.DB
	drv  *outboxmysql.Driver
	cfg  Config
	mc   *mysql.Config
	n    driverkit.Names
	bl   string // the quoted <table>_binlog

	mu     sync.Mutex
	queue  queue
	gen    int // counts streams started: a batch of an older one records nothing in memory
	lease  outboxdriver.Lease
	leased bool
	st     *stream
	failed error // what ended the last stream, until one reads again
	saved  savedPos
	// replayUntil is the high-water mark the last stream's owner saved:
	// events of transactions up to it may be published already (table
	// mode checks their rows before handing them out).
	replayUntil mysqlbinlog.Position
	closed      bool
	wake        chan struct{}
}

var _ outboxdriver.Source = (*Source)(nil)

// NewSource returns the relay's view of table t through the binary log,
// on db (the caller's: the relay's queries and the drain use it) and the
// replication connection cfg.DSN names. It does no I/O: the relay's
// first claim under the lease starts the stream. Close it after the
// relay stopped.
func NewSource(db *sql.DB, t outboxdriver.Table, cfg *Config) (*Source, error) {
	if db == nil {
		return nil, errors.New("outboxmysql: binlog tailing needs a *sql.DB")
	}
	if t.Name == "" {
		t.Name = outboxdriver.DefaultTableName
	}
	check := t
	if check.Schema == "" {
		check.Schema = "current_database"
	}
	if err := check.Validate(); err != nil {
		return nil, fmt.Errorf("outboxmysql: %w", err)
	}
	c, mc, err := cfg.resolve(t)
	if err != nil {
		return nil, fmt.Errorf("outboxmysql: %w", err)
	}
	q := func(suffix string) string {
		if t.Schema == "" {
			return quoteIdent(t.Name + suffix)
		}
		return quoteIdent(t.Schema) + "." + quoteIdent(t.Name+suffix)
	}
	s := &Source{db: db, drv: outboxmysql.New(db), cfg: c, mc: mc, n: driverkit.NamesOf(q), bl: q("_binlog"),
		queue: queue{held: map[aggKey]string{}}, wake: make(chan struct{}, 1)}
	if err := s.base.Init(t, &c.SourceConfig); err != nil {
		return nil, fmt.Errorf("outboxmysql: %w", err)
	}
	return s, nil
}

func quoteIdent(s string) string { return "`" + strings.ReplaceAll(s, "`", "``") + "`" }

// RelayName is the name the source leases the log under.
func (s *Source) RelayName() string { return s.base.RelayName() }

// Name is the streamer's name (its row of <table>_binlog).
func (s *Source) Name() string { return s.cfg.Name }

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

// MaintainTimePartitions does nothing: no MySQL table is partitioned by
// time.
func (s *Source) MaintainTimePartitions(context.Context, outboxdriver.TimePartitionMaintenance) ([]outboxdriver.TimePartitionChange, error) {
	return nil, nil
}

func (s *Source) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Heartbeat registers the relay as alive and releases the aggregates
// held behind dead letters an operator discarded or retried. The log's
// one lease covers all of the source's partitions: every relay's fair
// share is all of them, and the first to lease the log streams.
func (s *Source) Heartbeat(ctx context.Context, ttl time.Duration) (relays, partitions int, err error) {
	s.base.NoteTTL(ttl)
	if _, err := s.db.ExecContext(ctx, `INSERT INTO `+s.n.Relays+` (relay, expires_at)
VALUES (?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
ON DUPLICATE KEY UPDATE expires_at = VALUES(expires_at)`, s.base.Cfg.RelayName, ttl.Microseconds()); err != nil {
		return 0, 0, fmt.Errorf("outboxmysql: heartbeat: %w", migrateHint(err))
	}
	s.mu.Lock()
	before := make(map[aggKey]string, len(s.queue.held))
	for k, v := range s.queue.held {
		before[k] = v
	}
	s.mu.Unlock()
	if len(before) > 0 {
		inDB, err := s.readHeld(ctx)
		if err != nil {
			return 0, 0, fmt.Errorf("outboxmysql: heartbeat: %w", err)
		}
		released := false
		s.mu.Lock()
		for k, id := range before {
			if inDB[k] != id && s.queue.held[k] == id {
				delete(s.queue.held, k)
				released = true
			}
		}
		s.mu.Unlock()
		if released {
			s.signal()
		}
	}
	return 1, numPartitions, nil
}

// readHeld reads the aggregates held behind dead letters.
func (s *Source) readHeld(ctx context.Context) (map[aggKey]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT aggregatetype, aggregateid, event_id FROM `+s.n.Held+` WHERE reason = 'dead-lettered'`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[aggKey]string{}
	for rows.Next() {
		var k aggKey
		var id string
		if err := rows.Scan(&k.typ, &k.id, &id); err != nil {
			return nil, err
		}
		out[k] = id
	}
	return out, rows.Err()
}

// migrateHint says to migrate when the binlog table is missing.
func migrateHint(err error) error {
	var my *mysql.MySQLError
	if errors.As(err, &my) && my.Number == 1146 {
		return fmt.Errorf("%w (run `outbox migrate`: log tailing needs schema version 8)", err)
	}
	return err
}

// Acquire takes the log's lease when nobody holds it (free, or
// expired), with a new epoch, and returns the first n of the source's
// partitions (at most all), each with the lease's epoch.
func (s *Source) Acquire(ctx context.Context, n int, ttl time.Duration) ([]outboxdriver.Lease, error) {
	var epoch int64
	got := false
	err := driverkit.InTx(ctx, s.db, &sql.TxOptions{Isolation: sql.LevelReadCommitted}, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT IGNORE INTO `+s.bl+` (name) VALUES (?)`, s.cfg.Name); err != nil {
			return err
		}
		var free bool
		if err := tx.QueryRowContext(ctx, `SELECT owner IS NULL OR expires_at <= UTC_TIMESTAMP(6) FROM `+s.bl+` WHERE name = ? FOR UPDATE`, s.cfg.Name).Scan(&free); err != nil {
			return err
		}
		if !free {
			return nil
		}
		if _, err := tx.ExecContext(ctx, `UPDATE `+s.bl+` SET owner = ?, epoch = epoch + 1, expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE name = ?`,
			s.base.Cfg.RelayName, ttl.Microseconds(), s.cfg.Name); err != nil {
			return err
		}
		got = true
		return tx.QueryRowContext(ctx, `SELECT epoch FROM `+s.bl+` WHERE name = ?`, s.cfg.Name).Scan(&epoch)
	})
	if err != nil {
		return nil, fmt.Errorf("outboxmysql: acquire the binlog lease %s: %w", s.cfg.Name, migrateHint(err))
	}
	if !got {
		return nil, nil
	}
	l := outboxdriver.Lease{Partition: 0, Epoch: epoch}
	s.mu.Lock()
	s.lease, s.leased = l, true
	s.mu.Unlock()
	s.base.Log.Info("outboxmysql: leased the binary log; streaming", "name", s.cfg.Name, "epoch", epoch)
	leases := make([]outboxdriver.Lease, min(n, numPartitions))
	for i := range leases {
		leases[i] = outboxdriver.Lease{Partition: i, Epoch: epoch}
	}
	return leases, nil
}

// Renew extends the lease. Once it is lost, the stream stops at once.
func (s *Source) Renew(ctx context.Context, leases []outboxdriver.Lease, ttl time.Duration) ([]outboxdriver.Lease, error) {
	l := leases[0]
	if _, err := s.db.ExecContext(ctx, `UPDATE `+s.bl+` SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
WHERE name = ? AND owner = ? AND epoch = ?`, ttl.Microseconds(), s.cfg.Name, s.base.Cfg.RelayName, l.Epoch); err != nil {
		return nil, fmt.Errorf("outboxmysql: renew the binlog lease: %w", err)
	}
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+s.bl+` WHERE name = ? AND owner = ? AND epoch = ?`,
		s.cfg.Name, s.base.Cfg.RelayName, l.Epoch).Scan(&n); err != nil {
		return nil, fmt.Errorf("outboxmysql: renew the binlog lease: %w", err)
	}
	if n == 0 {
		s.base.Log.Warn("outboxmysql: lost the binlog lease; stopping the stream", "name", s.cfg.Name, "epoch", l.Epoch)
		s.mu.Lock()
		s.leased = false
		s.mu.Unlock()
		s.stopStream()
		return nil, nil
	}
	return leases, nil
}

// Release stops the stream and gives the lease up; with all, it also
// unregisters the relay.
func (s *Source) Release(ctx context.Context, leases []outboxdriver.Lease, all bool) error {
	if len(leases) > 0 {
		s.mu.Lock()
		s.leased = false
		s.mu.Unlock()
		s.stopStream()
		if _, err := s.db.ExecContext(ctx, `UPDATE `+s.bl+` SET owner = NULL, expires_at = '1970-01-01 00:00:00' WHERE name = ? AND owner = ? AND epoch = ?`,
			s.cfg.Name, s.base.Cfg.RelayName, leases[0].Epoch); err != nil {
			return fmt.Errorf("outboxmysql: release the binlog lease: %w", err)
		}
	}
	if all {
		if _, err := s.db.ExecContext(ctx, `DELETE FROM `+s.n.Relays+` WHERE relay = ?`, s.base.Cfg.RelayName); err != nil {
			return fmt.Errorf("outboxmysql: unregister relay: %w", err)
		}
	}
	return nil
}

// Cleanup deletes up to limit rows published (and kept) longer than
// olderThan ago.
func (s *Source) Cleanup(ctx context.Context, leases []outboxdriver.Lease, olderThan time.Duration, limit int) (int, error) {
	if len(leases) == 0 || limit <= 0 {
		return 0, nil
	}
	res, err := s.db.ExecContext(ctx, `DELETE FROM `+s.n.Table+`
WHERE published_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND ORDER BY published_at LIMIT ?`, olderThan.Microseconds(), limit)
	if err != nil {
		return 0, fmt.Errorf("outboxmysql: clean up published rows: %w", err)
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// Wait blocks until events may be claimable (a transaction was read, a
// retry is due, an aggregate was released), d has passed, or ctx ends.
func (s *Source) Wait(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	if at := s.queue.nextDue(); !at.IsZero() {
		d = max(0, min(d, time.Until(at)))
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

// WakesOnCommit reports true: a transaction read from the log ends Wait.
func (s *Source) WakesOnCommit() bool { return true }

// Close stops the stream. db stays open: it belongs to the caller.
func (s *Source) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.stopStream()
	return nil
}

// Setup records the server's current binary log position as the place
// to stream from, unless a position is saved already. In insert-delete
// mode run it (or the relay) before writers write: their events exist
// only in the log, and a relay with no saved position starts at the
// server's position of its first start. In table mode it is not needed:
// without a position, the relay relays the rows in the table first.
func (s *Source) Setup(ctx context.Context) error {
	var file string
	var pos int64
	err := driverkit.InTx(ctx, s.db, &sql.TxOptions{Isolation: sql.LevelReadCommitted}, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT IGNORE INTO `+s.bl+` (name) VALUES (?)`, s.cfg.Name); err != nil {
			return migrateHint(err)
		}
		var saved sql.NullString
		if err := tx.QueryRowContext(ctx, `SELECT file FROM `+s.bl+` WHERE name = ? FOR UPDATE`, s.cfg.Name).Scan(&saved); err != nil {
			return err
		}
		if saved.Valid {
			return nil
		}
		rows, err := tx.QueryContext(ctx, `SHOW MASTER STATUS`)
		if err != nil {
			return fmt.Errorf("read the server's position (REPLICATION CLIENT or BINLOG MONITOR needed): %w", err)
		}
		cols, _ := rows.Columns()
		if !rows.Next() {
			rows.Close()
			return errors.New("SHOW MASTER STATUS returned nothing: the binary log is off (log_bin)")
		}
		dest := make([]any, len(cols))
		dest[0], dest[1] = &file, &pos
		for i := 2; i < len(dest); i++ {
			dest[i] = new(sql.RawBytes)
		}
		err = rows.Scan(dest...)
		rows.Close()
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `UPDATE `+s.bl+` SET file = ?, pos = ?, updated_at = UTC_TIMESTAMP(6) WHERE name = ?`, file, pos, s.cfg.Name)
		return err
	})
	if err != nil {
		return fmt.Errorf("outboxmysql: binlog setup: %w", err)
	}
	return nil
}
