package main

// The fault-injection suite: real `outbox relay` processes killed with
// SIGKILL at named points, paused with SIGSTOP past their leases, cut off
// from the broker, fed a poison event, and churned three at a time while
// writers run. After each, a checker compares what the broker holds with
// what committed. docs/faults.md maps every scenario to its test.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox/internal/faultproxy"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/internal/workload"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/relay"
)

// faultArgs are relay flags that make faults heal quickly.
var faultArgs = []string{"--lease-ttl", "1s", "--poll-interval", "100ms", "--batch", "20", "--retry-base", "50ms", "--retry-max", "500ms"}

// scenario is one table and stream with a raw tap on every publish.
type scenario struct {
	tb        outboxdriver.Table
	flags     []string // --db, --schema, --table and the relay's --source flags
	sinkFlags []string
	stream    jetstream.Stream
	raw       *tap
	db        testDB
	source    string // "poll" or "cdc"
}

// newScenarioFor is a scenario whose relays read with source src.
func newScenarioFor(t *testing.T, src string) *scenario {
	t.Helper()
	tb, db := migratedFor(t, src)
	flags := append(db.flags, db.relayFlags...)
	nc, js := testenv.JetStream(t)
	st, prefix := testenv.Stream(t, js)
	return &scenario{
		tb: tb, flags: flags, stream: st, db: db, source: src,
		sinkFlags: []string{"--sink", testenv.NATSURL(), "--nats-stream", prefix, "--nats-no-create-stream", "--route-replacement", prefix + ".${routedByValue}"},
		raw:       newTap(t, nc, prefix+".>"),
	}
}

func (s *scenario) args(extra ...string) []string {
	return append(append(append(append([]string{}, s.flags...), s.sinkFlags...), faultArgs...), extra...)
}

// tap counts every message the broker received on the subjects, duplicates
// included (JetStream keeps one copy per id; a core subscription sees all).
type tap struct {
	mu     sync.Mutex
	counts map[string]int
}

func newTap(t *testing.T, nc *nats.Conn, subject string) *tap {
	t.Helper()
	tp := &tap{counts: map[string]int{}}
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		tp.mu.Lock()
		tp.counts[m.Header.Get("id")]++
		tp.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	sub.SetPendingLimits(-1, -1)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	return tp
}

// total returns how many messages the broker received, copies included.
func (tp *tap) total() int {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	n := 0
	for _, c := range tp.counts {
		n += c
	}
	return n
}

// settled returns the tap's total once it stopped changing for a
// quarter second (at most 10s): what a dead relay had sent has arrived.
func (tp *tap) settled() int {
	n, since := tp.total(), time.Now()
	for deadline := since.Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(25 * time.Millisecond) {
		if m := tp.total(); m != n {
			n, since = m, time.Now()
		} else if time.Since(since) >= 250*time.Millisecond {
			break
		}
	}
	return n
}

// duplicates returns how many extra copies the broker received.
func (tp *tap) duplicates() int {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	n := 0
	for _, c := range tp.counts {
		n += c - 1
	}
	return n
}

// check asserts the invariants over the stream after the backlog drained:
// no loss, no phantom, per-aggregate first deliveries in commit order,
// identical copies; and that duplicates stay within bound.
func (s *scenario) check(t *testing.T, res *workload.Result, maxDups int) {
	t.Helper()
	waitBacklogZeroIn(t, s.db.pool, s.tb, 90*time.Second)
	testenv.WaitStreamMsgs(t, s.stream, uint64(res.Committed()), 30*time.Second)
	if _, err := workload.Check(res, natsDeliveries(t, s.stream)); err != nil {
		t.Fatal(err)
	}
	d, bound := s.raw.duplicates(), maxDups
	if s.source == "cdc" {
		// With log tailing a stream that ends (a lost connection or
		// lease) is read again from the confirmed LSN, which stops at the
		// oldest event not done: what other partitions published past it
		// is delivered again, and the relays log how much. A relay that
		// was paused logs it once it runs again.
		// Up to 10s for the relays to log it; checked below.
		_ = await.Poll(10*time.Second, func() error {
			if bound = maxDups + started.republished(t); d > bound {
				return fmt.Errorf("%d duplicate copies, %d explained", d, bound)
			}
			return nil
		})
	}
	if d > bound {
		t.Fatalf("the broker received %d duplicate copies, more than the %d these faults explain", d, bound)
	}
	t.Logf("%d events checked; the broker received %d duplicate copies (bound %d)", res.Committed(), d, bound)
}

