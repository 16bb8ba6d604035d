// Package kafkasink publishes outbox messages to Apache Kafka with franz-go.
//
// Each message becomes one Kafka record: the topic is Message.Destination,
// the record key is Message.Key (so all messages of one aggregate land on one
// partition), the value is Message.Value, and the headers are Message.Headers
// in order, preceded by a header "id" holding Message.ID when the message has
// no "id" header of its own.
//
// A message counts as published only once the partition leader has answered
// an acks=all produce request for it. The producer is idempotent (the
// franz-go default), so the client's internal retries neither duplicate nor
// reorder records; records with the same key are produced in slice order.
// Delivery to the topic is still at least once: a Publish that gives up
// (its context ends, the broker is unreachable) may have written some of its
// records, and the relay publishes them again.
//
// Errors are classified for the relay: a message is failed with
// [sink.Permanent] when Kafka will never accept it (invalid topic name,
// record too large, topic authorization denied, record rejected as invalid);
// everything else, including unknown topics, timeouts and unreachable
// brokers, is transient.
//
// Use [Dial] to let the sink build and own its client from a kafka:// URL,
// or [New] with a client built by the caller from [Options] plus its own
// options (TLS, SASL, client id).
package kafkasink
