package main

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/outboxkit/outbox/internal/testenv"
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
	committed := reportLine(t, out, "events committed")
	if committed != 40*3 {
		t.Errorf("events committed = %d, want 120", committed)
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
	out, errOut, code := run(t, nil, "demo", "--orders", "40", "--rate", "200")
	checkDemo(t, out, errOut, code)
}

func TestDemoOnPostgreSQLAndNATS(t *testing.T) {
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
	out, errOut, code := run(t, nil, "demo", "--orders", "40", "--rate", "200", "--db", dbURL(), "--sink", testenv.NATSURL())
	checkDemo(t, out, errOut, code)
	if after := demoTables(); after != before {
		t.Errorf("the demo left %d table(s) behind", after-before)
	}
}

func TestDemoOnMariaDB(t *testing.T) {
	mysqlDB(t, mysqlServerURL()) // fails clearly when MariaDB is down
	out, errOut, code := run(t, nil, "demo", "--orders", "40", "--rate", "200", "--db", mysqlServerURL(), "--sink", testenv.NATSURL())
	checkDemo(t, out, errOut, code)
}
