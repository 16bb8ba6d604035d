// Package outboxdriver is the seam between the outbox core and a database:
// what a driver implements, and the types that cross it.
//
// It is experimental: it serves the drivers of this module (outboxpgx,
// outboxsql, outboxmysql, outboxsqlite) and may change in any release
// (docs/api.md). Applications use a driver's New, the root package outbox
// (whose Table, SourceConfig and MigrateOptions name the types defined
// here) and package relay; they never need to import this package.
//
// A driver implements:
//
//   - Writer, the write path inside the caller's transaction; Pooled,
//     Migrate and Insert on a pool of its own; TxMigrator and Queuer where
//     the database can.
//   - Store, the database as the engine's tools see it: migrations,
//     status, dead letters, pauses, the audit and requests; it makes the
//     relay's Source.
//   - Source and Batch: claiming unpublished events and recording what
//     became of them. The relay engine only ever talks to a Source, so it
//     never imports a database client.
//
// Every driver of this module passes one conformance suite
// (outboxdrivertest). The package imports nothing of the module.
package outboxdriver
