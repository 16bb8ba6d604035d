// Package kafkaconsumer consumes the outbox's events from Kafka topics, as a
// member of a consumer group, through an inbox: each record is handled once
// per consumer name, in a transaction with the consumer's own writes, and
// its offset is committed only after that transaction committed.
//
//	ib, err := inbox.New(inboxpgx.New(pool), &inbox.Config{Consumer: "billing"})
//	c, err := kafkaconsumer.New(ib, func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
//		_, err := tx.Exec(ctx, `INSERT INTO invoices ...`)
//		return err
//	}, &kafkaconsumer.Config{Brokers: []string{"k1:9092"}, Group: "billing", Topics: []string{"outbox.event.order"}})
//	err = c.Run(ctx) // until ctx ends; then stops gracefully
//
// A record is read as the outbox's kafkasink sends it (inbox.NewMessage):
// the event id from the header "id", the aggregate id from the record key,
// the aggregate type from a topic outbox.event.<aggregatetype>.
//
// Records with the same key (one aggregate) are handled one at a time in
// partition order; different keys run in parallel, also within a partition
// (Config.Concurrency). A partition's offset is committed only up to its
// highest contiguous handled record, every Config.CommitInterval, when a
// partition is revoked and at stop, so a crash never skips a record that
// was not handled: it redelivers records that were, and the inbox
// suppresses them. Retries and dead letters are the package consumer's: a
// failed record is retried in place with backoff (the records of its key
// wait behind it, and the partition's committed offset stays below it);
// after Config.MaxAttempts, or at once for an invalid record or a Permanent
// error, it goes to the inbox's dead-letter table and is then committed.
//
// When a partition is revoked, the records of it still queued or waiting
// for a retry are dropped (the partition's next owner reads them from the
// committed offset), handlers in flight finish, and the offsets are
// committed before the partition is handed over.
package kafkaconsumer
