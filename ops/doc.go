// Package ops holds the operations every surface of the outbox shares:
// the command line's `outbox dlq` and the web console call the same
// functions, so the two can never disagree about who may do what, or
// about what is recorded.
//
// Every operation takes the Actor who asks (a name and a Role), checks
// that the role allows it, calls the Store, and leaves an audit row: the
// Store writes the rows of a dead-letter action in the same transaction
// as the change, and ops writes the rows of everything else that must be
// on record (a refused request, a login). A refusal is itself audited.
//
// Roles:
//
//   - viewer reads everything: the overview, dead letters (payloads with
//     the sensitive paths masked: those stored with the table, the
//     configured ones and the contracts') and the audit.
//   - operator reads everything and acts: retries and discards dead
//     letters (one at a time or a failure group), pauses and resumes the
//     relays by scope, releases held aggregates, reveals a masked payload
//     field (audited before it is shown), and stores or removes masked
//     paths with the table (which only the owner's database role may
//     write: the command line's `outbox mask`).
//   - approver reads everything and approves or rejects what other users
//     request (two-person approval): a replay of published events kept in
//     the table, or the repair of a dead letter's payload and headers. An
//     Executor carries out approved requests in batches, each with its
//     cursor in one transaction, so a crash leaves a request resumable.
//
// The audit is append-only: the database refuses UPDATE and DELETE on it
// (and TRUNCATE on PostgreSQL), except through PruneAudit (`outbox audit
// prune`), which records what it deleted.
//
// Every driver's Store (outboxdriver.Store: outboxpgx, outboxmysql,
// outboxsqlite) offers every operation.
package ops
