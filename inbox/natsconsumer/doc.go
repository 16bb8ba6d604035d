// Package natsconsumer consumes the outbox's events from a NATS JetStream
// durable pull consumer through an inbox: each message is handled once per
// consumer name, in a transaction with the consumer's own writes, and
// acknowledged only after that transaction committed.
//
//	cons, err := js.CreateOrUpdateConsumer(ctx, "OUTBOX", natsconsumer.ConsumerConfig("billing", "outbox.event.order"))
//	ib, err := inbox.New(inboxpgx.New(pool), &inbox.Config{Consumer: "billing"})
//	c, err := natsconsumer.New(cons, ib, func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
//		_, err := tx.Exec(ctx, `INSERT INTO invoices ...`)
//		return err
//	}, nil)
//	err = c.Run(ctx) // until ctx ends; then stops gracefully
//
// A message is read as the outbox's natssink sends it (inbox.NewMessage):
// the event id from the header "id" (or Nats-Msg-Id), the aggregate id from
// the header "key", the aggregate type from a subject
// outbox.event.<aggregatetype>. Messages of one aggregate are handled one
// at a time in stream order by this instance; different aggregates run in
// parallel (Config.Concurrency). Retries, dead letters and stopping are the
// package consumer's: a failed message is retried in place with backoff
// while the server is told it is in progress (InProgress), so the
// aggregate's later messages cannot overtake it; at stop, a message waiting
// for its retry is handed back with NakWithDelay and the rest of its delay,
// and messages not started with Nak. Its delivery count carries over:
// a message the server delivered n times before starts at attempt n+1.
//
// Several instances may share one durable consumer: the inbox makes a
// message delivered to two of them take effect once. Order per aggregate
// then holds within each instance only (JetStream hands consecutive
// messages to whichever instance pulls); use one instance per durable, or
// the inbox's version guard, when the handler needs strict order.
package natsconsumer
