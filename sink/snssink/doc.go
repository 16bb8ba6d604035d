// Package snssink publishes outbox messages to Amazon SNS topics with the
// AWS SDK for Go v2.
//
// Each message goes to Config.Topic (a topic name or ARN) or, when that is
// empty, to the topic Message.Destination names. A name becomes the ARN
// arn:PARTITION:sns:REGION:ACCOUNT:NAME with the client's region and
// Config.Account. The message is the JSON envelope of sink.Envelope, as
// Kinesis, MQTT and the SQS sink carry it ("id", "destination", "key",
// "headers", "payload" or "payload_base64"), and the String message
// attribute "id" holds the event id, for subscription filter policies and
// consumers that do not parse the message. Subscribe SQS queues with raw
// message delivery to receive the envelope itself rather than SNS's
// notification around it.
//
// # FIFO and standard topics
//
// A topic whose name ends in ".fifo" gets MessageGroupId = Message.Key
// (the aggregate id; the event id when the key is empty) and
// MessageDeduplicationId = Message.ID: SNS delivers one aggregate's events
// in commit order to its FIFO subscriptions and drops a copy the relay
// publishes again within five minutes. A key or id that is not 1 to 128
// printable ASCII characters is replaced by "sha256:" and its hex
// SHA-256. A standard topic keeps no order and may deliver a message
// twice: consumers drop duplicates by "id" (the inbox package does).
//
// # Batches, partial failures and order
//
// Publish sends PublishBatch requests of up to 10 messages and 256 KiB. A
// request carries at most one message per FIFO message group: a later
// message of a group waits until the earlier one succeeded. Messages to
// standard topics share requests freely. Each entry has its own result: an
// entry that failed for a passing reason (a service fault, throttling, KMS)
// is published again, after a short back-off, up to Config.MaxRetries
// times within the call; then it, and the later messages of its group,
// fail transiently and the relay retries them.
//
// # Errors
//
// A message over 256 KiB (message and attributes) or addressed to an
// invalid topic name or ARN fails with [sink.Permanent] before it is sent,
// and so does an entry SNS refuses as the sender's fault; a request SNS
// refuses for its content is split into single messages so that only the
// culprit fails. A missing topic, access denied, throttling and 5xx answers
// are transient (fix it; the relay's retry delivers); a service that
// cannot be reached is [sink.Unavailable].
//
// # Connecting
//
// [Dial] takes sns://[TOPIC]?region=REGION[&account=ACCOUNT][&endpoint=URL]
// and loads the SDK's usual configuration: credentials from the
// environment, shared files or the instance role, and the endpoint
// override AWS_ENDPOINT_URL_SNS (or endpoint= in the URL, for a local
// SNS). Without account= it asks STS for the caller's account once. [New]
// takes a client built by the caller.
package snssink
