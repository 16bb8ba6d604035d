package outboxpgx

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Store is an outboxdriver.Store over a pgx pool: what the command line
// and the conformance suite use. Applications use the package functions
// directly.
type Store struct {
	pool *pgxpool.Pool
}

var _ outboxdriver.Store = (*Store)(nil)

// NewStore returns a Store over pool. Close leaves pool open: it is the
// caller's.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// Pool is the pool the Store uses.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

func (s *Store) Migrate(ctx context.Context, t outboxdriver.Table, opts *outboxdriver.MigrateOptions) ([]int, error) {
	return Migrate(ctx, s.pool, t, opts)
}

func (s *Store) MigrateDown(ctx context.Context, t outboxdriver.Table, target int) ([]int, error) {
	return MigrateDown(ctx, s.pool, t, target)
}

func (s *Store) LatestVersion() int { return pgschema.Latest() }

func (s *Store) NewSource(t outboxdriver.Table, cfg *outboxdriver.SourceConfig) (outboxdriver.Source, error) {
	return NewSource(s.pool, t, cfg)
}

func (s *Store) Status(ctx context.Context, t outboxdriver.Table) (outboxdriver.Status, error) {
	return Status(ctx, s.pool, t)
}

func (s *Store) DeadLetters(ctx context.Context, t outboxdriver.Table, limit int) ([]outboxdriver.DeadLetter, error) {
	return DeadLetters(ctx, s.pool, t, limit)
}

func (s *Store) RetryDeadLetters(ctx context.Context, t outboxdriver.Table, ids []string, actor string) ([]string, error) {
	return RetryDeadLetters(ctx, s.pool, t, ids, actor)
}

func (s *Store) DiscardDeadLetters(ctx context.Context, t outboxdriver.Table, ids []string, actor string) ([]string, error) {
	return DiscardDeadLetters(ctx, s.pool, t, ids, actor)
}

func (s *Store) Audit(ctx context.Context, t outboxdriver.Table, limit int) ([]outboxdriver.AuditEntry, error) {
	return Audit(ctx, s.pool, t, limit)
}

// Close does nothing: the pool is the caller's.
func (s *Store) Close() error { return nil }
