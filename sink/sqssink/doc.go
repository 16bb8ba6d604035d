// Package sqssink publishes outbox messages to Amazon SQS queues with the
// AWS SDK for Go v2.
//
// Each message goes to Config.Queue (a queue name or URL) or, when that is
// empty, to the queue Message.Destination names; names are looked up once
// with GetQueueUrl (in the account Config.Owner when set). The body is the
// JSON envelope of sink.Envelope, as Kinesis and MQTT carry it ("id",
// "destination", "key", "headers", "payload" or "payload_base64"), and
// the String message attribute "id" holds the event id, for consumers
// and filters that do not parse the body.
//
// # FIFO and standard queues
//
// A queue whose name ends in ".fifo" gets MessageGroupId = Message.Key
// (the aggregate id; the event id when the key is empty) and
// MessageDeduplicationId = Message.ID: SQS keeps one aggregate's events in
// commit order and drops a copy the relay sends again within its
// five-minute de-duplication window. A key or id that is not 1 to 128
// printable ASCII characters is replaced by "sha256:" and its hex SHA-256,
// the same for every event of the aggregate. A standard queue keeps no
// order and may deliver a message twice: consumers drop duplicates by
// "id" (the inbox package does).
//
// # Batches, partial failures and order
//
// Publish sends SendMessageBatch requests of up to 10 messages and 256 KiB.
// A request carries at most one message per FIFO message group: a later
// message of a group waits until the earlier one succeeded, so that a
// failed entry is never overtaken by a later one of its group. Messages to
// standard queues share requests freely. Each entry has its own result: an
// entry that failed for a passing reason (a service fault, throttling, KMS)
// is sent again, after a short back-off, up to Config.MaxRetries times
// within the call; then it, and the later messages of its group, fail
// transiently and the relay retries them.
//
// # Errors
//
// A message over 256 KiB (body and attributes) or addressed to an invalid
// queue name fails with [sink.Permanent] before it is sent, and so does an
// entry SQS refuses as the sender's fault (invalid characters in the body,
// for example); a request SQS refuses for its content is split into single
// messages so that only the culprit fails. A missing queue, access denied,
// throttling and 5xx answers are transient (fix it; the relay's retry
// delivers); a service that cannot be reached is [sink.Unavailable].
//
// # Connecting
//
// [Dial] takes sqs://[QUEUE]?region=REGION[&endpoint=URL][&owner=ACCOUNT]
// and loads the SDK's usual configuration: credentials from the
// environment, shared files or the instance role, and the endpoint
// override AWS_ENDPOINT_URL_SQS (or endpoint= in the URL, for a local
// SQS). Without QUEUE each message goes to the queue its destination
// names. [New] takes a client built by the caller.
package sqssink
