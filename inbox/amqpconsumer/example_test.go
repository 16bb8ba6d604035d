package amqpconsumer_test

import (
	"context"
	"encoding/json"
	"log"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/amqpconsumer"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/inbox/inboxpgx"
	"github.com/outboxkit/outbox/sink/amqpsink"
)

// A billing service consumes the quorum queue "billing", bound to the
// outbox's OrderPlaced events, and creates one invoice per order however
// often RabbitMQ delivers it.
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

	// Once, at start-up: the exchange the relay publishes to and the queue.
	s, err := amqpsink.Dial(ctx, "amqp://guest:guest@rabbitmq:5672/", &amqpsink.Config{Declare: true,
		Queues: []amqpsink.Queue{{Name: "billing", BindingKeys: []string{"outbox.event.order"},
			Args: amqp.Table{"x-queue-type": "quorum"}}}})
	if err != nil {
		log.Fatal(err)
	}
	if err := s.Setup(ctx); err != nil {
		log.Fatal(err)
	}
	_ = s.Close()

	c, err := amqpconsumer.New(ib, func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		var ev struct {
			OrderID int64 `json:"orderId"`
		}
		if err := json.Unmarshal(msg.Payload, &ev); err != nil {
			return consumer.Permanent(err) // to the inbox's dead letters at once
		}
		_, err := tx.Exec(ctx, `INSERT INTO invoices (order_id) VALUES ($1)`, ev.OrderID)
		return err
	}, &amqpconsumer.Config{URL: "amqp://guest:guest@rabbitmq:5672/", Queue: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	// Until SIGTERM: then stop taking messages, finish and acknowledge
	// the ones in hand, hand back the rest.
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
