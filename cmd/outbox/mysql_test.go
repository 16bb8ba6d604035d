package main

// The command line against MySQL/MariaDB: migrate, status, dlq and the
// relay to NATS JetStream, and the fault tests of the PostgreSQL suite
// (SIGKILL mid-stream, rolled-back transactions, two relays at once)
// against the local MariaDB.

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/internal/workload"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxmysql"
	"github.com/outboxkit/outbox/relay"
)

// envMySQLURL points the tests at another MySQL or MariaDB: a
// mysql://user:pass@host:port/db URL of a user that may create databases.
const envMySQLURL = "OUTBOX_TEST_MYSQL_URL"

// inFlight bounds the events a killed relay published but did not record:
// a batch of 20 (faultArgs) in each of its lanes.
const inFlight = 20 * relay.DefaultLanes

const startMariaDB = "start it with: start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd"

func mysqlServerURL() string {
	if u := os.Getenv(envMySQLURL); u != "" {
		return u
	}
	return "mysql://root@127.0.0.1:3306/test"
}

// mysqlURL is the server's URL with the database replaced by db.
func mysqlURL(t testing.TB, db string) string {
	t.Helper()
	u := mysqlServerURL()
	base, query, _ := strings.Cut(u, "?")
	i := strings.LastIndex(base, "/")
	if i < len("mysql://") {
		t.Fatalf("%s=%q has no database path", envMySQLURL, u)
	}
	out := base[:i+1] + db
	if query != "" {
		out += "?" + query
	}
	return out
}

