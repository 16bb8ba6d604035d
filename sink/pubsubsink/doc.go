// Package pubsubsink publishes outbox messages to Google Cloud Pub/Sub with
// the official client (cloud.google.com/go/pubsub/v2).
//
// Each message becomes one Pub/Sub message on a topic of the sink's
// project: Config.Topic when set (one fixed topic for every destination),
// otherwise the topic named by Message.Destination. The ordering key is
// Message.Key (the aggregate id), and the publishers have message ordering
// enabled, so a subscription with message ordering enabled receives one
// aggregate's events in commit order. The data is Message.Value, as is.
// The attributes are:
//
//   - "id": Message.ID (a header "id" of the message is not repeated);
//   - every header of Message.Headers; a name that occurs once maps to its
//     value; a name that repeats maps to a JSON array of its values, in
//     order, and the attribute "outbox-repeated" then lists those names as
//     a JSON array;
//   - "destination": Message.Destination, only with a fixed Config.Topic,
//     so that consumers still see the route.
//
// A message counts as published once the Pub/Sub service answered the
// publish request with a message id; Publish waits for each message's
// result. With Config.CreateTopics a missing topic is created on first use;
// without it, publishing to a missing topic fails transiently (create the
// topic and the relay's retry delivers).
//
// # Ordering keys, pauses and retries
//
// When a publish with an ordering key fails, the client pauses that key:
// every later message with the key fails with "publishing paused" and is
// never sent, so nothing overtakes the failed message. The relay retries
// the failed message and the ones after it; Publish calls ResumePublish for
// each ordering key before it sends the key's first message of the call, so
// the retry goes out in order. The relay never gives the sink a key's
// messages again before it has the results of the earlier ones.
//
// # Errors
//
// A message Pub/Sub can never accept fails with [sink.Permanent] before it
// is sent, without pausing its key: a topic name Pub/Sub refuses, a message
// over 10 MB, more than 100 attributes, an attribute name over 256 bytes or
// starting with "goog", a value over 1024 bytes, an ordering key over 1024
// bytes, or text that is not UTF-8. INVALID_ARGUMENT answers from the
// service are permanent too. An unreachable service or a publish that got
// no answer within Config.Timeout is [sink.Unavailable]; everything else
// (missing topic, permission denied, paused key) is transient.
//
// # De-duplication
//
// Pub/Sub does not de-duplicate on publish: a message the relay publishes
// again (after a lost answer or a crash) is stored again, with the same
// "id" attribute. Exactly-once delivery on a subscription only stops
// redelivery of one stored message, not copies of it. Consumers drop
// duplicates by the "id" attribute, for example with the inbox package.
//
// # Connecting
//
// [Dial] opens a client for pubsub://PROJECT[/TOPIC] with the client's
// usual credentials (Application Default Credentials); with
// PUBSUB_EMULATOR_HOST set it talks to the emulator at that address
// instead, without credentials. [New] takes a client built by the caller.
package pubsubsink
