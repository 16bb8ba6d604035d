// Package natssink is a [sink.Sink] that publishes to NATS JetStream.
//
// Each message is published to the subject named by its Destination, with its
// Value as payload and its Headers as NATS headers, plus a header "id"
// holding the message ID when the message has none; the message ID is also
// sent as the Nats-Msg-Id header so that JetStream drops duplicates within the
// stream's duplicate window (two minutes by default). A message counts as
// published once the stream answered with a PubAck; a PubAck that reports a
// duplicate is a success too, because the stream already holds the message.
//
// Publish sends a batch with asynchronous publishes, in slice order on one
// connection, keeping at most Config.MaxPending of them unacknowledged, and
// then waits for every PubAck. NATS has no partitions: Message.Key travels as
// the header "key" (unless the message already has one), and messages with
// the same key keep their order because the whole batch is submitted in
// order.
//
// Errors that retrying cannot fix are marked [sink.Permanent]: a payload
// larger than the server's max_payload or the stream's max_msg_size, an
// invalid subject or header name, a key or header value with a line break
// (a NATS header cannot carry one unchanged), and the stream's refusal of
// the message itself, told by its JetStream API error code: a header it
// cannot satisfy (Nats-Expected-Last-Sequence, error 10071, and the other
// Nats-Expected-* headers) or one that asks for what the stream does not
// allow (rollup, per-message TTL, counters, schedules, batches).
// Everything else (no stream for the subject, a full or sealed stream,
// timeouts, a closed or reconnecting connection) is transient.
//
// Use [Dial] to let the sink own its connection, or [New] to publish through
// a JetStream context the caller manages. Call [Sink.EnsureStream] at
// start-up to create the stream when it does not exist yet.
package natssink
