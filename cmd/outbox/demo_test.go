package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
)

// reportLine reads one counter of the demo's report.
func reportLine(t *testing.T, out, name string) int {
	t.Helper()
	m := regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(name) + ` +(\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no %q in the report:\n%s", name, out)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// checkDemo asserts a demo run's report: every committed event published and
// applied once, in order, nothing lost or invented, the injected duplicates
// suppressed, the relay crashed once.
func checkDemo(t *testing.T, out, errOut string, code int) {
	t.Helper()
	if code != 0 {
		t.Fatalf("demo exited %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	checkDemoCounts(t, out, 40)
}

// checkDemoCounts asserts the report of a demo of orders orders.
func checkDemoCounts(t *testing.T, out string, orders int) {
	t.Helper()
	committed := reportLine(t, out, "events committed")
	if committed != orders*3 {
		t.Errorf("events committed = %d, want %d", committed, orders*3)
	}
	for _, c := range []string{"events published", "events consumed"} {
		if n := reportLine(t, out, c); n != committed {
			t.Errorf("%s = %d, want %d", c, n, committed)
		}
	}
	for _, c := range []string{"lost", "phantoms", "double effects", "order violations"} {
		if n := reportLine(t, out, c); n != 0 {
			t.Errorf("%s = %d, want 0", c, n)
		}
	}
	if n := reportLine(t, out, "duplicates suppressed"); n < 3 {
		t.Errorf("duplicates suppressed = %d, want at least the 3 injected", n)
	}
	if !regexp.MustCompile(`SIGKILLed 1 time`).MatchString(out) {
		t.Errorf("the relay was not crashed:\n%s", out)
	}
}

func TestDemoOnTheEmbeddedDefault(t *testing.T) {
	t.Parallel()
	out, errOut, code := runBinary(t, raceBin, nil, "demo", "--orders", "40", "--rate", "200")
	checkDemo(t, out, errOut, code)
}

func TestDemoOnPostgreSQLAndNATS(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t) // fails clearly when PostgreSQL is down
	testenv.JetStream(t)
	demoTables := func() (n int) {
		err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE 'demo\_%'`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := demoTables()
	out, errOut, code := runBinary(t, raceBin, nil, "demo", "--orders", "40", "--rate", "200", "--db", dbURL(), "--sink", testenv.NATSURL())
	checkDemo(t, out, errOut, code)
	if after := demoTables(); after != before {
		t.Errorf("the demo left %d table(s) behind", after-before)
	}
}

func TestDemoOnMariaDB(t *testing.T) {
	t.Parallel()
	mysqlDB(t, mysqlServerURL()) // fails clearly when MariaDB is down
	out, errOut, code := runBinary(t, raceBin, nil, "demo", "--orders", "40", "--rate", "200", "--db", mysqlServerURL(), "--sink", testenv.NATSURL())
	checkDemo(t, out, errOut, code)
}

// TestDemoServeKeepsTheRelayUp runs the demo with --serve: after the report
// the relay must keep serving /metrics and `outbox status` must work against
// the demo's database; SIGINT then ends it with status 0 and removes the
// demo's files.
func TestDemoServeKeepsTheRelayUp(t *testing.T) {
	t.Parallel()
	addr := freeAddr(t)
	cmd := exec.Command(raceBin, "demo", "--orders", "20", "--rate", "200", "--serve", "--metrics-addr", addr)
	var out testenv.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	statusCmd := regexp.MustCompile(`outbox (status --db (\S+) --schema (\S+) --table (\S+))`)
	var m []string
	await.Eventually(t, 2*time.Minute, func() error {
		if m = statusCmd.FindStringSubmatch(out.String()); m == nil {
			return fmt.Errorf("no report and serve notice:\n%s", out.String())
		}
		return nil
	})
	checkDemoCounts(t, out.String(), 20)
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("metrics while serving: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "outbox_published_total") {
		t.Fatalf("metrics without outbox_published_total:\n%s", body)
	}
	stdout, stderr, code := run(t, nil, "status", "--db", m[2], "--schema", m[3], "--table", m[4], "--json")
	if code != 0 || !strings.Contains(stdout, `"backlog":0,`) {
		t.Fatalf("status against the served demo: exit %d\n%s%s", code, stdout, stderr)
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("demo --serve after SIGINT: %v\n%s", err, out.String())
	}
	dbFile := strings.TrimPrefix(m[2], "sqlite://")
	if _, err := os.Stat(filepath.Dir(dbFile)); !os.IsNotExist(err) {
		t.Fatalf("the demo's directory %s is still there (%v)", filepath.Dir(dbFile), err)
	}
}
