package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/outboxdriver"
)

// DeadLetterRow is a dead letter a test puts straight into the
// dead-letter table, as the relay would have left it.
type DeadLetterRow struct {
	AggregateType, AggregateID, Type string
	// Payload is JSON text, or "" for none.
	Payload string
	// Headers is a JSON object, or "" for none.
	Headers   string
	LastError string
	Attempts  int
	// Held also holds the aggregate behind the dead letter.
	Held bool
}

// AddDeadLetters inserts rows into the dead-letter table of tb (migrated
// on PostgreSQL), in order, each with a fresh position of the outbox, and
// returns their ids.
func AddDeadLetters(t testing.TB, pool *pgxpool.Pool, tb outboxdriver.Table, rows ...DeadLetterRow) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := driverkit.NamesOf(tb.WithDefaults().Qualified)
	var ids []string
	for _, r := range rows {
		id := uuid.Must(uuid.NewV7()).String()
		var payload, headers *string
		if r.Payload != "" {
			payload = &r.Payload
		}
		if r.Headers != "" {
			headers = &r.Headers
		}
		var seq int64
		err := pool.QueryRow(ctx, `INSERT INTO `+n.DeadLetter+` (id, aggregatetype, aggregateid, type, payload, seq, created_at, headers, attempts, last_error, held)
VALUES ($1, $2, $3, $4, $5::json, nextval(pg_get_serial_sequence($6, 'seq')), clock_timestamp(), coalesce($7::jsonb, '{}'), $8, $9, $10)
RETURNING seq`, id, r.AggregateType, r.AggregateID, r.Type, payload, n.Table, headers, r.Attempts, r.LastError, r.Held).Scan(&seq)
		if err != nil {
			t.Fatalf("add dead letter %+v: %v", r, err)
		}
		if r.Held {
			if _, err := pool.Exec(ctx, `INSERT INTO `+n.Held+` (aggregatetype, aggregateid, seq, event_id, reason) VALUES ($1, $2, $3, $4, 'dead-lettered')`,
				r.AggregateType, r.AggregateID, seq, id); err != nil {
				t.Fatalf("hold %s/%s: %v", r.AggregateType, r.AggregateID, err)
			}
		}
		ids = append(ids, id)
	}
	return ids
}
