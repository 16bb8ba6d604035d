package testenv

import "testing"

// Sources are the relay's sources the shared correctness tests run
// against: the polling relay ("poll") and log tailing ("cdc", relay
// --source cdc). The tests of cmd/outbox (real relay processes) and of
// package relay (an in-process relay) take their source from ForSources;
// each package makes a table ready for a source its own way.
//
// Run against both: kills at named points, a killed and restarted relay,
// three relays churning, a paused owner fenced, fail-over within two
// TTLs, a broker outage (no attempt spent), a poison event (dead letter
// with its cause, hold, dlq retry and discard), database connections
// terminated (cmd/outbox); commits published and rollbacks never, a late
// commit, a plain SQL insert, an oversized event dead-lettered while the
// others flow, a failing broker spending no attempt, Stop finishing the
// batch in flight, connections killed, two relays on one table (relay).
// outboxpgx's TestOneHangingAggregateDoesNotStopTheOthers runs against
// both too; log tailing has cases of its own besides (outboxpgx TestCDC*,
// relayd).
//
// Left to the polling source, because they check what log tailing does
// not have:
//   - outboxdrivertest: its cases test a Store's own Source (claim
//     SQL, partition leases in the table, SKIP LOCKED over busy
//     partitions, cleanup, LISTEN/NOTIFY waits); a CDC source claims from
//     memory under one slot lease, and drivers other than pgx have none;
//   - the wake-up tests (package relay's wakeups and
//     TestSteadyFlowSparesTheWritersTheNotify): LISTEN/NOTIFY and the
//     writers' NOTIFY; the stream itself wakes a log-tailing relay;
//   - the attempts column: log tailing keeps attempts in memory, so the
//     tests of an outage allow it one attempt instead, and a spent one
//     would show as a dead letter;
//   - relay.New's validation (TestLifecycle), pause, contract and tracing
//     tests: the engine's own behaviour, the same whatever the source;
//   - a clustered broker's leader lost (cmd/outbox TestClusterLeader*):
//     the fault is on the sink side, which every source shares.
var Sources = []string{"poll", "cdc"}

// EverySource are Sources and the binary log tailing of MySQL/MariaDB
// ("binlog", relay --source binlog, docs/binlog.md). Package relay runs
// these against all three (ForEverySource): commits published and
// rollbacks never, a late commit, a plain SQL insert, an oversized event
// dead-lettered while the others flow, a failing broker spending no
// attempt, Stop finishing the batch in flight, connections killed (the
// replication connection among them), two relays on one table. Their
// binlog table is on the test MariaDB, which needs a row-based binary
// log. cmd/outbox runs the MariaDB process tests (SIGKILL at named points
// and mid-stream, two relays) against polling and the binary log
// (forMySQLSources); outboxmysql/cdc has the binary log's own cases.
var EverySource = []string{"poll", "cdc", "binlog"}

// ForSources runs test once per source of Sources, each as a parallel
// subtest named for it.
func ForSources(t *testing.T, test func(t *testing.T, source string)) {
	t.Helper()
	for _, src := range Sources {
		t.Run(src, func(t *testing.T) {
			t.Parallel()
			test(t, src)
		})
	}
}

// ForEverySource runs test once per source of EverySource, each as a
// parallel subtest named for it.
func ForEverySource(t *testing.T, test func(t *testing.T, source string)) {
	t.Helper()
	for _, src := range EverySource {
		t.Run(src, func(t *testing.T) {
			t.Parallel()
			test(t, src)
		})
	}
}
