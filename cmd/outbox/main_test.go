package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox/internal/gobuild"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/internal/workload"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/sink/natssink"
)

// bin is the outbox binary the tests run as a user would. It is built
// without the race detector: the packages it runs are race-tested in their
// own packages, a race-built binary is several times slower and sleeps a
// second before every exit, and most relays here end by SIGKILL, which
// drops a race report unread.
var bin string

// raceBin is the outbox binary built with the race detector when the tests
// are (bin otherwise), for the runs whose exit status is checked after real
// concurrent work, so that a race fails them (exit status 66): the demo,
// whose code (internal/demo) has no tests of its own, and a relay stopped
// by SIGTERM.
var raceBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "outbox-cli")
	if err != nil {
		panic(err)
	}
	bin = filepath.Join(dir, "outbox")
	// bin builds as the image's binary does (internal/gobuild), raceBin as
	// the tests do: each is mostly a link from the build cache. The builds
	// run at once.
	builds := []*exec.Cmd{gobuild.Command(context.Background(), "", "-o", bin, ".")}
	raceBin = bin
	if raceEnabled {
		raceBin = filepath.Join(dir, "outbox-race")
		builds = append(builds, exec.Command("go", "build", "-race", "-o", raceBin, "."))
	}
	errs := make(chan error, len(builds))
	for _, build := range builds {
		go func() {
			build.Stdout, build.Stderr = os.Stderr, os.Stderr
			err := build.Run()
			if err != nil {
				err = fmt.Errorf("%s: %w", strings.Join(build.Args, " "), err)
			}
			errs <- err
		}()
	}
	for range builds {
		if err := <-errs; err != nil {
			fmt.Fprintln(os.Stderr, "build outbox:", err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// run runs the CLI to completion.
func run(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return runBinary(t, bin, env, args...)
}

// runBinary runs the command exe to completion.
func runBinary(t *testing.T, exe string, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return out.String(), errb.String(), ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), 0
}

// failsWithOneLine runs the CLI and fails t unless it exits with an error
// and writes one line to stderr that starts with "outbox: ", contains
// want and does not show the password "secret" of a URL.
func failsWithOneLine(t *testing.T, env []string, want string, args ...string) {
	t.Helper()
	_, stderr, code := run(t, env, args...)
	if code == 0 {
		t.Fatalf("exit code 0, want failure")
	}
	line := strings.TrimRight(stderr, "\n")
	if strings.Contains(line, "\n") || !strings.HasPrefix(line, "outbox: ") || !strings.Contains(line, want) {
		t.Fatalf("stderr = %q; want one line starting with \"outbox: \" containing %q", stderr, want)
	}
	if strings.Contains(line, ":secret@") {
		t.Fatalf("password leaked: %q", line)
	}
}

// relayProc is a running `outbox relay`.
type relayProc struct {
	cmd    *exec.Cmd
	stderr *testenv.Buffer
	done   chan error
}

func startRelay(t *testing.T, args ...string) *relayProc {
	t.Helper()
	return startRelayEnv(t, nil, args...)
}

func startRelayEnv(t *testing.T, env []string, args ...string) *relayProc {
	t.Helper()
	return startRelayBinary(t, bin, env, args...)
}

// started remembers the relays each test started.
var started = relaysByTest{m: map[*testing.T][]*relayProc{}}

type relaysByTest struct {
	mu sync.Mutex
	m  map[*testing.T][]*relayProc
}

func (r *relaysByTest) add(t *testing.T, p *relayProc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.m[t]; !ok {
		t.Cleanup(func() {
			r.mu.Lock()
			delete(r.m, t)
			r.mu.Unlock()
		})
	}
	r.m[t] = append(r.m[t], p)
}

// republishLog matches what a log-tailing relay logs when its stream ends
// with events published past the slot's confirmed LSN.
var republishLog = regexp.MustCompile(`published again" slot=\S+ republish=(\d+)`)

// republished sums the events t's relays said they published past the
// slot's confirmed LSN when a stream of theirs ended: a new stream
// delivers those again.
func (r *relaysByTest) republished(t *testing.T) int {
	r.mu.Lock()
	procs := slices.Clone(r.m[t])
	r.mu.Unlock()
	n := 0
	for _, p := range procs {
		for _, m := range republishLog.FindAllStringSubmatch(p.stderr.String(), -1) {
			v, _ := strconv.Atoi(m[1])
			n += v
		}
	}
	return n
}

// startRelayBinary starts `exe relay args...`, killed when the test ends.
func startRelayBinary(t *testing.T, exe string, env []string, args ...string) *relayProc {
	t.Helper()
	cmd := exec.Command(exe, append([]string{"relay"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	p := &relayProc{cmd: cmd, stderr: &testenv.Buffer{}, done: make(chan error, 1)}
	cmd.Stdout = io.Discard
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- cmd.Wait() }()
	started.add(t, p)
	t.Cleanup(func() {
		if t.Failed() {
			// A relay still running when the test failed prints every
			// goroutine's stack on SIGQUIT: where it was stuck.
			if p.cmd.Process.Signal(syscall.SIGQUIT) == nil {
				select {
				case err := <-p.done:
					p.done <- err
				case <-time.After(5 * time.Second):
				}
			}
		}
		p.kill()
		if t.Failed() {
			t.Logf("relay stderr:\n%s", p.stderr.String())
		}
	})
	return p
}

func (p *relayProc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	p.done <- nil // let later kills return at once
}

// wait waits for the process to exit and returns its exit code.
func (p *relayProc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		return 0
	case <-time.After(timeout):
		t.Fatalf("relay still running after %s; stderr:\n%s", timeout, p.stderr.String())
		return -1
	}
}

func dbURL() string { return testenv.DatabaseURL() }

// migrated returns a migrated table in a fresh schema and its CLI flags.
func migrated(t *testing.T) (outboxdriver.Table, []string) {
	t.Helper()
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	flags := []string{"--db", dbURL(), "--schema", tb.Schema, "--table", tb.Name}
	if _, stderr, code := run(t, nil, append([]string{"migrate"}, flags...)...); code != 0 {
		t.Fatalf("migrate failed: %s", stderr)
	}
	return tb, flags
}

func TestCLIErrorsAreClearOneLiners(t *testing.T) {
	t.Parallel()
	tb, flags := migrated(t)
	db := dbURL()
	cases := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"no db", nil, []string{"relay", "--sink", "stdout:"}, "no database: pass --db"},
		{"bad db url", nil, []string{"status", "--db", "postgres://u:secret@%zz/x"}, "invalid database URL"},
		{"unreachable db", nil, []string{"status", "--db", "postgres://postgres@127.0.0.1:1/test?connect_timeout=2"}, "cannot connect to PostgreSQL at 127.0.0.1:1"},
		{"hostile table", nil, []string{"migrate", "--db", db, "--table", `x"; DROP TABLE y; --`}, "not a valid identifier"},
		{"hostile schema", nil, []string{"status", "--db", db, "--schema", "a b"}, "not a valid identifier"},
		{"not migrated", nil, []string{"status", "--db", db, "--schema", tb.Schema, "--table", "nothing_here"}, "run `outbox migrate`"},
		{"no sink", nil, append([]string{"relay"}, flags...), "no sink: pass --sink"},
		{"unknown sink", nil, append([]string{"relay", "--sink", "ftp://x:1"}, flags...), `unknown scheme "ftp"`},
		{"sink without scheme", nil, append([]string{"relay", "--sink", "localhost"}, flags...), "has no scheme"},
		{"unreachable nats", nil, append([]string{"relay", "--sink", "nats://127.0.0.1:1"}, flags...), "127.0.0.1:1"},
		{"kafka without port", nil, append([]string{"relay", "--sink", "kafka://localhost"}, flags...), "host:port"},
		{"unreachable kafka", nil, append([]string{"relay", "--sink", "kafka://127.0.0.1:1"}, flags...), "cannot reach"},
		{"stdout with address", nil, append([]string{"relay", "--sink", "stdout:foo"}, flags...), "takes no address"},
		{"bad batch", nil, append([]string{"relay", "--sink", "stdout:", "--batch", "0"}, flags...), "--batch 0"},
		{"bad retention", nil, append([]string{"relay", "--sink", "stdout:", "--retention", "forever"}, flags...), "--retention"},
		{"bad route-by", nil, append([]string{"relay", "--sink", "stdout:", "--route-by", "payload"}, flags...), "cannot route by"},
		{"bad flag", nil, []string{"relay", "--batchsize", "3"}, "unknown flag"},
		{"unreachable amqp", nil, append([]string{"relay", "--sink", "amqp://guest:secret@127.0.0.1:1/"}, flags...), "127.0.0.1:1"},
		{"unreachable redis", nil, append([]string{"relay", "--sink", "redis://127.0.0.1:1/0"}, flags...), "127.0.0.1:1"},
		{"unreachable mqtt", nil, append([]string{"relay", "--sink", "mqtt://127.0.0.1:1"}, flags...), "127.0.0.1:1"},
		{"mqtt qos 0", nil, append([]string{"relay", "--sink", "mqtt://127.0.0.1:1883", "--mqtt-qos", "0"}, flags...), "--mqtt-qos 0"},
		{"webhook without secret", nil, append([]string{"relay", "--sink", "https://hooks.example.com/${destination}"}, flags...), "no signing secret"},
		{"env sink is used", []string{"OUTBOX_SINK=ftp://x", "OUTBOX_DB=" + db}, []string{"relay", "--schema", tb.Schema}, `unknown scheme "ftp"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			failsWithOneLine(t, append([]string{"OUTBOX_DB=", "OUTBOX_SINK="}, c.env...), c.want, c.args...)
		})
	}
}

func TestMigrateTwiceAndStatusJSON(t *testing.T) {
	t.Parallel()
	_, flags := migrated(t)
	out, stderr, code := run(t, nil, append([]string{"migrate"}, flags...)...)
	if code != 0 || !strings.Contains(out, "nothing to do") {
		t.Fatalf("second migrate: code %d out %q err %q", code, out, stderr)
	}
	out, stderr, code = run(t, nil, append([]string{"status", "--json"}, flags...)...)
	if code != 0 {
		t.Fatalf("status: %s", stderr)
	}
	var st map[string]any
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --json printed %q: %v", out, err)
	}
	for _, k := range []string{"backlog", "oldest_unpublished_age_seconds", "dead_letters"} {
		if v, ok := st[k].(float64); !ok || v != 0 {
			t.Fatalf("status %s = %v, want 0 in %s", k, st[k], out)
		}
	}
}

// natsTarget makes a stream for the test and returns it with relay flags
// that route into it.
func natsTarget(t *testing.T) (jetstream.Stream, []string) {
	t.Helper()
	_, js := testenv.JetStream(t)
	st, prefix := testenv.Stream(t, js)
	return st, []string{"--sink", testenv.NATSURL(), "--nats-stream", prefix, "--nats-no-create-stream",
		"--route-replacement", prefix + ".${routedByValue}"}
}

func natsDeliveries(t *testing.T, st jetstream.Stream) []workload.Delivery {
	t.Helper()
	msgs := testenv.StreamMessages(t, st)
	out := make([]workload.Delivery, len(msgs))
	for i, m := range msgs {
		out[i] = workload.Delivery{ID: m.Header.Get("id"), Key: m.Header.Get(natssink.KeyHeader), Payload: m.Data}
		if m.Header.Get(jetstream.MsgIDHeader) != out[i].ID {
			t.Fatalf("message %d: Nats-Msg-Id %q != id %q", i, m.Header.Get(jetstream.MsgIDHeader), out[i].ID)
		}
	}
	return out
}

func waitBacklogZero(t *testing.T, tb outboxdriver.Table, timeout time.Duration) {
	t.Helper()
	waitBacklogZeroIn(t, testenv.Pool(t), tb, timeout)
}

// waitBacklogZeroIn waits until table tb of pool's database holds no
// unpublished event.
func waitBacklogZeroIn(t *testing.T, pool *pgxpool.Pool, tb outboxdriver.Table, timeout time.Duration) {
	t.Helper()
	await.Eventually(t, timeout, func() error {
		st, err := outboxpgx.New(pool).Status(context.Background(), tb)
		if err != nil {
			t.Fatal(err)
		}
		if st.Backlog != 0 {
			return fmt.Errorf("backlog still %d", st.Backlog)
		}
		return nil
	})
}

// TestEndToEndNATS is the user's check: many concurrent plain-SQL
// transactions, some rolled back, some committing late, while one relay
// publishes to JetStream; then every committed event is there in commit
// order per aggregate, none from a rolled-back transaction, and status
// shows a backlog of 0.
func TestEndToEndNATS(t *testing.T) {
	t.Parallel()
	tb, flags := migrated(t)
	st, sinkFlags := natsTarget(t)
	addr := freeAddr(t)
	startRelay(t, append(append(flags, sinkFlags...), "--metrics-addr", addr, "--batch", "100")...)
	res, err := workload.Run(context.Background(), testenv.Pool(t), tb, workload.Config{
		Aggregates: 100, Transactions: 2000, Writers: 8, RollbackPct: 10, LatePct: 2, LateDelay: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitStreamMsgs(t, st, uint64(res.Committed()), 60*time.Second)
	waitBacklogZero(t, tb, 30*time.Second)
	if _, err := workload.Check(res, natsDeliveries(t, st)); err != nil {
		t.Fatal(err)
	}
	out, _, code := run(t, nil, append([]string{"status", "--json"}, flags...)...)
	if code != 0 || !strings.Contains(out, `"backlog":0`) {
		t.Fatalf("status --json = %s", out)
	}
	metrics := get(t, "http://"+addr+"/metrics")
	for _, name := range []string{"outbox_published_total", "outbox_backlog_events 0", "outbox_oldest_unpublished_age_seconds",
		"outbox_commit_to_publish_seconds_bucket", "outbox_dead_letter_events 0", "outbox_publish_errors_total",
		"outbox_retries_total", "outbox_partitions_owned 64"} {
		if !strings.Contains(metrics, name) {
			t.Errorf("/metrics lacks %q", name)
		}
	}
	if body := get(t, "http://"+addr+"/readyz"); !strings.Contains(body, "ready") {
		t.Errorf("/readyz = %q", body)
	}
	t.Logf("%d committed, %d rolled back, all delivered in order", res.Committed(), res.RolledBack)
}

// TestEndToEndKafka runs the same check against Kafka (kfake stands in for
// a cluster): topic, key = aggregate id, header id, commit order per key.
func TestEndToEndKafka(t *testing.T) {
	t.Parallel()
	tb, flags := migrated(t)
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(4))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	brokers := cluster.ListenAddrs()
	startRelay(t, append(flags, "--sink", "kafka://"+strings.Join(brokers, ","), "--header-columns", "type:eventType")...)
	res, err := workload.Run(context.Background(), testenv.Pool(t), tb, workload.Config{
		Aggregates: 50, Transactions: 1000, Writers: 8, RollbackPct: 10, LatePct: 2, LateDelay: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	waitBacklogZero(t, tb, 60*time.Second)
	checkKafka(t, brokers, "outbox.event.order", res, func(id string, hs map[string]string) {
		if hs["eventType"] != "Changed" {
			t.Errorf("record %s lacks header eventType: %v", id, hs)
		}
	})
}

// checkKafka consumes topic from its start until every event res committed
// was read, and checks the invariants: per-key commit order within each
// partition, then no loss and no phantom over all of them. each, when not
// nil, sees every record's id and headers.
func checkKafka(t *testing.T, brokers []string, topic string, res *workload.Result, each func(id string, hs map[string]string)) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// Per-key order lives within a partition: check each partition's stream.
	byPartition := map[int32][]workload.Delivery{}
	seen := map[string]bool{}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for len(seen) < res.Committed() {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d events: %v", len(seen), res.Committed(), err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			d := workload.Delivery{Key: string(r.Key), Payload: r.Value}
			hs := map[string]string{}
			for _, h := range r.Headers {
				hs[h.Key] = string(h.Value)
			}
			d.ID = hs["id"]
			if _, ok := res.IDs[d.ID]; ok {
				seen[d.ID] = true
			}
			if each != nil {
				each(d.ID, hs)
			}
			byPartition[r.Partition] = append(byPartition[r.Partition], d)
		})
	}
	var all []workload.Delivery
	for _, ds := range byPartition {
		all = append(all, ds...)
	}
	// Check each partition on its own for order, then all for loss.
	for p, ds := range byPartition {
		sub := &workload.Result{IDs: map[string]workload.Payload{}}
		for _, d := range ds {
			if pl, ok := res.IDs[d.ID]; ok {
				sub.IDs[d.ID] = pl
			}
		}
		if _, err := workload.Check(sub, ds); err != nil {
			t.Fatalf("partition %d: %v", p, err)
		}
	}
	if _, err := workload.Check(res, sortByVersion(all)); err != nil {
		t.Fatal(err)
	}
}

// sortByVersion orders deliveries by (aggregate, version) so a check over
// all partitions judges loss and phantoms only; order was checked per
// partition.
func sortByVersion(ds []workload.Delivery) []workload.Delivery {
	type kv struct {
		d workload.Delivery
		p workload.Payload
	}
	xs := make([]kv, len(ds))
	for i, d := range ds {
		xs[i].d = d
		_ = json.Unmarshal(d.Payload, &xs[i].p)
	}
	for i := 1; i < len(xs); i++ {
		for j := i; j > 0 && (xs[j].p.Agg < xs[j-1].p.Agg || xs[j].p.Agg == xs[j-1].p.Agg && xs[j].p.V < xs[j-1].p.V); j-- {
			xs[j], xs[j-1] = xs[j-1], xs[j]
		}
	}
	out := make([]workload.Delivery, len(xs))
	for i := range xs {
		out[i] = xs[i].d
	}
	return out
}

// TestEndToEndRedis relays through `--sink redis://` and reads the streams:
// every committed event, in order per aggregate, with id and key fields.
func TestEndToEndRedis(t *testing.T) {
	t.Parallel()
	tb, flags := migrated(t)
	prefix := testenv.Name("e2e")
	startRelay(t, append(flags, "--sink", "redis://127.0.0.1:6379/0", "--route-replacement", prefix+".${routedByValue}")...)
	res, err := workload.Run(context.Background(), testenv.Pool(t), tb, workload.Config{Aggregates: 30, Transactions: 300, Writers: 4, RollbackPct: 10})
	if err != nil {
		t.Fatal(err)
	}
	waitBacklogZero(t, tb, 60*time.Second)
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	defer rdb.Del(context.Background(), prefix+".order")
	entries, err := rdb.XRange(context.Background(), prefix+".order", "-", "+").Result()
	if err != nil {
		t.Fatalf("read stream: %v (start Redis with: redis-server --daemonize yes --port 6379)", err)
	}
	var got []workload.Delivery
	for _, e := range entries {
		id, _ := e.Values["id"].(string)
		key, _ := e.Values["key"].(string)
		payload, _ := e.Values["payload"].(string)
		if typ, _ := e.Values["type"].(string); typ != "Changed" {
			t.Errorf("entry %s: type %q, want Changed", id, typ)
		}
		got = append(got, workload.Delivery{ID: id, Key: key, Payload: []byte(payload)})
	}
	if _, err := workload.Check(res, got); err != nil {
		t.Fatal(err)
	}
}

// TestRelayKilledAndRestartedLosesNothing SIGKILLs the relay mid-backlog,
// restarts it, and checks that nothing was lost and order held, for each
// source.
func TestRelayKilledAndRestartedLosesNothing(t *testing.T) {
	t.Parallel()
	for _, src := range sources {
		t.Run(src, func(t *testing.T) {
			t.Parallel()
			tb, db := migratedFor(t, src)
			st, sinkFlags := natsTarget(t)
			res, err := workload.Run(context.Background(), db.pool, tb, workload.Config{
				Aggregates: 50, Transactions: 3000, Writers: 8,
			})
			if err != nil {
				t.Fatal(err)
			}
			// A short lease: each restarted relay waits for the killed one's
			// leases to expire before it takes their partitions.
			args := append(append(append(db.flags, db.relayFlags...), sinkFlags...), "--batch", "50", "--lease-ttl", "1s")
			for round := range 3 {
				p := startRelay(t, args...)
				testenv.WaitStreamMsgs(t, st, uint64((round+1)*res.Committed()/4), 60*time.Second)
				p.kill()
			}
			startRelay(t, args...)
			waitBacklogZeroIn(t, db.pool, tb, 60*time.Second)
			testenv.WaitStreamMsgs(t, st, uint64(res.Committed()), 30*time.Second)
			dups, err := workload.Check(res, natsDeliveries(t, st))
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d events, %d duplicate copies in the stream after 3 SIGKILLs", res.Committed(), dups)
		})
	}
}

// TestSIGTERMStopsGracefully checks that SIGTERM ends the relay with exit
// code 0 and leaves nothing half-done: everything published is recorded.
func TestSIGTERMStopsGracefully(t *testing.T) {
	t.Parallel()
	forSources(t, testSIGTERMStopsGracefully)
}

func testSIGTERMStopsGracefully(t *testing.T, src string) {
	tb, db := migratedFor(t, src)
	flags := append(db.flags, db.relayFlags...)
	st, sinkFlags := natsTarget(t)
	res, err := workload.Run(context.Background(), db.pool, tb, workload.Config{Aggregates: 20, Transactions: 2000, Writers: 4})
	if err != nil {
		t.Fatal(err)
	}
	// The race-built relay: a race it meets fails its exit status.
	p := startRelayBinary(t, raceBin, nil, append(append(flags, sinkFlags...), "--batch", "20")...)
	testenv.WaitStreamMsgs(t, st, 100, 60*time.Second)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM; stderr:\n%s", code, p.stderr.String())
	}
	if !strings.Contains(p.stderr.String(), "relay stopped") {
		t.Fatalf("no clean stop logged:\n%s", p.stderr.String())
	}
	// Every event in the stream was recorded as published: the backlog is
	// exactly what was not delivered.
	status, err := outboxpgx.New(db.pool).Status(context.Background(), tb)
	if err != nil {
		t.Fatal(err)
	}
	delivered := len(natsDeliveries(t, st))
	if int(status.Backlog)+delivered != res.Committed() {
		t.Fatalf("backlog %d + delivered %d != committed %d: the last batch was not recorded", status.Backlog, delivered, res.Committed())
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
