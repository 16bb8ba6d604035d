// Package mqttconsumer subscribes to MQTT 3.1.1 topics with a persistent
// session and handles every message through an inbox, on the shared engine
// of package consumer: the effect and the inbox row commit in one
// transaction, and only then is the message acknowledged (PUBACK).
//
// It reads what mqttsink publishes by default: the JSON envelope (package
// sink's Envelope) with the event id, the destination, the key (the
// aggregate id), the headers and the payload. A message that is not such
// an envelope (mqttsink's Config.RawPayload, or another publisher) has no
// event id and goes to the inbox's dead letters, payload as received.
// MQTT 3.1.1 carries no event type: Message.Type stays empty.
//
// # The guarantee
//
//   - Subscriptions are QoS 1 and the session is persistent (clean session
//     off, under Config.ClientID): while the consumer is away, the broker
//     keeps the messages of its subscriptions for it, and delivers them,
//     with the ones it had sent and not seen acknowledged, when the same
//     client id connects again. Mosquitto keeps a persistent session
//     forever by default (persistent_client_expiration) and queues up to
//     max_queued_messages (1000) messages per client: beyond that it drops
//     them. Raise that limit to the longest absence you must survive.
//   - Acknowledgements are manual (Paho's SetAutoAckDisabled): the PUBACK
//     of a message is sent only after its effect and inbox row committed,
//     or after its dead letter was recorded. MQTT does not confirm a
//     PUBACK, and Paho drops one sent after its connection was lost: then
//     the broker sends the message again when the client reconnects, and
//     the inbox suppresses it. So effects happen once; acknowledgements
//     are at least once.
//   - A message is acknowledged only on the connection it came on. When
//     the connection drops, the messages it brought are abandoned (their
//     retries end); the broker sends them again after the reconnect.
//   - MQTT cannot hand a message back: at stop, the messages not finished
//     stay unacknowledged in the session and come again at the next
//     connect of the same client id, not to another client.
//   - Messages of one topic arrive in order, and the consumer keeps the
//     order per aggregate (key); Mosquitto sends at most
//     max_inflight_messages (20) unacknowledged at once, which also bounds
//     the consumer's parallelism.
//
// One client id is one consumer: two processes with the same id take the
// session from each other. Several instances each need their own id and
// then each receive every message (MQTT 3.1.1 has no shared
// subscriptions; the inbox makes the effect happen once per consumer name,
// so give them one inbox Consumer name only if one effect is wanted).
package mqttconsumer
