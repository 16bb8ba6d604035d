// Package outboxsqlite is the SQLite driver of the outbox, in pure Go on
// modernc.org/sqlite (driver name "sqlite"): it writes events inside a
// *sql.Tx, migrates the schema, and is the relay's Source and the command
// line's Store.
//
// SQLite serves one writer at a time and many readers. The outbox keeps
// that promise honest:
//
//   - Open sets WAL journal mode (readers never block the writer, nor the
//     writer the readers), a busy timeout (a writer waits for the lock
//     instead of failing), foreign keys, synchronous=FULL and
//     _txlock=immediate (every read-write transaction takes the write lock
//     at BEGIN, so none fails half-way with SQLITE_BUSY while upgrading a
//     read lock).
//   - The relay claims a batch in one short transaction and marks the
//     claimed partitions in the leases table; it holds no transaction open
//     while the batch is published, so the application's writers wait at
//     most for a claim or a finish, never for the broker.
//   - Run one relay process per database file. Leases still work (two
//     Sources in one process never claim the same partition), but the
//     partitions of one file are served by one writer anyway, so a second
//     process adds no throughput.
//   - There is no LISTEN/NOTIFY: a waiting relay reads PRAGMA data_version
//     on a dedicated connection every WatchInterval (10ms), which notices a
//     commit by any connection or process without reading a table.
//
// Delayed events (outbox.Event.DeliverAt) wait in the table's deliver_at
// column (schema version 3; UTC text 'YYYY-MM-DD HH:MM:SS.SSS' like every
// time column, a DeliverAt rounded up to the millisecond) until the
// database clock reaches it, and so do the later events of their
// aggregates; the same holds for a row whose deliver_at or next_attempt_at
// a plain-SQL writer or an operator set. The partial index
// <table>_waiting holds only the unpublished rows with either column set,
// so an undelayed INSERT does not pay for it.
package outboxsqlite
