package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxsql"
)

// exampleSchema creates a scratch schema with an orders table and an
// outbox, and returns a function that drops it.
func exampleSchema(ctx context.Context, pool *pgxpool.Pool, schema string) func() {
	t := outboxdriver.Table{Schema: schema, Name: "outbox"}
	if _, err := outboxpgx.New(pool).Migrate(ctx, t, nil); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+schema+`.orders (id bigint PRIMARY KEY, total numeric)`); err != nil {
		log.Fatal(err)
	}
	return func() { pool.Exec(ctx, `DROP SCHEMA `+schema+` CASCADE`) }
}

// Write an event in the same pgx transaction as the business change.
func ExampleOutbox_WriteTx_pgx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.DatabaseURL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	schema := testenv.Name("example")
	defer exampleSchema(ctx, pool, schema)()

	ob, err := outbox.New(outboxpgx.New(pool), &outbox.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	tx.Exec(ctx, `INSERT INTO `+schema+`.orders (id, total) VALUES (42, 99.5)`)
	err = ob.WriteTx(ctx, tx, outbox.Event{
		AggregateType: "order", AggregateID: "42", Type: "OrderPlaced",
		Payload: []byte(`{"id": 42, "total": 99.5}`),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}

	st, _ := outboxpgx.New(pool).Status(ctx, ob.Table())
	fmt.Println("events waiting for the relay:", st.Backlog)
	// Output: events waiting for the relay: 1
}

// Write events in the same database/sql transaction as the business change.
func ExampleOutbox_WriteTx_databaseSQL() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.DatabaseURL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	schema := testenv.Name("example")
	defer exampleSchema(ctx, pool, schema)()

	db, err := sql.Open("pgx", testenv.DatabaseURL())
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ob, err := outbox.New(outboxsql.New(db), &outbox.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	tx.ExecContext(ctx, `INSERT INTO `+schema+`.orders (id, total) VALUES (7, 10)`)
	err = ob.WriteTx(ctx, tx,
		outbox.Event{AggregateType: "order", AggregateID: "7", Type: "OrderPlaced", Payload: []byte(`{"id": 7}`)},
		outbox.Event{AggregateType: "order", AggregateID: "7", Type: "OrderPaid", Payload: []byte(`{"id": 7}`)},
	)
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	st, _ := outboxpgx.New(pool).Status(ctx, ob.Table())
	fmt.Println("events waiting for the relay:", st.Backlog)
	// Output: events waiting for the relay: 2
}
