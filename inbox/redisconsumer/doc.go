// Package redisconsumer reads Redis Streams as a member of a consumer
// group and handles every entry through an inbox, on the shared engine of
// package consumer: the effect and the inbox row commit in one
// transaction, and only then is the entry acknowledged (XACK).
//
// It reads what redissink writes: the event id from the field "id", the
// aggregate id from "key", the event type from "type", the headers from
// the JSON object "headers" (the first value of each name) and the payload
// from "payload". The destination is the stream's name without
// Config.StreamPrefix (redissink's prefix), so outbox.event.<type> gives
// the aggregate type.
//
// # Delivery
//
//   - At Start the consumer first takes back the entries its own name
//     still holds pending (XREADGROUP from 0): a consumer restarted under
//     the same Config.Consumer name resumes at once. Then it reads new
//     entries (XREADGROUP >, blocking up to Config.Block).
//   - Every Config.ClaimInterval it takes over entries that another
//     consumer of the group has held unacknowledged for longer than
//     Config.ClaimIdle (XAUTOCLAIM): the entries of a consumer that died.
//     While the engine works on an entry (retries included) it resets the
//     entry's idle time every ClaimIdle/3 (XCLAIM JUSTID to itself), so a
//     live consumer's entries are not taken from it.
//   - The earlier deliveries of a claimed entry (XPENDING's delivery
//     count) count toward MaxAttempts, so an entry that crashes its
//     consumers again and again is dead-lettered too.
//   - At stop, the entries not finished stay pending; the next consumer
//     of the same name takes them at its start, any other after ClaimIdle.
//   - An entry trimmed from the stream (MAXLEN) while pending is skipped
//     and logged.
//
// Order per aggregate holds while one consumer reads a stream; several
// consumers of one group share a stream's entries in no particular order
// (use the inbox's version guard, or one stream per shard of aggregates).
//
// Consumers that left stay listed in the group (XINFO CONSUMERS) until
// removed with XGROUP DELCONSUMER; give instances stable names
// (Config.Consumer) to keep the list short.
package redisconsumer
