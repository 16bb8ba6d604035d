// Package outboxmysql is the MySQL 8 / MariaDB 10.6+ driver of the outbox
// on database/sql with github.com/go-sql-driver/mysql: it writes events
// inside the caller's *sql.Tx, migrates the schema, and is the relay's
// Source (claim with FOR UPDATE SKIP LOCKED, leases judged by the
// database clock, fenced by epochs) and the command line's Store.
//
// The outbox table's schema is the MySQL database; an empty schema means
// the connection's current database. MySQL has no LISTEN/NOTIFY, so an
// idle relay looks for new events every poll interval: that interval is
// the latency floor when the outbox is quiet. Use interpolateParams=true
// in the DSN: without it every statement with arguments costs a prepare
// and a close round trip more.
//
// Delayed events (outbox.Event.DeliverAt) wait in the table's deliver_at
// column (DATETIME(6), UTC; schema version 4) until UTC_TIMESTAMP(6)
// reaches it, and so do the later events of their aggregates; the same
// holds for a row whose deliver_at or next_attempt_at a plain-SQL writer
// or an operator set. No index serves this: the claim reads an
// aggregate's earlier rows anyway (see Source.Claim).
package outboxmysql
