package kinesisconsumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"log"
	"os/signal"
	"syscall"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/inbox/inboxpgx"
	"github.com/outboxkit/outbox/inbox/kinesisconsumer"
)

// checkpoints keeps each shard's checkpoint in a table of the billing
// database: CREATE TABLE kinesis_checkpoints (stream text, shard text,
// seq text NOT NULL, PRIMARY KEY (stream, shard)).
type checkpoints struct{ pool *pgxpool.Pool }

func (c checkpoints) Get(ctx context.Context, stream, shard string) (string, error) {
	var seq string
	err := c.pool.QueryRow(ctx, `SELECT seq FROM kinesis_checkpoints WHERE stream = $1 AND shard = $2`, stream, shard).Scan(&seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return seq, err
}

func (c checkpoints) Set(ctx context.Context, stream, shard, seq string) error {
	_, err := c.pool.Exec(ctx, `INSERT INTO kinesis_checkpoints (stream, shard, seq) VALUES ($1, $2, $3)
		ON CONFLICT (stream, shard) DO UPDATE SET seq = excluded.seq`, stream, shard, seq)
	return err
}

// A billing service reads the stream kinesissink writes the order events
// to and creates one invoice per order however often a record is read.
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
	awsCfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		log.Fatal(err)
	}
	c, err := kinesisconsumer.New(kinesis.NewFromConfig(awsCfg), ib, func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		var ev struct {
			OrderID int64 `json:"orderId"`
		}
		if err := json.Unmarshal(msg.Payload, &ev); err != nil {
			return consumer.Permanent(err) // to the inbox's dead letters at once
		}
		_, err := tx.Exec(ctx, `INSERT INTO invoices (order_id) VALUES ($1)`, ev.OrderID)
		return err
	}, &kinesisconsumer.Config{Stream: "outbox-events", Checkpoints: checkpoints{pool}})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil { // until SIGTERM, then a graceful stop
		log.Fatal(err)
	}
}
