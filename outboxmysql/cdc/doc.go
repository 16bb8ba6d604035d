// Package cdc is log tailing for MySQL and MariaDB: the relay's view of an
// outbox table through the server's binary log (docs/binlog.md). A Source
// registers as a replica, streams the row events of the outbox table and
// hands the inserted rows to the relay in commit order, through the same
// outboxdriver.Source seam as the polling source of package outboxmysql,
// so routing, sinks, retries, dead letters and metrics are the same.
//
//	src, err := cdc.NewSource(db, outbox.Table{}, &cdc.Config{DSN: dsn})
//	if err != nil { ... }
//	defer src.Close()
//	rl, err := relay.New(src, snk, &relay.Config{...})
//
// The replication client is package internal/mysqlbinlog. The package is
// experimental (docs/api.md): it may change in a minor release.
package cdc
