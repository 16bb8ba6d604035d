// Package pubsubconsumer receives the messages of a Google Cloud Pub/Sub
// subscription (cloud.google.com/go/pubsub/v2) and handles each through an
// inbox, on the shared engine of package consumer: the effect and the
// inbox row commit in one transaction, and only then is the message
// acknowledged.
//
// It reads what pubsubsink publishes: the event id from the attribute
// "id", the aggregate id from the ordering key, the headers from the other
// attributes (the first value of a repeated one, listed in
// "outbox-repeated"), and the destination from the attribute
// "destination" (pubsubsink's fixed Config.Topic) or else the
// subscription's topic name, so a topic outbox.event.<type> gives the
// aggregate type. Pub/Sub carries no event type: Message.Type stays empty.
//
// # Delivery
//
//   - Ordering keys: with message ordering enabled on the subscription,
//     Pub/Sub delivers one key's messages in publish order, and the client
//     hands the next one over only once the callback for the previous one
//     returned. The callback returns only once its message is acknowledged
//     or handed back, so an aggregate's messages are handled one at a time,
//     in order, retries included.
//   - Ack deadline: while a message is worked on, retries included, the
//     client extends its ack deadline, for up to Config.MaxExtension
//     (default 60 minutes); keep the engine's retries shorter.
//   - Acknowledgement: AckWithResult after the commit (or the dead
//     letter), so that on a subscription with exactly-once delivery a
//     refused acknowledgement is logged; the message then comes again and
//     the inbox suppresses it.
//   - At stop, the messages not finished are nacked: Pub/Sub redelivers
//     them at once (and, with ordering, the key's later messages behind
//     them). A subscription's dead-letter policy counts deliveries
//     (Message.DeliveryAttempt), and those count toward MaxAttempts; give
//     it a max_delivery_attempts above MaxAttempts, or Pub/Sub moves the
//     message to its dead-letter topic before the inbox dead-letters it.
//   - A consumer that died holds its messages until their ack deadline
//     passes: Config.AckExtension bounds each extension, and so how soon
//     another consumer receives them.
//
// Stop waits for the client's Receive to return. While the service is
// unreachable the client keeps trying to reopen its stream and Receive
// does not return, so neither does Stop; it returns once the service
// answers again or the client's connection is closed.
package pubsubconsumer
