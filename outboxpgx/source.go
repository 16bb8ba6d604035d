package outboxpgx

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Retention says what happens to a row once the broker acknowledged it.
type Retention int

const (
	// RetentionDelete deletes published rows in the claim's transaction:
	// the table stays small and no cleanup is needed. The default.
	RetentionDelete Retention = iota
	// RetentionKeep sets published_at and keeps the row (for audit).
	RetentionKeep
)

// SourceConfig configures a Source.
type SourceConfig struct {
	// Retention of published rows. Defaults to RetentionDelete.
	Retention Retention
	// RelayName identifies this relay in the wake-up registry. Defaults to
	// host-pid-random.
	RelayName string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Source is the relay's view of an outbox table in PostgreSQL.
type Source struct {
	pool  *pgxpool.Pool
	table outboxdriver.Table
	cfg   SourceConfig
	log   *slog.Logger
	q     queries

	mu       sync.Mutex // guards listener
	listener *pgxpool.Conn
}

var _ outboxdriver.Source = (*Source)(nil)

type queries struct {
	claim, markPublished, retry, deadLetter, idle, busy string
}

func newQueries(t outboxdriver.Table, r Retention) queries {
	n := pgschema.NamesOf(t)
	q := queries{
		claim: `SELECT id::text, seq, aggregatetype, aggregateid, type, payload::text, payload_raw,
       headers::text, coalesce(tracingspancontext, ''), created_at, attempts
FROM ` + n.Table + `
WHERE published_at IS NULL AND (next_attempt_at IS NULL OR next_attempt_at <= now())
ORDER BY seq
LIMIT $1
FOR UPDATE SKIP LOCKED`,
		retry: `UPDATE ` + n.Table + ` AS o
SET attempts = o.attempts + 1, last_error = f.err,
    next_attempt_at = clock_timestamp() + f.delay_ms * interval '1 millisecond'
FROM unnest($1::uuid[], $2::text[], $3::bigint[]) AS f(id, err, delay_ms)
WHERE o.id = f.id`,
		deadLetter: `WITH f AS (SELECT * FROM unnest($1::uuid[], $2::text[]) AS f(id, err)),
moved AS (DELETE FROM ` + n.Table + ` AS o USING f WHERE o.id = f.id RETURNING o.*, f.err)
INSERT INTO ` + n.DeadLetter + ` (id, aggregatetype, aggregateid, type, payload, seq, created_at,
    headers, tracingspancontext, payload_raw, attempts, last_error)
SELECT id, aggregatetype, aggregateid, type, payload, seq, created_at,
    headers, tracingspancontext, payload_raw, attempts + 1, err
FROM moved`,
		idle: `INSERT INTO ` + n.Wakeup + ` (relay, expires_at)
VALUES ($1, now() + $2 * interval '1 millisecond')
ON CONFLICT (relay) DO UPDATE SET expires_at = excluded.expires_at`,
		busy: `DELETE FROM ` + n.Wakeup + ` WHERE relay = $1`,
	}
	if r == RetentionKeep {
		q.markPublished = `UPDATE ` + n.Table + ` SET published_at = clock_timestamp(), last_error = NULL, next_attempt_at = NULL WHERE id = ANY($1::uuid[])`
	} else {
		q.markPublished = `DELETE FROM ` + n.Table + ` WHERE id = ANY($1::uuid[])`
	}
	return q
}

// NewSource returns a Source over table t, using pool for every query and
// one pooled connection for LISTEN. It does no I/O.
func NewSource(pool *pgxpool.Pool, t outboxdriver.Table, cfg *SourceConfig) (*Source, error) {
	if pool == nil {
		return nil, errors.New("outboxpgx: pool is nil")
	}
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("outboxpgx: %w", err)
	}
	c := SourceConfig{}
	if cfg != nil {
		c = *cfg
	}
	if c.Retention != RetentionDelete && c.Retention != RetentionKeep {
		return nil, fmt.Errorf("outboxpgx: unknown retention %d", c.Retention)
	}
	if c.RelayName == "" {
		c.RelayName = defaultRelayName()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return &Source{pool: pool, table: t, cfg: c, log: c.Logger, q: newQueries(t, c.Retention)}, nil
}

func defaultRelayName() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
}

// RelayName is the name this source registers under.
func (s *Source) RelayName() string { return s.cfg.RelayName }

// batch is a claim: an open transaction holding row locks on its records.
type batch struct {
	src     *Source
	conn    *pgxpool.Conn
	records []outboxdriver.Record
	done    bool
}

// Claim opens a transaction and locks up to limit due, unpublished rows in
// seq order, skipping rows another relay holds. BEGIN, the relay's own
// asynchronous commit and the SELECT go in one round trip.
func (s *Source) Claim(ctx context.Context, limit int) (outboxdriver.Batch, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("outboxpgx: claim limit %d must be positive", limit)
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("outboxpgx: claim: %w", err)
	}
	b := &batch{src: s, conn: conn}
	var pb pgx.Batch
	pb.Queue(`BEGIN`)
	// Losing the relay's own commit in a database crash only republishes
	// (a duplicate with the same id); it never loses an event.
	pb.Queue(`SET LOCAL synchronous_commit = off`)
	pb.Queue(s.q.claim, limit)
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
		return nil, fmt.Errorf("outboxpgx: claim from %s: %w", s.table, err)
	}
	b.records = records
	return b, nil
}

