package driverkit

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outbox/internal/confval"
	"github.com/outboxkit/outbox/outboxdriver"
)

// DefaultClaimIdle bounds a claim's transaction (or its marks) before any
// heartbeat told the source the lease TTL.
const DefaultClaimIdle = 30 * time.Second

// ResolveSource returns cfg (nil: none) with the defaults filled in, or an
// error for an unknown retention.
func ResolveSource(cfg *outboxdriver.SourceConfig) (outboxdriver.SourceConfig, error) {
	c := outboxdriver.SourceConfig{}
	if cfg != nil {
		c = *cfg
	}
	if c.Retention != outboxdriver.RetentionDelete && c.Retention != outboxdriver.RetentionKeep {
		return c, fmt.Errorf("unknown retention %d", c.Retention)
	}
	if c.RelayName == "" {
		c.RelayName = DefaultRelayName()
	}
	c.Logger = confval.Logger(c.Logger)
	return c, nil
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
	Table outboxdriver.Table
	Cfg   outboxdriver.SourceConfig
	Log   *slog.Logger
	ttlMS atomic.Int64
}

// Init resolves cfg for a source over t.
func (s *SourceBase) Init(t outboxdriver.Table, cfg *outboxdriver.SourceConfig) error {
	c, err := ResolveSource(cfg)
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
	return InTx(ctx, db, nil, fn)
}

// InTx runs fn in a transaction of db with opts (nil: the defaults) and
// commits it, or rolls it back when fn fails.
func InTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// ColumnProbe tells a Source whether its table has a column that a newer
// schema version added (deliver_at), so that a relay of this build on a
// table not migrated yet works as before: it looks when first asked, again
// every Recheck while the column is missing, and never again once found.
// The zero value looks at once; Recheck defaults to 5s.
type ColumnProbe struct {
	Recheck time.Duration
	next    atomic.Int64 // when to look again (Unix ns)
	present atomic.Bool
}

// Has reports whether the column is there; look asks the database. When
// look fails the answer is true: the caller's statement that needs the
// column then fails loudly rather than act as if the column were absent.
// missing is called once, the first time the column is found missing.
func (p *ColumnProbe) Has(look func() (bool, error), missing func()) bool {
	if p.present.Load() {
		return true
	}
	now := time.Now()
	if now.UnixNano() < p.next.Load() {
		return false
	}
	has, err := look()
	if err != nil || has {
		p.present.Store(err == nil)
		return true
	}
	every := p.Recheck
	if every <= 0 {
		every = 5 * time.Second
	}
	if p.next.Swap(now.Add(every).UnixNano()) == 0 && missing != nil {
		missing()
	}
	return false
}
