// Package inboxsql is the database/sql driver of the inbox, for PostgreSQL
// (pgx's stdlib, lib/pq), SQLite (modernc.org/sqlite, or any driver for
// SQLite 3.35 or newer) and MySQL 8 / MariaDB 10.6+
// (github.com/go-sql-driver/mysql). It records events inside a *sql.Tx and
// migrates the inbox tables.
//
// On SQLite, open the database in WAL mode with a busy timeout and
// immediate transactions, so that two consumers handling the same event
// wait for each other instead of failing with SQLITE_BUSY:
//
//	db, err := sql.Open("sqlite", "file:app.db?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_txlock=immediate")
//	drv, err := inboxsql.New(db, inboxsql.SQLite)
//
// On MySQL and MariaDB the tables are InnoDB; an empty schema is the
// connection's current database (the DSN's). A concurrent copy of an event
// waits on the first one's unique key. Leave the DSN's clientFoundRows off:
// with it, MySQL reports a duplicate as a changed row, and the driver
// refuses to work (it checks once, on its first new event).
//
//	db, err := sql.Open("mysql", "app:secret@tcp(127.0.0.1:3306)/app?parseTime=true")
//	drv, err := inboxsql.New(db, inboxsql.MySQL)
package inboxsql
