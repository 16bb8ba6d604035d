// Package outboxsql is the PostgreSQL driver of the outbox for database/sql:
// it writes events inside a *sql.Tx opened on any PostgreSQL driver
// (pgx's stdlib, lib/pq), or in a transaction of its own, and migrates the
// schema.
//
// The relay and the operator's tools run on outboxpgx, over a pgx pool of
// their own on the same database: a relay waits for commits with LISTEN
// on a connection it holds for that, and sends a claim's statements and a
// batch's outcome as one pipelined round trip each, neither of which
// database/sql can express. The table, its schema and its migrations are
// the same, so a service that writes through database/sql is relayed by
// `outbox relay` or an embedded relay on outboxpgx unchanged.
package outboxsql
