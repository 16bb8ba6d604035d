package outboxsqlite

import (
	"context"
	"database/sql"

	"github.com/outboxkit/outbox/outboxdriver"
)

// Store is an outboxdriver.Store over a database/sql pool on SQLite: what
// the command line and the conformance suite use. Applications use the
// package functions directly.
type Store struct {
	db *sql.DB
}

var _ outboxdriver.Store = (*Store)(nil)

// NewStore returns a Store over db, a pool from Open. Close leaves db open:
// it is the caller's.
func NewStore(db *sql.DB) *Store { return &Store{db: db} }

// DB is the pool the Store uses.
func (s *Store) DB() *sql.DB { return s.db }

// Migrate creates or upgrades t; see the package function Migrate.
func (s *Store) Migrate(ctx context.Context, t outboxdriver.Table, opts *outboxdriver.MigrateOptions) ([]int, error) {
	return Migrate(ctx, s.db, t, opts)
}

// MigrateDown reverts t to version target; see the package function.
func (s *Store) MigrateDown(ctx context.Context, t outboxdriver.Table, target int) ([]int, error) {
	return MigrateDown(ctx, s.db, t, target)
}

// LatestVersion is the newest schema version this package knows.
func (s *Store) LatestVersion() int { return LatestVersion() }

// NewSource returns a relay's view of t.
func (s *Store) NewSource(t outboxdriver.Table, cfg *outboxdriver.SourceConfig) (outboxdriver.Source, error) {
	return NewSource(s.db, t, cfg)
}

// Status summarises t; see the package function Status.
func (s *Store) Status(ctx context.Context, t outboxdriver.Table) (outboxdriver.Status, error) {
	return Status(ctx, s.db, t)
}

// DeadLetters lists up to limit dead letters of t, oldest first.
func (s *Store) DeadLetters(ctx context.Context, t outboxdriver.Table, limit int) ([]outboxdriver.DeadLetter, error) {
	return DeadLetters(ctx, s.db, t, limit)
}

// RetryDeadLetters moves dead letters back into the outbox; see the
// package function.
func (s *Store) RetryDeadLetters(ctx context.Context, t outboxdriver.Table, ids []string, actor string) ([]string, error) {
	return RetryDeadLetters(ctx, s.db, t, ids, actor)
}

// DiscardDeadLetters deletes dead letters and releases their aggregates;
// see the package function.
func (s *Store) DiscardDeadLetters(ctx context.Context, t outboxdriver.Table, ids []string, actor string) ([]string, error) {
	return DiscardDeadLetters(ctx, s.db, t, ids, actor)
}

// Audit lists the newest limit operator actions on t, newest first.
func (s *Store) Audit(ctx context.Context, t outboxdriver.Table, limit int) ([]outboxdriver.AuditEntry, error) {
	return Audit(ctx, s.db, t, limit)
}

// Close does nothing: the pool is the caller's.
func (s *Store) Close() error { return nil }