func (p *relayProc) killedBySignal(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("relay ended with %v, want death by SIGKILL; stderr:\n%s", err, p.stderr.String())
		}
	case <-time.After(timeout):
		t.Fatalf("relay did not reach its fault point within %s; stderr:\n%s", timeout, p.stderr.String())
	}
}

// writeAsyncIn runs the workload on table tb of pool's database in the
// background; the returned func waits for its result.
func writeAsyncIn(t *testing.T, pool *pgxpool.Pool, tb outboxdriver.Table, cfg workload.Config) func() *workload.Result {
	t.Helper()
	var res *workload.Result
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		res, err = workload.Run(context.Background(), pool, tb, cfg)
	}()
	return func() *workload.Result {
		<-done
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
}

// TestFaultKillAtNamedPoints kills a relay with SIGKILL right after it
// claimed a batch, after the broker acknowledged one but before it was
// recorded, and right after it acquired partitions; a fresh relay then
// finishes the job.
func TestFaultKillAtNamedPoints(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		point   string
		minDups int // copies the fault must cause
	}{
		{"claimed:3", 0},
		{"published:3", 1}, // acknowledged, not recorded: republished
		{"acquired:1", 0},
	} {
		for _, src := range sources {
			t.Run(strings.Split(c.point, ":")[0]+"/"+src, func(t *testing.T) {
				t.Parallel()
				s := newScenarioFor(t, src)
				wait := writeAsyncIn(t, s.db.pool, s.tb, workload.Config{Aggregates: 40, Transactions: 600, Writers: 4, RollbackPct: 10})
				p := startRelayEnv(t, []string{"OUTBOX_FAULT=" + c.point}, s.args()...)
				p.killedBySignal(t, 60*time.Second)
				bound := 20 * relay.DefaultLanes // a batch of 20 in flight per lane at most
				if src == "cdc" {
					// A streamer killed with SIGKILL cannot log what it
					// published past the slot's confirmed LSN (the oldest
					// event not done; other lanes run ahead of it), and
					// the next stream delivers that again: at most all it
					// sent.
					bound += s.raw.settled()
				}
				startRelay(t, s.args()...)
				res := wait()
				s.check(t, res, bound)
				if d := s.raw.duplicates(); d < c.minDups {
					t.Fatalf("%d duplicate copies: the fault did not happen where it should", d)
				}
			})
		}
	}
}

// TestFaultPausedOwnerIsFenced pauses a relay with SIGSTOP far past its
// lease while another relay and the writers go on; its partitions move,
// and when it resumes nothing it does breaks an invariant.
func TestFaultPausedOwnerIsFenced(t *testing.T) {
	t.Parallel()
	for _, src := range sources {
		t.Run(src, func(t *testing.T) {
			t.Parallel()
			s := newScenarioFor(t, src)
			wait := writeAsyncIn(t, s.db.pool, s.tb, workload.Config{Aggregates: 40, Transactions: 1500, Writers: 4, RollbackPct: 5})
			a := startRelay(t, s.args()...)
			testenv.WaitStreamMsgs(t, s.stream, 50, 60*time.Second)
			startRelay(t, s.args()...)
			if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			// Within about two TTLs, the live relay owns every partition
			// (with log tailing: streams the slot).
			await.Eventually(t, 10*time.Second, func() error {
				if m := s.owners(t); m[""] > 0 || a.owns(m) || len(m) == 0 {
					return fmt.Errorf("partitions still %v since their owner was paused", m)
				}
				return nil
			})
			time.Sleep(2 * time.Second) // the paused relay stays stale while work goes on
			if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			res := wait()
			s.check(t, res, 60*relay.DefaultLanes)
		})
	}
}

// owners counts the partitions each relay leases ("" for none); with log
// tailing the slot's lease, which covers them all, counts once.
func (s *scenario) owners(t *testing.T) map[string]int {
	t.Helper()
	m := map[string]int{}
	if s.source == "cdc" {
		var owner string
		err := s.db.pool.QueryRow(context.Background(), `SELECT CASE WHEN expires_at > now() THEN coalesce(owner, '') ELSE '' END FROM `+s.tb.Qualified("_cdc")).Scan(&owner)
		if err != nil {
			t.Fatal(err)
		}
		m[owner]++
		return m
	}
	st, err := outboxpgx.New(s.db.pool).Status(context.Background(), s.tb)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range st.Partitions {
		m[p.Owner]++
	}
	return m
}

