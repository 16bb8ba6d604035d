// Package amqpsink is a [sink.Sink] that publishes to RabbitMQ (AMQP 0-9-1)
// with publisher confirms.
//
// # Routing
//
// Each message is published to an exchange with a routing key, both taken
// from its Destination: by default to Config.Exchange ("outbox", a durable
// topic exchange) with the Destination as routing key; set Config.Route to
// map destinations otherwise (another exchange per destination, the default
// exchange "" to address queues by name, and so on).
//
// Messages are published with mandatory set. A message that no queue is
// bound to receive is returned by the broker and reported as a failure,
// marked [sink.Permanent] and wrapping [ErrUnroutable], even though the
// broker confirms it afterwards: an unbound routing key is a configuration
// problem (bind a queue, or fix Config.Route), and a message silently
// dropped on the floor is never a success. Likewise a message for an
// exchange that does not exist fails permanently. Publishing to a missing
// exchange would make the broker close the channel under the whole batch,
// so before Publish first uses an exchange on a connection it checks that
// the exchange exists (a passive declare). Setup can declare the exchange
// and the queues at start-up (Config.Declare).
//
// The errors speak RabbitMQ (exchange, queue, binding key, routing key,
// vhost) and name what fixes them twice: the flag of outbox relay, which
// builds this sink from --amqp-exchange and --amqp-declare, and the Config
// field of a program that builds it itself ("declare it, or let the relay
// declare it at start-up (--amqp-declare; Config.Declare, then Setup)").
//
// # Message format
//
// The Value is the body, published as is, persistent (delivery mode 2), with
// content type "application/json" when the body is valid JSON and
// "application/octet-stream" otherwise. The message-id property is
// Message.ID. The headers table holds "id" (Message.ID, unless the message
// has a header "id" of its own), the Headers in order, and the key under
// Config.KeyHeader ("key" by default; AMQP messages have no key field)
// unless the message already has that header. A header name that occurs
// once maps to a string; a name that repeats maps to an array of its
// strings, in order. RabbitMQ does not de-duplicate: consumers de-duplicate
// by message-id.
//
// # Confirms and errors
//
// Publish publishes the whole batch on one confirm-mode channel, in slice
// order, keeping at most Config.MaxInFlight messages unconfirmed, and then
// waits for the confirms. A message succeeds once the broker acknowledged
// it (for a persistent message on durable queues: once they have written
// it to disk) and did not return it.
//
//   - A nack (the broker could not take the message, e.g. a queue with
//     x-overflow=reject-publish is full) is transient and wraps [ErrNacked].
//   - A lost connection, a connection that cannot be reopened, a missing
//     confirm after Config.ConfirmTimeout and a connection blocked by a
//     broker resource alarm are marked [sink.Unavailable].
//   - Unroutable messages, missing exchanges, refused access (403), and
//     messages the broker rejects with PRECONDITION_FAILED (406, e.g. a body
//     over the broker's max_message_size) are permanent; so are bodies over
//     Config.MaxMessageSize, rejected before sending, and names AMQP cannot
//     carry (longer than 255 bytes).
//
// A channel error closes the channel and loses every confirm still pending
// on it, so when the broker closes the channel for one message, Publish
// publishes the unconfirmed messages again one at a time until it finds the
// culprit, which fails permanently, and then the rest as a batch again.
// Delivery is at least once: messages whose confirm was lost are published
// again, by Publish in that case or by the relay after an error.
//
// # Connections
//
// [Dial] connects to an amqp:// or amqps:// URL and owns the connection.
// When the connection is lost, Publish fails with [sink.Unavailable] errors
// and the next Publish (or Setup) dials again, once per call at most; there
// is no background reconnection. [New] publishes on a connection the caller
// manages: the sink opens its own channels on it and closes them on Close,
// but cannot reopen the connection, so after it is closed every Publish
// fails with [sink.Unavailable] until the caller gives the sink a new one
// (build a new Sink).
package amqpsink
