package redisconsumer_test

import (
	"context"
	"encoding/json"
	"log"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/inbox/inboxpgx"
	"github.com/outboxkit/outbox/inbox/redisconsumer"
)

// A billing service reads the stream the relay's redissink appends the
// order events to, as the member "billing-1" of the group "billing", and
// creates one invoice per order however often it is delivered.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	pool, err := pgxpool.New(ctx, "postgres://billing@db/billing")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	ib, err := inbox.New(inboxpgx.New(pool), &inbox.Config{Consumer: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "redis:6379"})
	defer rdb.Close()

	c, err := redisconsumer.New(rdb, ib, func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		var ev struct {
			OrderID int64 `json:"orderId"`
		}
		if err := json.Unmarshal(msg.Payload, &ev); err != nil {
			return consumer.Permanent(err) // to the inbox's dead letters at once
		}
		_, err := tx.Exec(ctx, `INSERT INTO invoices (order_id) VALUES ($1)`, ev.OrderID)
		return err
	}, &redisconsumer.Config{
		Streams:   []string{"outbox.event.order"},
		Group:     "billing",
		Consumer:  "billing-1",      // stable: a restart resumes its pending entries at once
		ClaimIdle: 30 * time.Second, // entries of a dead member are taken over after this
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil { // until SIGTERM, then a graceful stop
		log.Fatal(err)
	}
}
