package main

import (
	"context"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/workload"
)

// The binary log tailing relay (--source binlog, docs/binlog.md) against
// the test MariaDB (row-based binary log: `bash .ci/test --setup-only`)
// and NATS JetStream, as a real relay process. The MariaDB process tests
// of mysql_test.go run against it too (forMySQLSources).

// TestMariaDBBinlogRelayToNATS: a binlog relay publishes every committed
// event of concurrent writers, in commit order per aggregate, and nothing
// of a rolled-back transaction; the backlog drains to 0.
func TestMariaDBBinlogRelayToNATS(t *testing.T) {
	t.Parallel()
	s := newMySQLScenario(t)
	startRelay(t, s.args("--source", "binlog")...)
	res, err := mysqlWorkload(context.Background(), s.db, s.tb, workload.Config{
		Aggregates: 50, Transactions: 800, Writers: 8, RollbackPct: 10, LatePct: 2, LateDelay: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	s.check(t, res, 0)
}

// TestBinlogFlagsNeedTheirSource: --binlog-* flags go with --source
// binlog, and binlog tailing needs MySQL or MariaDB.
func TestBinlogFlagsNeedTheirSource(t *testing.T) {
	t.Parallel()
	m := mysqlMigrated(t)
	failsWithOneLine(t, []string{"OUTBOX_DB=", "OUTBOX_SINK="}, "--binlog-mode goes with --source binlog",
		append(append([]string{"relay"}, m.flags...), "--sink", "stdout:", "--binlog-mode", "insert-delete")...)
	failsWithOneLine(t, []string{"OUTBOX_DB=", "OUTBOX_SINK="}, "--binlog-mode: unknown binlog mode",
		append(append([]string{"relay"}, m.flags...), "--sink", "stdout:", "--source", "binlog", "--binlog-mode", "both")...)
}
