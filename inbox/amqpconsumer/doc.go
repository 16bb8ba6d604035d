// Package amqpconsumer consumes a RabbitMQ (AMQP 0-9-1) queue and handles
// every message through an inbox, on the shared engine of package
// consumer: the effect and the inbox row commit in one transaction, and
// only then is the delivery acknowledged (basic.ack).
//
// It reads what amqpsink publishes: the event id from the header "id" (or
// the message-id property), the aggregate id from the header "key"
// (Config.KeyHeader), the event type from the type property, and the
// routing key as the destination (outbox.event.<aggregatetype> gives the
// aggregate type).
//
// # Delivery
//
//   - Manual acknowledgements on one channel per connection, with a
//     prefetch (basic.qos, per consumer) of Config.Prefetch, at most
//     Config.MaxPending, so the engine never holds back the broker's
//     deliveries.
//   - Classic and quorum queues. A quorum queue's x-delivery-count header
//     counts the earlier deliveries of a message toward MaxAttempts, so a
//     message that crashes its consumer again and again is dead-lettered
//     too. Give a quorum queue no delivery-limit, or one above
//     MaxAttempts: otherwise RabbitMQ drops the message before the inbox
//     dead-letters it.
//   - A handler error is retried in place with the engine's backoff,
//     unacknowledged, so the aggregate's later messages cannot overtake
//     it; at stop (or once the channel is gone) the messages not finished
//     are handed back with basic.nack and requeue. AMQP has no delayed
//     requeue: a message waiting for its retry at stop is redelivered at
//     once.
//   - When the channel or the connection is lost, the consumer dials
//     again with a backoff (Config.ReconnectMin doubling to
//     Config.ReconnectMax) and consumes again. RabbitMQ requeues what the
//     lost channel held unacknowledged; a message whose effect had
//     committed comes back and the inbox suppresses it.
//   - RabbitMQ closes a channel that holds a delivery unacknowledged for
//     longer than its consumer_timeout (30 minutes by default); keep the
//     engine's retries shorter than that.
//
// Declare the queue and its bindings before Start, with amqpsink's Setup
// (Config.Declare and Config.Queues) or your own code; Start checks that
// the queue exists.
package amqpconsumer
