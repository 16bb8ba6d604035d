// Package consumer runs the loop every broker adapter of the inbox shares:
// receive a message, handle it with [inbox.Inbox.Handle] (the dedupe record,
// the handler and the commit in one transaction), and acknowledge it only
// after that transaction committed.
//
// Packages natsconsumer (NATS JetStream), kafkaconsumer (Kafka),
// amqpconsumer (RabbitMQ), redisconsumer (Redis Streams), mqttconsumer
// (MQTT), pubsubconsumer (Google Pub/Sub) and kinesisconsumer (Kinesis)
// adapt it to their broker; an adapter for another broker implements
// [Delivery], submits each received message to an [Engine], and passes the
// conformance suite of package consumertest.
//
// What the Engine does with a message:
//
//   - Order. Messages with the same key (the aggregate: type and id) are
//     handled one at a time, in the order they were submitted; messages
//     with different keys run in parallel on Config.Concurrency workers
//     (the key is hashed to a worker).
//   - Success. The handler returned nil and the transaction committed (or
//     the inbox found a duplicate): the message is acknowledged.
//   - Retry. The handler or the database failed (or the handler
//     panicked): the message is not
//     acknowledged; it is handled again in place after an exponential
//     backoff with jitter (Config.RetryBase doubling to Config.RetryMax),
//     keeping its key's later messages waiting behind it so that they cannot
//     overtake it. While it waits, the broker is told it is still in
//     progress (Delivery.KeepAlive) so that it does not hand it to another
//     instance.
//   - Dead letter. After Config.MaxAttempts attempts, or at once for a
//     message that can never be handled (an error wrapping
//     inbox.ErrInvalidMessage: no event id, an id that is not a UUID; or a
//     handler error marked with [Permanent], such as a payload that does not
//     decode), the message is recorded with its cause by
//     inbox.Inbox.DeadLetter and then acknowledged: recorded, not lost. If
//     the dead letter cannot be written, the message is not acknowledged
//     and is tried again.
//   - Stop. Engine.Stop stops taking messages, lets handlers in flight
//     finish and acknowledge, and hands every message it did not finish
//     back to the broker unacknowledged (Delivery.Release): a message
//     waiting for its retry with the rest of its delay, so another instance
//     does not retry it early.
//
// Every message ends with exactly one call of Ack or Release on its
// Delivery. The inbox's Config.Metrics observes every attempt.
package consumer
