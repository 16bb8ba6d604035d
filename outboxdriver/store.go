package outboxdriver

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outbox/internal/confval"
)

// Retention says what happens to a row once the broker acknowledged it.
type Retention int

const (
	// RetentionDelete deletes published rows when the batch finishes: the
	// table stays small and no cleanup is needed. The default.
	RetentionDelete Retention = iota
	// RetentionKeep sets published_at and keeps the row (for audit); the
	// relay's cleanup deletes it later.
	RetentionKeep
)

// SourceConfig configures a Source.
type SourceConfig struct {
	// Retention of published rows. Defaults to RetentionDelete.
	Retention Retention
	// RelayName identifies this relay in the lease and wake-up registries.
	// Defaults to host-pid-random.
	RelayName string
	// Logger defaults to warnings and errors as text on standard error.
	Logger *slog.Logger
}

// DefaultClaimIdle bounds a claim's transaction (or its marks) before any
// heartbeat told the source the lease TTL.
const DefaultClaimIdle = 30 * time.Second

// Resolve returns cfg (nil: none) with the defaults filled in, or an error
// for an unknown retention.
func (cfg *SourceConfig) Resolve() (SourceConfig, error) {
	c := SourceConfig{}
	if cfg != nil {
		c = *cfg
	}
	if c.Retention != RetentionDelete && c.Retention != RetentionKeep {
		return c, fmt.Errorf("unknown retention %d", c.Retention)
	}
	if c.RelayName == "" {
		c.RelayName = DefaultRelayName()
	}
	c.Logger = confval.Logger(c.Logger)
	return c, nil
}

// ErrNotMigrated is wrapped by Status (and by a relay's start) for a table
// that does not exist yet.
var ErrNotMigrated = errors.New("outbox table not found: run `outbox migrate` first")

// DeadLetter is one event in the dead-letter table.
type DeadLetter struct {
	ID             string    `json:"id"`
	AggregateType  string    `json:"aggregatetype"`
	AggregateID    string    `json:"aggregateid"`
	Type           string    `json:"type"`
	Attempts       int       `json:"attempts"`
	LastError      string    `json:"last_error"`
	DeadLetteredAt time.Time `json:"dead_lettered_at"`
	// Held is true when the aggregate's later events wait for this one.
	Held bool `json:"held"`
}

// AuditEntry is one recorded operator action.
type AuditEntry struct {
	At      time.Time `json:"at"`
	Actor   string    `json:"actor"`
	Action  string    `json:"action"`
	EventID string    `json:"event_id"`
	Detail  string    `json:"detail"`
}

// Store is an outbox database as tools see it, whatever the driver: the
// command line, the demo and the conformance suite work through it. Every
// driver that holds a pool is one; the write path is its Writer, inside
// the application's own transaction.
type Store interface {
	// Migrate creates or upgrades t and returns the versions applied
	// (none when it is current). It is idempotent and safe to run from
	// several processes at once.
	Migrate(ctx context.Context, t Table, opts *MigrateOptions) ([]int, error)
	// MigrateDown reverts t to version target (0 drops its tables) and
	// returns the versions reverted.
	MigrateDown(ctx context.Context, t Table, target int) ([]int, error)
	// LatestVersion is the newest schema version this driver knows.
	LatestVersion() int
	// NewSource returns a relay's view of t.
	NewSource(t Table, cfg *SourceConfig) (Source, error)
	// Status summarises t; it wraps ErrNotMigrated when t does not exist.
	Status(ctx context.Context, t Table) (Status, error)
	// DeadLetters lists up to limit dead letters of t, oldest first.
	DeadLetters(ctx context.Context, t Table, limit int) ([]DeadLetter, error)
	// RetryDeadLetters moves dead letters back into the outbox with their
	// ids and original positions (nil ids: all), audited under actor, and
	// returns the ids moved.
	RetryDeadLetters(ctx context.Context, t Table, ids []string, actor string) ([]string, error)
	// DiscardDeadLetters deletes dead letters for good and releases the
	// aggregates held behind them (nil ids: all), audited under actor, and
	// returns the ids deleted.
	DiscardDeadLetters(ctx context.Context, t Table, ids []string, actor string) ([]string, error)
	// Audit lists the newest limit operator actions on t, newest first.
	Audit(ctx context.Context, t Table, limit int) ([]AuditEntry, error)
	// Close releases what the Store opened itself; a connection pool the
	// caller passed in stays open.
	Close() error
	// DefaultSchema is the schema of a table whose configuration names
	// none: "public" on PostgreSQL, "main" on SQLite, "" (the
	// connection's database) on MySQL.
	DefaultSchema() string
}

// DefaultRelayName is host-pid-random: unique per process, readable in
// status output.
func DefaultRelayName() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
}

// SourceBase is what every driver's Source keeps whatever its dialect: the
// table, the resolved configuration and the lease TTL last used. A
// driver's Source embeds it and calls Init.
type SourceBase struct {
	Table Table
	Cfg   SourceConfig
	Log   *slog.Logger
	ttlMS atomic.Int64
}

// Init resolves cfg for a source over t.
func (s *SourceBase) Init(t Table, cfg *SourceConfig) error {
	c, err := cfg.Resolve()
	if err != nil {
		return err
	}
	s.Table, s.Cfg, s.Log = t, c, c.Logger
	s.ttlMS.Store(DefaultClaimIdle.Milliseconds())
	return nil
}

// RelayName is the name the source registers under.
func (s *SourceBase) RelayName() string { return s.Cfg.RelayName }

// NoteTTL records the lease TTL of the latest heartbeat: it bounds how
// long a claim may stay idle.
func (s *SourceBase) NoteTTL(ttl time.Duration) { s.ttlMS.Store(ttl.Milliseconds()) }

// TTL is the lease TTL last noted (DefaultClaimIdle before any).
func (s *SourceBase) TTL() time.Duration { return time.Duration(s.ttlMS.Load()) * time.Millisecond }

// SQLPool is the database/sql pool a driver on database/sql was made with
// (nil for a driver that only writes inside the caller's transactions). A
// driver embeds it.
type SQLPool struct {
	pool   *sql.DB
	driver string
}

// NewSQLPool returns the pool of driver (its package name, for errors).
func NewSQLPool(driver string, db *sql.DB) SQLPool { return SQLPool{pool: db, driver: driver} }

// DB is the pool (nil if none).
func (p SQLPool) DB() *sql.DB { return p.pool }

// Close does nothing: the pool is the caller's.
func (p SQLPool) Close() error { return nil }

// Need returns the pool, or an error saying the driver was made without
// one.
func (p SQLPool) Need() (*sql.DB, error) {
	if p.pool == nil {
		return nil, fmt.Errorf("%s: this Driver has no database: create it with %s.New(db)", p.driver, p.driver)
	}
	return p.pool, nil
}

// InTx runs fn in a transaction of the pool and commits it, or rolls it
// back when fn fails.
func (p SQLPool) InTx(ctx context.Context, fn func(*sql.Tx) error) error {
	db, err := p.Need()
	if err != nil {
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}
