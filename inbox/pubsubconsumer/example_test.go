package pubsubconsumer_test

import (
	"context"
	"encoding/json"
	"log"
	"os/signal"
	"syscall"

	"cloud.google.com/go/pubsub/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/inbox/inboxpgx"
	"github.com/outboxkit/outbox/inbox/pubsubconsumer"
)

// A billing service receives the order events pubsubsink publishes, from a
// subscription with message ordering enabled, and creates one invoice per
// order however often Pub/Sub delivers it.
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
	client, err := pubsub.NewClient(ctx, "my-project") // Application Default Credentials
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	c, err := pubsubconsumer.New(client, ib, func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		var ev struct {
			OrderID int64 `json:"orderId"`
		}
		if err := json.Unmarshal(msg.Payload, &ev); err != nil {
			return consumer.Permanent(err) // to the inbox's dead letters at once
		}
		_, err := tx.Exec(ctx, `INSERT INTO invoices (order_id) VALUES ($1)`, ev.OrderID)
		return err
	}, &pubsubconsumer.Config{Subscription: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil { // until SIGTERM, then a graceful stop
		log.Fatal(err)
	}
}
