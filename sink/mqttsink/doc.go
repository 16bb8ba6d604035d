// Package mqttsink is a [sink.Sink] that publishes to an MQTT 3.1.1 broker
// (Mosquitto, EMQX, HiveMQ, VerneMQ, ...) with the Eclipse Paho client
// github.com/eclipse/paho.mqtt.golang.
//
// # Topics
//
// Each message is published to the topic made from its Destination by
// Config.TopicReplacer, by default "." → "/": the destination
// "orders.created" becomes the topic "orders/created". Messages are never
// retained.
//
// # Payload
//
// MQTT 3.1.1 has no message headers (user properties came with MQTT 5), so
// the event id, the key and the headers cannot travel beside the payload. By
// default each message is therefore published as a JSON envelope, with the
// field names of the stdoutsink package's lines:
//
//	{"id":"…","destination":"orders.created","key":"o-1",
//	 "headers":[{"key":"id","value":"…"},{"key":"type","value":"Created"}],
//	 "payload":{"total": 5}}
//
// Its fields:
//   - "id" is the event id, and the headers hold it as "id" too (first, if
//     the message has no "id" header of its own).
//   - "destination" is the message's Destination.
//   - "key" is the key; "key_base64" (standard base64) replaces it when the
//     key is not valid UTF-8.
//   - "headers" is an array, in order, because names may repeat.
//   - "payload" is the value itself, byte for byte, when it is valid JSON in
//     UTF-8 (a JSON decoder that keeps raw values, such as Go's
//     json.RawMessage, gets the exact bytes back, less any whitespace around
//     the value), and null when there is none; for any other value the
//     envelope has "payload_base64" (standard base64) instead.
//
// Delivery is at least once: consumers should de-duplicate by "id".
//
// With Config.RawPayload the value is published byte for byte instead, and
// only the payload travels: the id, the key and every header are lost.
//
// # Delivery
//
// Messages are published with QoS 1 (Config.QoS may ask for 2; QoS 0 is not
// offered because it has no acknowledgement). A message counts as published
// once the broker's PUBACK (QoS 1) or PUBCOMP (QoS 2) arrived. Publish sends a
// batch in slice order on one connection, keeping at most Config.MaxInflight
// publishes unacknowledged, and waits for every acknowledgement; MQTT has no
// partitions, so messages with the same key keep their order because the
// whole batch does. Once a publish fails, the rest of the batch is not sent
// (they fail too), so that later messages do not overtake the failed one.
//
// # Reconnecting
//
// The outbox is the buffer: the sink never relies on an MQTT session to
// deliver a message later. A sink made by [Dial] connects with a clean
// session and with Paho's automatic reconnect off, because Paho would keep
// the publishes that were in flight when the connection dropped and resend
// them from its in-memory store after reconnecting, long after Publish
// reported them. Instead, when the connection drops, every publish still
// waiting for its acknowledgement fails at once with a [sink.Unavailable]
// error (the relay publishes it again), Publish fails at once with
// [ErrNotConnected] (also Unavailable) while there is no connection, and the
// sink reconnects in the background with a fresh client and an empty store,
// retrying with a back-off of up to Config.MaxReconnectInterval.
//
// # Errors
//
// Errors that retrying cannot fix are marked [sink.Permanent]: an invalid
// topic (empty, containing the wildcards '+' or '#', NUL or control
// characters, invalid UTF-8, or longer than 65535 bytes) and a message larger
// than Config.MaxMessageSize. A broker that is not connected, a connection
// lost before the acknowledgement arrived and an acknowledgement that did not
// arrive within Config.AckTimeout are [sink.Unavailable]. A cancelled context
// fails the messages without a result with the context's error.
package mqttsink
