package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/cmd/outbox/internal/bench"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/internal/workload"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxpgx/cdc"
)

// sources are the relay's sources the shared correctness tests run
// against (testenv.Sources says which tests run where, and why some do
// not run against log tailing).
var sources = testenv.Sources

// forSources runs test once per source (testenv.ForSources).
var forSources = testenv.ForSources

// testDB is where a test's outbox table lives and how a relay reads it.
type testDB struct {
	pool *pgxpool.Pool
	// flags are --db, --schema and --table; relayFlags the relay's
	// --source flags on top.
	flags, relayFlags []string
}

// migratedFor migrates a fresh table for a relay with source src. For
// log tailing it is in testenv.CDCDatabase, and `outbox migrate --cdc`
// creates its publication and slot, and the workload's table is made,
// while no other log-tailing test runs DDL (testenv.CDCTurn); the slot is
// dropped when the test ends.
func migratedFor(t *testing.T, src string) (outboxdriver.Table, testDB) {
	t.Helper()
	if src == "poll" {
		tb, flags := migrated(t)
		return tb, testDB{pool: testenv.Pool(t), flags: flags}
	}
	pool := testenv.CDCPool(t)
	tb := testenv.Table(t, pool)
	flags := []string{"--db", testenv.CDCDatabaseURL(t), "--schema", tb.Schema, "--table", tb.Name}
	drv := outboxpgx.New(pool)
	testenv.CDCTurn(t, pool, func() {
		if _, stderr, code := run(t, nil, append([]string{"migrate", "--cdc"}, flags...)...); code != 0 {
			t.Fatalf("migrate --cdc failed: %s", stderr)
		}
		// The slot is made: dropped at the end even when the test fails
		// from here on, after the relays were killed (registered before
		// them; cleanups run last-in first-out).
		testenv.DropSlotAtEnd(t, pool, func(ctx context.Context) error {
			_, err := drv.MigrateDown(ctx, tb, 0)
			return err
		})
		if _, err := workload.Run(context.Background(), pool, tb, workload.Config{}); err != nil {
			t.Fatal(err)
		}
	})
	// A first relay streams the new slot once and stops, as a deployment's
	// first relay does, so that the tests see the steady state.
	first := startRelay(t, append(append([]string{}, flags...), "--source", "cdc", "--sink", "stdout:", "--lease-ttl", "1s")...)
	await.Eventually(t, 60*time.Second, func() error {
		var streamed bool
		err := pool.QueryRow(context.Background(), `SELECT drained AND EXISTS (SELECT 1 FROM pg_replication_slots s
			JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1 AND r.state IN ('catchup', 'streaming')) FROM `+tb.Qualified("_cdc"), cdc.DefaultSlot(tb)).Scan(&streamed)
		if err != nil || !streamed {
			return fmt.Errorf("the first relay did not start streaming (%v); stderr:\n%s", err, first.stderr.String())
		}
		return nil
	})
	if err := first.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := first.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("the first relay exited with %d; stderr:\n%s", code, first.stderr.String())
	}
	return tb, testDB{pool: pool, flags: flags, relayFlags: []string{"--source", "cdc"}}
}

// outbox status shows a table's replication slot, in text and in JSON.
func TestStatusShowsTheCDCSlot(t *testing.T) {
	t.Parallel()
	tb, db := migratedFor(t, "cdc")
	stdout, stderr, code := run(t, nil, append([]string{"status", "--json"}, db.flags...)...)
	if code != 0 {
		t.Fatalf("status --json: %s", stderr)
	}
	var js statusJSON
	if err := json.Unmarshal([]byte(stdout), &js); err != nil {
		t.Fatalf("status --json = %s: %v", stdout, err)
	}
	slot := cdc.DefaultSlot(tb)
	if len(js.CDCSlots) != 1 || js.CDCSlots[0].Slot != slot || !js.CDCSlots[0].Exists || js.CDCSlots[0].Active ||
		js.CDCSlots[0].ConfirmedLSN == "" || js.CDCSlots[0].LagBytes <= 0 {
		t.Fatalf("cdc_slots = %+v, want slot %s, existing, inactive (no relay runs), with a confirmed LSN and retained WAL", js.CDCSlots, slot)
	}
	// The WAL past the confirmed LSN, and (once the first relay recorded
	// it) its table-mode backlog: nothing decoded is pending, and the
	// table's count is exact.
	if js.WALBytesPending == nil || *js.WALBytesPending != js.CDCSlots[0].WALBytesPending || js.CDCSlots[0].WALBytesPending < 0 {
		t.Fatalf("wal_bytes_pending = %v, slot's %d", js.WALBytesPending, js.CDCSlots[0].WALBytesPending)
	}
	if b := js.CDCSlots[0].Backlog; b != nil && (b.Mode != "table" || b.Events != 0 || !js.BacklogExact || js.OldestPendingCommitAt != nil) {
		t.Fatalf("table mode's backlog record %+v, backlog exact %v, oldest pending %v", b, js.BacklogExact, js.OldestPendingCommitAt)
	}
	stdout, stderr, code = run(t, nil, append([]string{"status"}, db.flags...)...)
	if code != 0 || !strings.Contains(stdout, "cdc slot                  "+slot) || !strings.Contains(stdout, "state                   inactive") ||
		!strings.Contains(stdout, "parked events             0") || !strings.Contains(stdout, "WAL not confirmed       ") ||
		!strings.Contains(stdout, "decoded, not published  ") {
		t.Fatalf("status (%d) = %s%s", code, stdout, stderr)
	}
}

