package mqttconsumer_test

import (
	"context"
	"encoding/json"
	"log"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/inbox/inboxpgx"
	"github.com/outboxkit/outbox/inbox/mqttconsumer"
)

// A billing service subscribes, with the persistent session "billing-1",
// to the topic mqttsink publishes the order events to, and creates one
// invoice per order however often the broker delivers it.
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
	cfg := &mqttconsumer.Config{
		URL:      "mqtt://mosquitto:1883",
		ClientID: "billing-1", // the persistent session: the same across restarts
		Topics:   []string{"outbox/event/order"},
	}
	// Once, at deployment, before the relay publishes: the broker keeps
	// messages only for subscriptions that exist.
	if err := mqttconsumer.CreateSession(ctx, cfg); err != nil {
		log.Fatal(err)
	}
	c, err := mqttconsumer.New(ib, func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		var ev struct {
			OrderID int64 `json:"orderId"`
		}
		if err := json.Unmarshal(msg.Payload, &ev); err != nil {
			return consumer.Permanent(err) // to the inbox's dead letters at once
		}
		_, err := tx.Exec(ctx, `INSERT INTO invoices (order_id) VALUES ($1)`, ev.OrderID)
		return err
	}, cfg)
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil { // until SIGTERM, then a graceful stop
		log.Fatal(err)
	}
}
