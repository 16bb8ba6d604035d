// Package kinesisconsumer reads every shard of an Amazon Kinesis data
// stream (AWS SDK for Go v2) and handles each record through an inbox, on
// the shared engine of package consumer: the effect and the inbox row
// commit in one transaction, and only then does the record count toward
// the shard's checkpoint.
//
// It reads what kinesissink writes: the JSON envelope of sink.Envelope
// (event id, destination, key = the partition key and aggregate id,
// headers, payload). A record that is not such an envelope has no event id
// and goes to the inbox's dead letters as received.
//
// # Checkpoints
//
// Kinesis keeps no consumer position: the consumer saves, in a
// [Checkpoints] store you provide (a table in the inbox's database, for
// example), the sequence number of the highest record of each shard below
// which every record was handled (committed or dead-lettered), every
// Config.CheckpointInterval and at stop. At start each shard is read after
// its checkpoint, or from its oldest record (TRIM_HORIZON) without one.
// Records handled after the last saved checkpoint are read again after a
// restart and suppressed by the inbox; keep the inbox's Retention longer
// than the stream's retention period and no record is ever applied twice.
//
// # Shards and resharding
//
// The shard list is read at start and every Config.ShardSyncInterval. A
// shard whose parents (after a split or a merge) are not finished waits:
// a parent is finished once it was read to its end and all its records
// were handled, which is recorded as the checkpoint ShardEnd. So an
// aggregate's records, which move to a child shard with their partition
// key, stay in order across a reshard.
//
// # Order and instances
//
// Records of one partition key (the aggregate) are handled one at a time,
// in shard order. One Consumer reads every shard: this package has no
// lease table to share shards between instances (as the Kinesis Client
// Library does with DynamoDB). Run one instance per stream, or several
// with the inbox making the effects once (each reads every record).
package kinesisconsumer
