package outboxsqlite_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxsqlite"
)

// Open a database file, create the outbox table, and write an event in
// the same transaction as the business change.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "shop")
	defer os.RemoveAll(dir)

	db, err := outboxsqlite.Open(ctx, filepath.Join(dir, "shop.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	if _, err := outboxsqlite.New(db).Migrate(ctx, outboxdriver.Table{}, nil); err != nil { // main.outbox
		panic(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id INTEGER PRIMARY KEY, total REAL)`); err != nil {
		panic(err)
	}

	ob, err := outbox.New(outboxsqlite.New(db), nil)
	if err != nil {
		panic(err)
	}
	tx, err := db.BeginTx(ctx, nil) // BEGIN IMMEDIATE: the write lock, at once
	if err != nil {
		panic(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, total) VALUES (?, ?)`, 42, 99.5); err != nil {
		panic(err)
	}
	if err := ob.WriteTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "42", Type: "OrderPlaced",
		Payload: []byte(`{"id": 42, "total": 99.5}`)}); err != nil {
		panic(err)
	}
	if err := tx.Commit(); err != nil {
		panic(err)
	}

	st, err := outboxsqlite.New(db).Status(ctx, outboxdriver.Table{})
	if err != nil {
		panic(err)
	}
	fmt.Println(st.Table, "backlog:", st.Backlog)
	// Output: main.outbox backlog: 1
}
