package main

import (
	"context"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/workload"
)

// The binary log tailing relay (--source binlog, docs/binlog.md) against
// the test MariaDB (row-based binary log: `bash .ci/test --setup-only`)
// and NATS JetStream, as a real relay process.

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

// TestMariaDBBinlogKilledMidStreamLosesNothing SIGKILLs the binlog relay
// three times while writers commit and roll back, restarts it each time
// (the next waits for the killed one's lease to expire), and checks that
// every committed event reached the stream, in order, and nothing rolled
// back did.
func TestMariaDBBinlogKilledMidStreamLosesNothing(t *testing.T) {
	t.Parallel()
	s := newMySQLScenario(t)
	wait := writeMySQLAsync(t, s.mysqlTarget, workload.Config{Aggregates: 40, Transactions: 1500, Writers: 6, RollbackPct: 10})
	kills := 0
	for round := range 3 {
		p := startRelay(t, s.args("--source", "binlog")...)
		testenv.WaitStreamMsgs(t, s.scenario.stream, uint64(100*(round+1)), 90*time.Second)
		p.kill()
		kills++
	}
	startRelay(t, s.args("--source", "binlog")...)
	res := wait()
	s.check(t, res, kills*inFlight)
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
