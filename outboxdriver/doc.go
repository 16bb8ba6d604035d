// Package outboxdriver is the seam between the outbox core and a database.
//
// It is not a stable API: it serves the drivers of this module (outboxpgx,
// outboxsql, outboxmysql, outboxsqlite) and may change in any release.
// Applications use a driver's New and the root package outbox; only code
// that writes a driver of its own imports this package.
//
// One driver object per database is all a program needs: it is the
// Writer (inserting events inside the caller's transaction), the Store
// (migrations, status, dead letters, audit) and it makes the relay's
// Source (claiming unpublished events and recording what became of them).
// The relay engine only ever talks to a Source, so it never imports a
// database client.
//
// What every driver shares lives here once: table names and their
// validation, partition bounds, the source configuration's defaults, the
// fence of a batch, the split of a batch's outcome into the statements it
// needs, the bounded error text, and the header parsing. A driver keeps
// only what its SQL dialect forces.
package outboxdriver
