// Package inbox makes a consumer's effects happen once per event although the
// outbox delivers at least once.
//
// The relay publishes every event at least once: a crash between the
// broker's acknowledgement and the relay's record, a lost acknowledgement, a
// lease hand-over, a dead letter retried or a replay sends the same event
// (with the same id) again, and brokers redeliver what a consumer did not
// acknowledge. An Inbox turns that into exactly-once effects for everything
// the consumer does in its own database: HandleTx records (consumer, event
// id) in the consumer's transaction with an INSERT that detects a conflict
// on the primary key, and runs the handler only when the row is new. A
// redelivered event finds the row and is reported as Result.Duplicate; the
// caller acknowledges it without a second effect. Two copies delivered at
// once to two consumer instances cannot both run: the second INSERT waits on
// the first transaction's unique key and then sees a duplicate (or, if the
// first rolled back, proceeds).
//
//	ib, err := inbox.New(inboxpgx.New(pool), &inbox.Config{Consumer: "billing"})
//	...
//	res, err := ib.Handle(ctx, msg, func(ctx context.Context, tx pgx.Tx) error {
//		_, err := tx.Exec(ctx, `UPDATE accounts SET ...`)
//		return err
//	})
//	// err == nil: acknowledge the message (res.Duplicate and res.Stale too).
//
// An optional version guard drops stale events: with Config.VersionHeader
// or Config.VersionField set, an event whose per-aggregate version is not
// newer than the last one this consumer applied for its aggregate is
// recorded but not handled (Result.Stale).
//
// Effects outside the transaction (an e-mail, an HTTP call) stay at least
// once: a crash after the call and before the commit repeats it. Give such
// calls an idempotency key (the event id) where the other side supports one.
//
// The dedupe records are kept for Config.Retention (7 days by default) and
// deleted by Cleanup; messages that cannot be handled at all can be recorded
// in a dead-letter table with DeadLetter. The tables are created by
// inboxpgx.Migrate, inboxsql.Migrate or `outbox migrate --inbox`.
//
// Handle and HandleTx run the handler in an OpenTelemetry process span, a
// child of the traceparent the message carries (the relay's publish span),
// when a tracer provider is set (Config.TracerProvider, or the global one);
// see docs/tracing.md.
package inbox