// `outbox bench --scenario drain --source cdc` runs its relays as
// processes of this binary (the default): each drain from the WAL, of
// rows and of logical decoding messages, ends once all its events were
// published, and is reported.
func TestBenchDrainsTheWALWithRelayProcesses(t *testing.T) {
	pool := testenv.CDCPool(t)
	testenv.CDCTurn(t, pool, func() {
		stdout, stderr, code := run(t, nil, "bench", "--db", testenv.CDCDatabaseURL(t), "--scenario", "drain", "--source", "cdc",
			"--events", "2000", "--rounds", "1", "--sink", testenv.NATSURL(), "--json")
		if code != 0 {
			t.Fatalf("bench exited with %d; stderr:\n%s", code, stderr)
		}
		got := map[string]bench.Result{}
		for line := range strings.Lines(stdout) {
			var r bench.Result
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				t.Fatalf("a result line that is not JSON: %q: %v", line, err)
			}
			got[r.Case] = r
		}
		for _, c := range []string{bench.CaseDrainRelay, bench.CaseDrainRelayCDC, bench.CaseDrainRelayCDCMessages} {
			r, ok := got[c]
			if !ok || r.Ops != 2000 || len(r.RoundsPerSecond) != 1 || r.Delivery == nil || r.Delivery.ProcessCores <= 0 {
				t.Fatalf("case %s: %+v (found %v), want 2000 events drained once by a relay process; stdout:\n%s", c, r, ok, stdout)
			}
		}
	})
}

// outbox cdc drop removes the slot that outbox migrate --cdc made, keeps
// the table, and a second drop finds nothing left to drop but succeeds;
// on a database other than PostgreSQL it says log tailing needs it.
func TestCDCDropCommand(t *testing.T) {
	tb, db := migratedFor(t, "cdc")
	var stdout, stderr string
	var code int
	testenv.CDCTurn(t, db.pool, func() {
		stdout, stderr, code = run(t, nil, append([]string{"cdc", "drop"}, db.flags...)...)
	})
	if code != 0 || !strings.Contains(stdout, "dropped replication slot "+cdc.DefaultSlot(tb)) {
		t.Fatalf("outbox cdc drop: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	var slots int
	if err := db.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, cdc.DefaultSlot(tb)).Scan(&slots); err != nil || slots != 0 {
		t.Fatalf("after outbox cdc drop: %d slots, %v", slots, err)
	}
	if _, stderr, code := run(t, nil, append([]string{"status"}, db.flags...)...); code != 0 {
		t.Fatalf("outbox status after the drop: exit %d: %s", code, stderr)
	}
	testenv.CDCTurn(t, db.pool, func() {
		_, stderr, code = run(t, nil, append([]string{"cdc", "drop"}, db.flags...)...)
	})
	if code != 0 {
		t.Fatalf("a second outbox cdc drop: exit %d: %s", code, stderr)
	}
	failsWithOneLine(t, nil, "log tailing needs PostgreSQL", "cdc", "drop", "--db", "sqlite://"+t.TempDir()+"/x.db")
}

// `outbox migrate --cdc-mode message` (or insert-delete) makes the slot
// without --cdc, since the writers of those modes need it before their
// first event; --cdc-mode table alone makes none.
func TestMigrateInAWriteModeWithoutRowsMakesTheSlot(t *testing.T) {
	pool := testenv.CDCPool(t)
	tb := testenv.Table(t, pool)
	flags := []string{"--db", testenv.CDCDatabaseURL(t), "--schema", tb.Schema, "--table", tb.Name}
	slots := func() int {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, cdc.DefaultSlot(tb)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	testenv.CDCTurn(t, pool, func() {
		if _, stderr, code := run(t, nil, append([]string{"migrate", "--cdc-mode", "table"}, flags...)...); code != 0 {
			t.Fatalf("migrate --cdc-mode table: exit %d: %s", code, stderr)
		}
		if n := slots(); n != 0 {
			t.Fatalf("%d slot(s) after migrate --cdc-mode table, want none", n)
		}
		testenv.DropSlotAtEnd(t, pool, func(ctx context.Context) error {
			_, err := outboxpgx.New(pool).MigrateDown(ctx, tb, 0)
			return err
		})
		stdout, stderr, code := run(t, nil, append([]string{"migrate", "--cdc-mode", "message"}, flags...)...)
		if code != 0 || !strings.Contains(stdout, "replication slot "+cdc.DefaultSlot(tb)) {
			t.Fatalf("migrate --cdc-mode message: exit %d, stdout %q, stderr %q", code, stdout, stderr)
		}
	})
	if n := slots(); n != 1 {
		t.Fatalf("%d slot(s) after migrate --cdc-mode message, want 1", n)
	}
}