// owns reports whether p leases any partition of m (a relay's default
// name holds its process id).
func (p *relayProc) owns(m map[string]int) bool {
	for owner := range m {
		if strings.Contains(owner, fmt.Sprintf("-%d-", p.cmd.Process.Pid)) {
			return true
		}
	}
	return false
}

// TestFaultBrokerUnreachable cuts the relay from NATS (a TCP proxy drops
// every connection) for a while: nothing is lost, no attempt is spent, and
// the relay recovers by itself.
func TestFaultBrokerUnreachable(t *testing.T) {
	t.Parallel()
	for _, src := range sources {
		t.Run(src, func(t *testing.T) {
			t.Parallel()
			s := newScenarioFor(t, src)
			proxy, err := faultproxy.Start(strings.TrimPrefix(testenv.NATSURL(), "nats://"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { proxy.Close() })
			var extra []string
			if src == "cdc" {
				// Log tailing keeps attempts in memory (the table's column
				// stays 0): with one attempt allowed, any attempt the outage
				// spent shows as a dead letter below.
				extra = []string{"--max-attempts", "1"}
			}
			args := s.args(extra...)
			for i, a := range args {
				if a == testenv.NATSURL() {
					args[i] = "nats://" + proxy.Addr()
				}
			}
			startRelay(t, args...)
			wait := writeAsyncIn(t, s.db.pool, s.tb, workload.Config{Aggregates: 30, Transactions: 800, Writers: 4})
			testenv.WaitStreamMsgs(t, s.stream, 50, 60*time.Second)
			proxy.Cut()
			time.Sleep(3 * time.Second) // the outage
			if src == "poll" {
				var attempts int
				if err := s.db.pool.QueryRow(context.Background(), `SELECT coalesce(max(attempts), 0) FROM `+s.tb.Qualified("")).Scan(&attempts); err != nil {
					t.Fatal(err)
				}
				if attempts != 0 {
					t.Fatalf("the outage spent attempts: max attempts %d", attempts)
				}
			}
			proxy.Restore()
			res := wait()
			s.check(t, res, 100)
			if st, _ := outboxpgx.New(s.db.pool).Status(context.Background(), s.tb); st.DeadLetters != 0 {
				t.Fatalf("%d events dead-lettered by a broker outage", st.DeadLetters)
			}
		})
	}
}

// TestFaultPoisonEvent sends an event the broker refuses (too large): it is
// dead-lettered with its cause, every other aggregate is delivered in full,
// and its aggregate's later events wait (hold) until an operator discards
// it, then flow in order.
func TestFaultPoisonEvent(t *testing.T) {
	t.Parallel()
	forSources(t, testFaultPoisonEvent)
}

func testFaultPoisonEvent(t *testing.T, src string) {
	s := newScenarioFor(t, src)
	pool := s.db.pool
	ctx := context.Background()
	insert := func(agg string, v int, payload string) string {
		var id string
		err := pool.QueryRow(ctx, `INSERT INTO `+s.tb.Qualified("")+` (id, aggregatetype, aggregateid, type, payload)
			VALUES (gen_random_uuid(), 'order', $1, 'Changed', $2::jsonb) RETURNING id::text`, agg, payload).Scan(&id)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	body := func(agg string, v int) string { return fmt.Sprintf(`{"agg":%q,"v":%d}`, agg, v) }
	insert("poison", 1, body("poison", 1))
	poisonID := insert("poison", 2, fmt.Sprintf(`{"agg":"poison","v":2,"pad":%q}`, strings.Repeat("x", 2<<20)))
	insert("poison", 3, body("poison", 3))
	insert("poison", 4, body("poison", 4))
	startRelay(t, s.args()...)
	res, err := workload.Run(ctx, pool, s.tb, workload.Config{Aggregates: 50, Transactions: 500, Writers: 4})
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitStreamMsgs(t, s.stream, uint64(res.Committed()+1), 60*time.Second)
	// The dead letter is listed with its cause.
	var dls []outboxdriver.DeadLetter
	await.Eventually(t, 30*time.Second, func() error {
		out, stderr, code := run(t, nil, append([]string{"dlq", "list", "--json"}, s.db.flags...)...)
		if code != 0 {
			t.Fatal(stderr)
		}
		if err := json.Unmarshal([]byte(out), &dls); err != nil {
			t.Fatalf("dlq list --json printed %q: %v", out, err)
		}
		if len(dls) == 0 {
			return errors.New("the poison event never reached the dead-letter table")
		}
		return nil
	})
	if dls[0].ID != poisonID || !dls[0].Held || !strings.Contains(dls[0].LastError, "max_payload") {
		t.Fatalf("dead letter %+v", dls[0])
	}
	// Everything else arrived; poison v3 and v4 are held back.
	if poison := versionsOf(t, s.stream, "poison"); fmt.Sprint(poison) != "[1]" {
		t.Fatalf("poison aggregate delivered %v before an operator acted; want only [1]", poison)
	}
	if _, err := workload.Check(res, withoutAggregate(natsDeliveries(t, s.stream), "poison")); err != nil {
		t.Fatal(err)
	}
	// retry puts it back (it fails again: still too large), discard frees
	// the aggregate; both are audited.
	if _, stderr, code := run(t, nil, append([]string{"dlq", "retry", poisonID, "--actor", "alice"}, s.db.flags...)...); code != 0 {
		t.Fatal(stderr)
	}
	first := dls[0].DeadLetteredAt
	await.Eventually(t, 30*time.Second, func() error {
		page, _ := outboxpgx.New(pool).FindDeadLetters(ctx, s.tb, outboxdriver.DeadLetterQuery{Limit: 10})
		dls = page.DeadLetters
		// A retried event starts with fresh attempts; a permanent refusal
		// dead-letters it again at its first.
		if len(dls) != 1 || !dls[0].DeadLetteredAt.After(first) || dls[0].Attempts != 1 {
			return fmt.Errorf("retried poison event not dead-lettered again: %+v", dls)
		}
		return nil
	})
	if _, stderr, code := run(t, nil, append([]string{"dlq", "discard", poisonID, "--actor", "bob"}, s.db.flags...)...); code != 0 {
		t.Fatal(stderr)
	}
	testenv.WaitStreamMsgs(t, s.stream, uint64(res.Committed()+3), 30*time.Second)
	if poison := versionsOf(t, s.stream, "poison"); fmt.Sprint(poison) != "[1 3 4]" {
		t.Fatalf("poison aggregate delivered %v after discard, want [1 3 4]", poison)
	}
	audit, err := outboxpgx.New(pool).FindAudit(ctx, s.tb, outboxdriver.AuditQuery{Limit: 10})
	if err != nil || len(audit) != 2 || audit[0].Actor != "bob" || audit[0].Action != "discard" || audit[1].Actor != "alice" || audit[1].Action != "retry" {
		t.Fatalf("audit = %+v, %v", audit, err)
	}
}

// versionsOf lists, in stream order, the versions of agg's events.
func versionsOf(t *testing.T, st jetstream.Stream, agg string) []int {
	t.Helper()
	var vs []int
	for _, m := range testenv.StreamMessages(t, st) {
		var p workload.Payload
		if err := json.Unmarshal(m.Data, &p); err != nil {
			t.Fatalf("message %s: %v", m.Header.Get("id"), err)
		}
		if p.Agg == agg {
			vs = append(vs, p.V)
		}
	}
	return vs
}

func withoutAggregate(ds []workload.Delivery, agg string) []workload.Delivery {
	var out []workload.Delivery
	for _, d := range ds {
		if d.Key != agg {
			out = append(out, d)
		}
	}
	return out
}

// TestFaultThreeRelaysChurn runs three relays on one table while writers
// commit, SIGKILLing one and starting a new one every second or so (with
// log tailing, one of them streams and two stand by).
func TestFaultThreeRelaysChurn(t *testing.T) {
	t.Parallel()
	for _, src := range sources {
		t.Run(src, func(t *testing.T) {
			t.Parallel()
			s := newScenarioFor(t, src)
			wait := writeAsyncIn(t, s.db.pool, s.tb, workload.Config{Aggregates: 200, Transactions: 3000, Writers: 6, RollbackPct: 10, LatePct: 2, LateDelay: 100 * time.Millisecond})
			relays := []*relayProc{startRelay(t, s.args()...), startRelay(t, s.args()...), startRelay(t, s.args()...)}
			kills := 0
			for i := range 6 {
				time.Sleep(time.Duration(800+rand.IntN(700)) * time.Millisecond)
				k := i % len(relays)
				relays[k].kill()
				kills++
				relays[k] = startRelay(t, s.args()...)
			}
			res := wait()
			s.check(t, res, kills*20*3*relay.DefaultLanes)
		})
	}
}

// TestFaultFailOverWithinTwoTTLs SIGKILLs one of two relays and measures
// how long its partitions stay without a live owner: about two lease TTLs
// at most (one for the lease to expire, a third for the survivor's next
// upkeep), plus slack for a loaded CI machine.
func TestFaultFailOverWithinTwoTTLs(t *testing.T) {
	t.Parallel()
	forSources(t, testFaultFailOverWithinTwoTTLs)
}

func testFaultFailOverWithinTwoTTLs(t *testing.T, src string) {
	s := newScenarioFor(t, src)
	const ttl = 2 * time.Second
	args := s.args("--lease-ttl", ttl.String())
	a := startRelay(t, args...)
	b := startRelay(t, args...)
	// Polling: both share the partitions. Log tailing: one streams, the
	// other stands by.
	taken := func(m map[string]int) bool {
		if src == "cdc" {
			return m[""] == 0 && (a.owns(m) || b.owns(m))
		}
		return m[""] == 0 && a.owns(m) && b.owns(m)
	}
	await.Eventually(t, 30*time.Second, func() error {
		if m := s.owners(t); !taken(m) {
			return fmt.Errorf("the relays never took the partitions: %v", m)
		}
		return nil
	})
	victim := a
	if !a.owns(s.owners(t)) {
		victim = b // the streamer
	}
	victim.kill()
	killed := time.Now()
	await.Eventually(t, 2*ttl+2*time.Second, func() error {
		if m := s.owners(t); m[""] > 0 || victim.owns(m) {
			return fmt.Errorf("since the SIGKILL the partitions are still %v; want one live owner within about two TTLs (%s)", m, 2*ttl)
		}
		return nil
	})
	t.Logf("partitions moved %s after the SIGKILL (lease TTL %s)", time.Since(killed).Round(time.Millisecond), ttl)
	// And they work: an event in any partition is delivered.
	res, err := workload.Run(context.Background(), s.db.pool, s.tb, workload.Config{Aggregates: 64, Transactions: 200, Writers: 4})
	if err != nil {
		t.Fatal(err)
	}
	s.check(t, res, 0)
}

// TestFaultDatabaseConnectionsTerminated ends every database connection of
// a running relay process (pg_terminate_backend), again and again, while
// writers commit: it reconnects each time and loses nothing.
func TestFaultDatabaseConnectionsTerminated(t *testing.T) {
	t.Parallel()
	forSources(t, testFaultDatabaseConnectionsTerminated)
}

func testFaultDatabaseConnectionsTerminated(t *testing.T, src string) {
	s := newScenarioFor(t, src)
	app := testenv.Name("relay")
	args := s.args()
	for i := range args[:len(args)-1] {
		if args[i] == "--db" {
			sep := "?"
			if strings.Contains(args[i+1], "?") {
				sep = "&"
			}
			args[i+1] += sep + "application_name=" + app
		}
	}
	startRelay(t, args...)
	wait := writeAsyncIn(t, s.db.pool, s.tb, workload.Config{Aggregates: 40, Transactions: 1000, Writers: 4, RollbackPct: 5})
	// Past start-up (where a failed check ends the process with an error, as
	// it should), the relay is at work.
	testenv.WaitStreamMsgs(t, s.stream, 20, 60*time.Second)
	pool := s.db.pool
	terminated := 0
	for range 6 {
		time.Sleep(300 * time.Millisecond)
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err != nil {
			t.Fatal(err)
		}
		terminated += n
	}
	if terminated == 0 {
		t.Fatal("no connection of the relay was terminated; the test proves nothing")
	}
	res := wait()
	s.check(t, res, 6*20*relay.DefaultLanes)
	t.Logf("%d relay connections terminated", terminated)
}
