package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/outboxdriver"
)

// PublishedRow is an event a test puts straight into the outbox table as
// published and kept (the relay's retention keep).
type PublishedRow struct {
	AggregateType, AggregateID, Type string
	// Payload is JSON text, or "" for none.
	Payload string
	// Ago is how long before now it was published.
	Ago time.Duration
}

// AddPublished inserts rows into the outbox table of tb (migrated on
// PostgreSQL), in order, each published Ago before now, and returns their
// ids.
func AddPublished(t testing.TB, pool *pgxpool.Pool, tb outboxdriver.Table, rows ...PublishedRow) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var ids []string
	for _, r := range rows {
		id := uuid.Must(uuid.NewV7()).String()
		var payload *string
		if r.Payload != "" {
			payload = &r.Payload
		}
		_, err := pool.Exec(ctx, `INSERT INTO `+tb.WithDefaults().Qualified("")+` (id, aggregatetype, aggregateid, type, payload, published_at)
VALUES ($1, $2, $3, $4, $5::jsonb, clock_timestamp() - $6 * interval '1 millisecond')`, id, r.AggregateType, r.AggregateID, r.Type, payload, r.Ago.Milliseconds())
		if err != nil {
			t.Fatalf("add a published event: %v", err)
		}
		ids = append(ids, id)
	}
	return ids
}