func scanRecords(rows pgx.Rows, limit int) ([]outboxdriver.Record, error) {
	defer rows.Close()
	out := make([]outboxdriver.Record, 0, min(limit, 1024))
	for rows.Next() {
		var (
			r       outboxdriver.Record
			payload *string
			raw     []byte
			headers *string
		)
		if err := rows.Scan(&r.ID, &r.Seq, &r.AggregateType, &r.AggregateID, &r.Type, &payload, &raw, &headers, &r.TraceContext, &r.CreatedAt, &r.Attempts); err != nil {
			return nil, err
		}
		switch {
		case payload != nil:
			r.Payload = []byte(*payload)
		case raw != nil:
			r.Payload = raw
		}
		if headers != nil {
			r.Headers = parseHeaders(*headers)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// parseHeaders reads the headers column. Rows written by plain SQL may hold
// any JSON object: non-string values are kept as their JSON text, so one
// odd row never blocks the relay.
func parseHeaders(s string) map[string]string {
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(s), &m); err != nil || len(m) == 0 {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		var str string
		if err := json.Unmarshal(v, &str); err == nil {
			out[k] = str
		} else if string(v) != "null" {
			out[k] = string(v)
		}
	}
	return out
}

func (b *batch) Records() []outboxdriver.Record { return b.records }

// Finish records the outcome and commits, in one round trip.
func (b *batch) Finish(ctx context.Context, out outboxdriver.Outcome) error {
	if b.done {
		return errors.New("outboxpgx: batch already finished")
	}
	var pb pgx.Batch
	if len(out.Published) > 0 {
		pb.Queue(b.src.q.markPublished, out.Published)
	}
	var retryIDs, retryErrs, dlIDs, dlErrs []string
	var retryDelays []int64
	for _, f := range out.Failed {
		msg := errorText(f.Err)
		if f.Permanent {
			dlIDs, dlErrs = append(dlIDs, f.ID), append(dlErrs, msg)
		} else {
			retryIDs, retryErrs = append(retryIDs, f.ID), append(retryErrs, msg)
			retryDelays = append(retryDelays, f.RetryAfter.Milliseconds())
		}
	}
	if len(retryIDs) > 0 {
		pb.Queue(b.src.q.retry, retryIDs, retryErrs, retryDelays)
	}
	if len(dlIDs) > 0 {
		pb.Queue(b.src.q.deadLetter, dlIDs, dlErrs)
	}
	pb.Queue(`COMMIT`)
	err := b.conn.SendBatch(ctx, &pb).Close()
	b.done = true
	if err != nil {
		b.conn.Conn().Close(context.WithoutCancel(ctx)) // never return a connection in an unknown transaction state
		b.conn.Release()
		return fmt.Errorf("outboxpgx: finish batch of %d: %w", len(b.records), err)
	}
	b.conn.Release()
	return nil
}

// Release rolls the claim back.
func (b *batch) Release(ctx context.Context) {
	if b.done {
		return
	}
	b.done = true
	if _, err := b.conn.Exec(context.WithoutCancel(ctx), `ROLLBACK`); err != nil {
		b.conn.Conn().Close(context.WithoutCancel(ctx))
	}
	b.conn.Release()
}

// errorText bounds the stored error text.
func errorText(err error) string {
	if err == nil {
		return "unknown error"
	}
	s := strings.ToValidUTF8(strings.ReplaceAll(err.Error(), "\x00", ""), "?")
	if len(s) > 2000 {
		s = strings.ToValidUTF8(s[:2000], "") + "..."
	}
	return s
}

// Wait blocks on LISTEN until a notification, d, or ctx. It (re)connects
// the listener when needed; after a reconnect it returns at once, because
// notifications sent meanwhile are lost.
func (s *Source) Wait(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.listener == nil {
		conn, err := s.pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("outboxpgx: listen: %w", err)
		}
		if _, err := conn.Exec(ctx, `LISTEN `+outboxdriver.QuoteIdent(s.table.Channel())); err != nil {
			conn.Conn().Close(context.WithoutCancel(ctx))
			conn.Release()
			return fmt.Errorf("outboxpgx: listen: %w", err)
		}
		s.listener = conn
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	_, err := s.listener.Conn().WaitForNotification(wctx)
	switch {
	case err == nil:
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

func (s *Source) dropListener() {
	if s.listener == nil {
		return
	}
	s.listener.Conn().Close(context.Background())
	s.listener.Release()
	s.listener = nil
}

// SetIdle registers this relay as idle for ttl (writers then send a
// NOTIFY), or removes it when ttl is 0.
func (s *Source) SetIdle(ctx context.Context, ttl time.Duration) error {
	var err error
	if ttl > 0 {
		_, err = s.pool.Exec(ctx, s.q.idle, s.cfg.RelayName, ttl.Milliseconds())
	} else {
		_, err = s.pool.Exec(ctx, s.q.busy, s.cfg.RelayName)
	}
	if err != nil {
		return fmt.Errorf("outboxpgx: set idle: %w", err)
	}
	return nil
}

// Close drops the listener and the wake-up registration. The pool stays
// open: it belongs to the caller.
func (s *Source) Close() error {
	s.mu.Lock()
	s.dropListener()
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, _ = s.pool.Exec(ctx, s.q.busy, s.cfg.RelayName)
	return nil
}
