// Package kinesissink publishes outbox messages to Amazon Kinesis Data
// Streams with the AWS SDK for Go v2.
//
// Each message becomes one record on Config.Stream (or, when that is empty,
// on the stream named by Message.Destination). The partition key is
// Message.Key, the aggregate id, so one aggregate's events land on one
// shard; a message without a key uses its id. Kinesis records have no
// headers, so the data is the JSON envelope of sink.Envelope, as MQTT uses it ("id",
// "destination", "key", "headers", "payload" or "payload_base64").
//
// # Batches, partial failures and order
//
// Publish sends PutRecords requests of up to 500 records and 5 MiB. A
// request carries at most one record per stream and partition key: a later
// record of a key waits until the earlier one succeeded, because PutRecords
// may store a record after a failed one of the same request. Records that
// fail on their own (ProvisionedThroughputExceededException,
// InternalFailure, KMS throttling) are retried, after a short back-off, up
// to Config.MaxRetries times within the call; then they, and the later
// records of their key, fail transiently and the relay retries them.
//
// # Errors
//
// A record over 1 MiB (partition key included), a key over 256 characters
// or an invalid stream name fails with [sink.Permanent] before it is sent.
// A missing stream is transient (create it; the relay's retry delivers); a
// service that cannot be reached is [sink.Unavailable].
//
// # De-duplication
//
// Kinesis does not de-duplicate: a record put again (after a lost answer or
// a crash) is stored again, with a new sequence number and the same "id".
// Consumers drop duplicates by "id", for example with the inbox package.
//
// # Connecting
//
// [Dial] takes kinesis://STREAM?region=REGION[&endpoint=URL] and loads the
// SDK's usual configuration: credentials from the environment, shared
// files or the instance role, and the endpoint override
// AWS_ENDPOINT_URL_KINESIS (or endpoint= in the URL). [New] takes a client
// built by the caller.
package kinesissink
