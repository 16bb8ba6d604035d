// Package redissink is a [sink.Sink] that appends messages to Redis Streams.
//
// Each message is appended with XADD (entry id "*", chosen by Redis) to the
// stream named Config.StreamPrefix + Destination, as an entry with four
// fields, in this order:
//
//   - "id": Message.ID;
//   - "key": Message.Key (empty when the message has none);
//   - "type": Message.Type, the event type (empty when unknown);
//   - "headers": a JSON object mapping each header name to the array of its
//     values in order, e.g. {"id":["e1"],"type":["order.created"]}; it
//     holds "id" (Message.ID) unless the message has an "id" header of its
//     own, and is "{}" at least. JSON carries only UTF-8, so a message with a
//     header name or value that is not valid UTF-8 fails permanently;
//   - "payload": Message.Value, byte for byte (empty for no payload).
//
// With Config.MaxLen set, every XADD also trims its stream to about that
// many entries (MAXLEN ~ N, which Redis applies in whole macro nodes, so a
// stream keeps at least MaxLen entries and a few more).
//
// Publish sends a batch as one pipeline, one round trip (one per node with a
// cluster client), and reports the reply of each XADD as the message's
// result: nil once Redis appended the entry. What that means for durability
// is Redis's persistence setting (appendonly and appendfsync); Redis
// acknowledges before replicas have the entry.
//
// Redis streams do not de-duplicate: a message published twice is appended
// twice (go-redis sends a pipeline again when its connection failed, up to
// the client's MaxRetries, and the relay publishes failed messages again),
// so consumers de-duplicate by the "id" field. Messages with the same
// Destination are appended in slice order.
//
// Errors are classified without matching their text where go-redis offers a
// typed check, else by the error code Redis prefixes them with:
//
//   - WRONGTYPE (the key exists and holds another type), NOPERM (an ACL
//     denies the command or key), a body over Config.MaxMessageSize and an
//     empty destination are [sink.Permanent];
//   - OOM (maxmemory reached) and other errors Redis replies with are
//     transient;
//   - connection errors, timeouts, a closed client and replies that say
//     the server cannot serve now (LOADING, BUSY, READONLY, MASTERDOWN,
//     CLUSTERDOWN, TRYAGAIN, too many clients, failed authentication) are
//     marked [sink.Unavailable].
//
// Use [Dial] to let the sink own its client, or [New] to publish through a
// redis.UniversalClient the caller manages.
package redissink
