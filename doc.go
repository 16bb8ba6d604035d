// Package outbox writes events into a transactional outbox table in the same
// database transaction as the business change that caused them.
//
// A relay (package relay, or the outbox relay command) later publishes every
// committed event to a broker, at least once, and in commit order per
// aggregate. An event from a transaction that rolled back is never seen.
//
// One driver object per database (outboxpgx.New(pool), outboxsql.New(db),
// outboxmysql.New(db), outboxsqlite.New(db)) is all the outbox needs:
//
//	drv := outboxpgx.New(pool)
//	ob, err := outbox.New(drv, &outbox.Config{})
//	...
//	_, err = ob.Migrate(ctx, nil) // once, or `outbox migrate`
//	tx, _ := pool.Begin(ctx)
//	tx.Exec(ctx, `INSERT INTO orders ...`)
//	ob.WriteTx(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "42",
//		Type: "OrderPlaced", Payload: []byte(`{"id":42}`)})
//	tx.Commit(ctx)
//
// WriteTx joins the caller's transaction; Write uses one of its own on the
// driver's pool, MigrateTx and Migrate likewise.
package outbox