// mysqlDB opens the database of url, closed when the test ends; it fails
// saying how to start MariaDB when the server does not answer.
func mysqlDB(t testing.TB, url string) *sql.DB {
	t.Helper()
	cfg, err := outboxmysql.ParseURL(url)
	if err != nil {
		t.Fatalf("%s: %v", envMySQLURL, err)
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(16)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		t.Fatalf("cannot reach MySQL/MariaDB at %s (set %s to use another): %v; %s", cfg.Addr, envMySQLURL, err, startMariaDB)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// mysqlTarget is a fresh database with an outbox table migrated by the
// CLI, dropped when the test ends.
type mysqlTarget struct {
	db    *sql.DB
	tb    outboxdriver.Table
	flags []string // --db (and --table)
}

func mysqlMigrated(t *testing.T) *mysqlTarget {
	t.Helper()
	admin := mysqlDB(t, mysqlServerURL())
	name := testenv.MySQLDatabase(t, admin, "t")
	url := mysqlURL(t, name)
	m := &mysqlTarget{db: mysqlDB(t, url), tb: outboxdriver.Table{Schema: name, Name: "outbox"}, flags: []string{"--db", url}}
	latest := fmt.Sprintf("now at version %d", outboxmysql.New(nil).LatestVersion())
	if out, stderr, code := run(t, nil, append([]string{"migrate"}, m.flags...)...); code != 0 || !strings.Contains(out, latest) {
		t.Fatalf("migrate: code %d out %q err %q", code, out, stderr)
	}
	return m
}

func (m *mysqlTarget) status(t *testing.T) outboxdriver.Status {
	t.Helper()
	st, err := outboxmysql.New(m.db).Status(context.Background(), m.tb)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (m *mysqlTarget) waitBacklogZero(t *testing.T, timeout time.Duration) {
	t.Helper()
	await.Eventually(t, timeout, func() error {
		if st := m.status(t); st.Backlog != 0 {
			return fmt.Errorf("backlog still %d", st.Backlog)
		}
		return nil
	})
}

// mysqlWorkload writes the workload of internal/workload on MySQL
// (workload.RunMySQL): plain SQL only, some transactions roll back, some
// commit late.
func mysqlWorkload(ctx context.Context, db *sql.DB, tb outboxdriver.Table, cfg workload.Config) (*workload.Result, error) {
	return workload.RunMySQL(ctx, db, tb, cfg)
}

// writeMySQLAsync runs mysqlWorkload in the background; the returned func
// waits for it.
func writeMySQLAsync(t *testing.T, m *mysqlTarget, cfg workload.Config) func() *workload.Result {
	t.Helper()
	var res *workload.Result
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		res, err = mysqlWorkload(context.Background(), m.db, m.tb, cfg)
	}()
	return func() *workload.Result {
		<-done
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
}

// mysqlScenario is a migrated MariaDB table and a stream of its own with a
// raw tap on every publish.
type mysqlScenario struct {
	*mysqlTarget
	sinkFlags []string
	scenario  *scenario // stream and tap
}

func newMySQLScenario(t *testing.T) *mysqlScenario {
	t.Helper()
	m := mysqlMigrated(t)
	nc, js := testenv.JetStream(t)
	st, prefix := testenv.Stream(t, js)
	return &mysqlScenario{
		mysqlTarget: m,
		sinkFlags:   []string{"--sink", testenv.NATSURL(), "--nats-stream", prefix, "--nats-no-create-stream", "--route-replacement", prefix + ".${routedByValue}"},
		scenario:    &scenario{stream: st, raw: newTap(t, nc, prefix+".>")},
	}
}

func (s *mysqlScenario) args(extra ...string) []string {
	return append(append(append(append([]string{}, s.flags...), s.sinkFlags...), faultArgs...), extra...)
}

// check asserts, once the backlog drained: no loss, no phantom (nothing of
// a rolled-back transaction), per-aggregate first deliveries in commit
// order, identical copies, and at most maxDups duplicates.
func (s *mysqlScenario) check(t *testing.T, res *workload.Result, maxDups int) {
	t.Helper()
	s.waitBacklogZero(t, 90*time.Second)
	testenv.WaitStreamMsgs(t, s.scenario.stream, uint64(res.Committed()), 30*time.Second)
	if _, err := workload.Check(res, natsDeliveries(t, s.scenario.stream)); err != nil {
		t.Fatal(err)
	}
	d := s.scenario.raw.duplicates()
	if d > maxDups {
		t.Fatalf("the broker received %d duplicate copies, more than the %d these faults explain", d, maxDups)
	}
	t.Logf("%d events committed, %d rolled back; the broker received %d duplicate copies (bound %d)", res.Committed(), res.RolledBack, d, maxDups)
}

// TestMySQLMigrateStatusAndRelayToNATS is the user's path on MariaDB:
// migrate (twice), status --json, a relay to NATS while concurrent
// plain-SQL transactions commit and roll back, then every committed event
// is in the stream in commit order per aggregate, none rolled back, and
// status shows a backlog of 0.
func TestMySQLMigrateStatusAndRelayToNATS(t *testing.T) {
	t.Parallel()
	s := newMySQLScenario(t)
	if out, stderr, code := run(t, nil, append([]string{"migrate"}, s.flags...)...); code != 0 || !strings.Contains(out, "nothing to do") {
		t.Fatalf("second migrate: code %d out %q err %q", code, out, stderr)
	}
	out, stderr, code := run(t, nil, append([]string{"status", "--json"}, s.flags...)...)
	if code != 0 {
		t.Fatalf("status: %s", stderr)
	}
	var st struct {
		Schema     string `json:"schema"`
		Backlog    *int   `json:"backlog"`
		Partitions []any  `json:"partitions"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.Backlog == nil || *st.Backlog != 0 || st.Schema != s.tb.Schema || len(st.Partitions) != 64 {
		t.Fatalf("status --json printed %q (%v): want backlog 0, schema %s, 64 partitions", out, err, s.tb.Schema)
	}
	startRelay(t, s.args()...)
	res, err := mysqlWorkload(context.Background(), s.db, s.tb, workload.Config{
		Aggregates: 50, Transactions: 800, Writers: 8, RollbackPct: 10, LatePct: 2, LateDelay: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	s.check(t, res, 0)
	out, _, code = run(t, nil, append([]string{"status", "--json"}, s.flags...)...)
	if code != 0 || !strings.Contains(out, `"backlog":0`) {
		t.Fatalf("status --json = %s", out)
	}
}

// TestMySQLCLIErrorsAreClearOneLiners checks the errors of a bad mysql://
// URL, an unreachable server and hostile names.
func TestMySQLCLIErrorsAreClearOneLiners(t *testing.T) {
	t.Parallel()
	mysqlDB(t, mysqlServerURL()) // fails with how to start MariaDB when it is down
	db := mysqlServerURL()
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"unparsable url", []string{"status", "--db", "mysql://u:secret@%zz/x"}, "invalid database URL"},
		{"no database", []string{"status", "--db", "mysql://root:secret@127.0.0.1:3306/"}, "no database"},
		{"hostile database", []string{"status", "--db", "mysql://root:secret@127.0.0.1:3306/a%60b"}, "not a valid identifier"},
		{"bad parameter", []string{"status", "--db", "mysql://root:secret@127.0.0.1:3306/test?timeout=soon"}, "invalid database URL"},
		{"unreachable server", []string{"status", "--db", "mysql://root:secret@127.0.0.1:1/test"}, `cannot connect to MySQL/MariaDB at 127.0.0.1:1 (database "test")`},
		{"hostile table", []string{"migrate", "--db", db, "--table", "x`; DROP TABLE y; --"}, "not a valid identifier"},
		{"not migrated", []string{"status", "--db", db, "--table", "nothing_here"}, "run `outbox migrate`"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			failsWithOneLine(t, []string{"OUTBOX_DB=", "OUTBOX_SINK="}, c.want, c.args...)
		})
	}
}

// mysqlSources are the relay's sources on MySQL/MariaDB: polling and the
// binary log (docs/binlog.md; the test server needs a row-based binary
// log: `bash .ci/test --setup-only`).
var mysqlSources = []string{"poll", "binlog"}

// forMySQLSources runs test once per source of mysqlSources, each as a
// parallel subtest named for it.
func forMySQLSources(t *testing.T, test func(t *testing.T, src string)) {
	t.Helper()
	for _, src := range mysqlSources {
		t.Run(src, func(t *testing.T) {
			t.Parallel()
			test(t, src)
		})
	}
}

// relayArgs are the relay's flags for source src on top of args.
func (s *mysqlScenario) relayArgs(src string, extra ...string) []string {
	return s.args(append([]string{"--source", src}, extra...)...)
}

// TestMariaDBRelayKilledMidStreamLosesNothing SIGKILLs the relay three
// times while writers commit and roll back, restarts it each time (with
// the binary log, the next waits for the killed one's lease to expire),
// and checks that every committed event reached the stream, in order, and
// nothing rolled back did.
func TestMariaDBRelayKilledMidStreamLosesNothing(t *testing.T) {
	t.Parallel()
	forMySQLSources(t, func(t *testing.T, src string) {
		s := newMySQLScenario(t)
		wait := writeMySQLAsync(t, s.mysqlTarget, workload.Config{Aggregates: 40, Transactions: 1500, Writers: 6, RollbackPct: 10})
		kills := 0
		for round := range 3 {
			p := startRelay(t, s.relayArgs(src)...)
			testenv.WaitStreamMsgs(t, s.scenario.stream, uint64(100*(round+1)), 90*time.Second)
			p.kill()
			kills++
		}
		startRelay(t, s.relayArgs(src)...)
		res := wait()
		s.check(t, res, kills*inFlight)
	})
}

// TestMariaDBKillAtNamedPoints kills the relay with SIGKILL right after it
// claimed a batch and after the broker acknowledged one but before it was
// recorded; a fresh relay then finishes the job.
func TestMariaDBKillAtNamedPoints(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		point   string
		minDups int
	}{
		{"claimed:3", 0},
		{"published:3", 1}, // acknowledged, not recorded: republished
	} {
		t.Run(strings.Split(c.point, ":")[0], func(t *testing.T) {
			t.Parallel()
			forMySQLSources(t, func(t *testing.T, src string) {
				s := newMySQLScenario(t)
				wait := writeMySQLAsync(t, s.mysqlTarget, workload.Config{Aggregates: 30, Transactions: 400, Writers: 4, RollbackPct: 10})
				p := startRelayEnv(t, []string{"OUTBOX_FAULT=" + c.point}, s.relayArgs(src)...)
				p.killedBySignal(t, 60*time.Second)
				startRelay(t, s.relayArgs(src)...)
				res := wait()
				s.check(t, res, inFlight)
				if d := s.scenario.raw.duplicates(); d < c.minDups {
					t.Fatalf("%d duplicate copies: the fault did not happen where it should", d)
				}
			})
		})
	}
}

// TestMariaDBTwoRelaysKeepOrder runs two relays at once on one table while
// writers commit, SIGKILLs one mid-stream and starts another: per-aggregate
// order holds across them and nothing is lost. With the binary log one
// relay streams and the other stands by: the streamer is the one killed,
// and the standby takes the lease over.
func TestMariaDBTwoRelaysKeepOrder(t *testing.T) {
	t.Parallel()
	forMySQLSources(t, func(t *testing.T, src string) {
		s := newMySQLScenario(t)
		wait := writeMySQLAsync(t, s.mysqlTarget, workload.Config{Aggregates: 100, Transactions: 2000, Writers: 6, RollbackPct: 10, LatePct: 2, LateDelay: 50 * time.Millisecond})
		a := startRelay(t, s.relayArgs(src)...)
		if src == "binlog" {
			s.waitBinlogOwner(t, a)
		}
		b := startRelay(t, s.relayArgs(src)...)
		if src == "poll" {
			// Both own partitions before one dies.
			await.Eventually(t, 30*time.Second, func() error {
				owners := map[string]bool{}
				for _, p := range s.status(t).Partitions {
					owners[p.Owner] = true
				}
				if len(owners) != 2 || owners[""] {
					return fmt.Errorf("two relays never shared the partitions: %v", owners)
				}
				return nil
			})
		}
		testenv.WaitStreamMsgs(t, s.scenario.stream, 200, 60*time.Second)
		a.kill()
		if src == "binlog" {
			s.waitBinlogOwner(t, b) // the standby, once a's lease expired
		}
		startRelay(t, s.relayArgs(src)...)
		res := wait()
		bound := 3 * inFlight
		if src == "binlog" {
			// The standby streams again from the position the killed
			// streamer last recorded: every batch it had acknowledged
			// since, in each lane, comes again, as for the WAL relay's
			// fail-over (fault_test.go).
			bound = 6 * inFlight
		}
		s.check(t, res, bound)
	})
}

// waitBinlogOwner waits until relay p holds the binary log's lease
// (<table>_binlog; a relay's default name holds its process id).
func (s *mysqlScenario) waitBinlogOwner(t *testing.T, p *relayProc) {
	t.Helper()
	await.Eventually(t, 60*time.Second, func() error {
		var owner sql.NullString
		err := s.db.QueryRowContext(context.Background(), "SELECT CASE WHEN expires_at > UTC_TIMESTAMP(6) THEN owner END FROM `"+s.tb.Schema+"`.`"+s.tb.Name+"_binlog` WHERE name = 'default'").Scan(&owner)
		if err != nil && err != sql.ErrNoRows {
			t.Fatal(err)
		}
		if !p.owns(map[string]int{owner.String: 1}) {
			return fmt.Errorf("the binary log's lease is held by %q, not by relay %d", owner.String, p.cmd.Process.Pid)
		}
		return nil
	})
}
