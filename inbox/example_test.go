package inbox_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/inboxpgx"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

// Consume an OrderPlaced event, create an invoice and publish InvoiceCreated
// through the outbox, all in one transaction: a redelivered OrderPlaced
// creates neither a second invoice nor a second event.
func ExampleInbox_HandleTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.DatabaseURL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	schema := testenv.Name("example")
	defer pool.Exec(ctx, `DROP SCHEMA `+schema+` CASCADE`)

	// Once, at deployment: the inbox, the outbox and the business table.
	if _, err := inboxpgx.Migrate(ctx, pool, outboxdriver.Table{Schema: schema, Name: "inbox"}); err != nil {
		log.Fatal(err)
	}
	if _, err := outboxpgx.New(pool).Migrate(ctx, outboxdriver.Table{Schema: schema, Name: "outbox"}, nil); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+schema+`.invoices (order_id text PRIMARY KEY)`); err != nil {
		log.Fatal(err)
	}

	ib, err := inbox.New(inboxpgx.New(pool), &inbox.Config{Consumer: "billing", Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	ob, err := outbox.New(outboxpgx.New(pool), &outbox.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}

	// What a broker adapter hands over: headers as the outbox's sinks send them.
	msg := inbox.NewMessage("outbox.event.order", []byte("42"),
		map[string]string{"id": "0190a5c8-3a1e-7c3e-9a2b-8f2d4c6e0a42"}, []byte(`{"id": 42}`))

	handle := func() inbox.Result {
		tx, err := pool.Begin(ctx)
		if err != nil {
			log.Fatal(err)
		}
		defer tx.Rollback(ctx)
		res, err := ib.HandleTx(ctx, tx, msg, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.invoices (order_id) VALUES ($1)`, msg.AggregateID); err != nil {
				return err
			}
			return ob.WriteTx(ctx, tx, outbox.Event{
				AggregateType: "invoice", AggregateID: msg.AggregateID, Type: "InvoiceCreated",
				Payload: []byte(`{"order": 42}`),
			})
		})
		if err != nil {
			log.Fatal(err) // roll back (deferred); the broker redelivers
		}
		if err := tx.Commit(ctx); err != nil {
			log.Fatal(err)
		}
		return res // acknowledge the message
	}

	fmt.Println("first delivery applied:", handle().Applied())
	fmt.Println("redelivery is a duplicate:", handle().Duplicate)

	var invoices int
	pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.invoices`).Scan(&invoices)
	st, _ := outboxpgx.New(pool).Status(ctx, ob.Table())
	fmt.Println("invoices:", invoices, "events to publish:", st.Backlog)
	// Output:
	// first delivery applied: true
	// redelivery is a duplicate: true
	// invoices: 1 events to publish: 1
}
