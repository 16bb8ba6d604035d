// Package mysqlbinlog is a minimal MySQL/MariaDB replication client: it
// speaks the client protocol on a net.Conn (handshake v10,
// mysql_native_password and the fast path of caching_sha2_password), registers
// as a replica (COM_REGISTER_SLAVE), asks for the binary log from a file and
// position, a MariaDB GTID position (@slave_connect_state) or a MySQL GTID set
// (COM_BINLOG_DUMP_GTID), and decodes the events a log-tailing relay needs:
// format description, rotate, table map, rows events (v1 and v2), XID, query,
// GTID events of both servers, heartbeats. CRC32 checksums are verified: a
// corrupted event is an error.
//
// It is written from the MySQL and MariaDB replication protocol
// documentation and is internal: its API is not promised.
package mysqlbinlog
