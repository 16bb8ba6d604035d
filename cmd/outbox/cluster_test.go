package main

// Clustered brokers under faults: the broker node that leads the outbox's
// stream (NATS JetStream) or partitions (Kafka) dies while a real relay
// publishes, and another node takes over. docs/faults.md (Broker
// clusters) describes the scenarios.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/internal/workload"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

// natsServerBin is the nats-server the cluster tests run.
const natsServerBin = "/usr/sbin/nats-server"

// natsNode is one nats-server process of a test cluster.
type natsNode struct {
	name   string
	url    string
	cmd    *exec.Cmd
	done   chan error
	stderr *testenv.Buffer
}

// natsCluster starts three nats-server processes with JetStream on the
// loopback, on free ports, with their own store directories, routed to
// each other; they are killed when the test ends. It returns once the
// cluster's JetStream answers, with a connection to it.
func natsCluster(t *testing.T) ([]*natsNode, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	if _, err := os.Stat(natsServerBin); err != nil {
		t.Fatalf("the cluster test runs %s: %v (install it with: apt-get install nats-server)", natsServerBin, err)
	}
	const n = 3
	clusterName := testenv.Name("c")
	var clientPorts, routePorts []int
	for range n {
		clientPorts, routePorts = append(clientPorts, freePort(t)), append(routePorts, freePort(t))
	}
	nodes := make([]*natsNode, n)
	for i := range n {
		var routes []string
		for j := range n {
			if j != i {
				routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", routePorts[j]))
			}
		}
		nd := &natsNode{name: fmt.Sprintf("n%d", i), url: fmt.Sprintf("nats://127.0.0.1:%d", clientPorts[i]), done: make(chan error, 1), stderr: &testenv.Buffer{}}
		nd.cmd = exec.Command(natsServerBin, "-a", "127.0.0.1", "-p", strconv.Itoa(clientPorts[i]), "-n", nd.name,
			"-js", "-sd", filepath.Join(t.TempDir(), nd.name),
			"--cluster_name", clusterName, "--cluster", fmt.Sprintf("nats://127.0.0.1:%d", routePorts[i]),
			"--routes", strings.Join(routes, ","))
		nd.cmd.Stderr = nd.stderr
		if err := nd.cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", natsServerBin, err)
		}
		go func() { nd.done <- nd.cmd.Wait() }()
		t.Cleanup(func() {
			nd.kill()
			if t.Failed() {
				t.Logf("nats-server %s:\n%s", nd.name, nd.stderr.String())
			}
		})
		nodes[i] = nd
	}
	nc, err := nats.Connect(natsURLs(nodes), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.Timeout(5*time.Second),
		nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// The meta group elects its leader once the routes are up.
	await.Eventually(t, 60*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := js.AccountInfo(ctx); err != nil {
			return fmt.Errorf("the cluster's JetStream does not answer: %v", err)
		}
		return nil
	})
	return nodes, nc, js
}

func natsURLs(nodes []*natsNode) string {
	var urls []string
	for _, nd := range nodes {
		urls = append(urls, nd.url)
	}
	return strings.Join(urls, ",")
}

// kill ends the node with SIGKILL and waits for it.
func (nd *natsNode) kill() {
	_ = nd.cmd.Process.Signal(syscall.SIGKILL)
	err := <-nd.done
	nd.done <- err
}

// freePort returns a TCP port free on the loopback a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	_, port, err := net.SplitHostPort(freeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(port)
	return n
}

// streamLeader returns the name of the server leading stream name ("" while
// it has none).
func streamLeader(js jetstream.JetStream, name string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, name)
	if err != nil {
		return "", err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return "", err
	}
	if info.Cluster == nil {
		return "", errors.New("the stream has no cluster information")
	}
	return info.Cluster.Leader, nil
}

// metricSum sums the samples of a counter family in a /metrics text whose
// labels contain every one of labels (e.g. `kind="transient"`).
func metricSum(text, family string, labels ...string) float64 {
	sum := 0.0
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(family) + `(\{[^}]*\})? (\S+)$`)
	for _, m := range re.FindAllStringSubmatch(text, -1) {
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(m[1], l)
		}
		if v, err := strconv.ParseFloat(m[2], 64); err == nil && ok {
			sum += v
		}
	}
	return sum
}

// TestClusterLeaderLossNATS runs the relay against a three-node JetStream
// cluster holding the stream with three replicas, and SIGKILLs the node
// that leads the stream while the relay publishes. The two others elect a
// new leader; the relay backs off meanwhile, publishes again once it is
// elected, and says so in its log and metrics; every committed event is
// in the stream, in commit order per aggregate.
func TestClusterLeaderLossNATS(t *testing.T) {
	t.Parallel()
	// The polling relay: the fault is the broker's, and the relay's
	// sources share its sink side (S15, docs/faults.md).
	testClusterLeaderLossNATS(t, "poll")
}

func testClusterLeaderLossNATS(t *testing.T, src string) {
	nodes, _, js := natsCluster(t)
	prefix := testenv.Name("s")
	ctx := context.Background()
	var st jetstream.Stream
	await.Eventually(t, 60*time.Second, func() error {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		var err error
		st, err = js.CreateStream(cctx, jetstream.StreamConfig{Name: prefix, Subjects: []string{prefix + ".>"}, Storage: jetstream.FileStorage, Replicas: 3})
		if err != nil {
			return fmt.Errorf("create an R3 stream: %v", err)
		}
		return nil
	})
	tb, db := migratedFor(t, src)
	addr := freeAddr(t)
	sinkFlags := []string{"--sink", natsURLs(nodes), "--nats-stream", prefix, "--nats-no-create-stream", "--route-replacement", prefix + ".${routedByValue}"}
	p := startRelay(t, append(append(append(append(append([]string{}, db.flags...), db.relayFlags...), sinkFlags...), faultArgs...), "--metrics-addr", addr)...)

	wait := writeAsyncIn(t, db.pool, tb, phaseOne)
	testenv.WaitStreamMsgs(t, st, 200, 60*time.Second)

	// SIGKILL the stream's leader mid-publish.
	leader, err := streamLeader(js, prefix)
	if err != nil || leader == "" {
		t.Fatalf("stream leader %q: %v", leader, err)
	}
	var victim *natsNode
	for _, nd := range nodes {
		if nd.name == leader {
			victim = nd
		}
	}
	if victim == nil {
		t.Fatalf("the stream's leader %q is none of the cluster's nodes", leader)
	}
	victim.kill()
	killed := time.Now()

	// The survivors elect a new leader.
	var next string
	await.Eventually(t, 60*time.Second, func() error {
		l, err := streamLeader(js, prefix)
		if err != nil || l == "" || l == leader {
			return fmt.Errorf("no new stream leader since %s was killed (leader %q, %v)", leader, l, err)
		}
		next = l
		return nil
	})
	elected := time.Since(killed)
	res := afterFault(t, db.pool, tb, wait)
	waitBacklogZeroIn(t, db.pool, tb, 90*time.Second)
	testenv.WaitStreamMsgs(t, st, uint64(res.Committed()), 30*time.Second)
	dups, err := workload.Check(res, natsDeliveries(t, st))
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := outboxpgx.New(db.pool).Status(ctx, tb); st.DeadLetters != 0 {
		t.Fatalf("%d events dead-lettered by a leader election", st.DeadLetters)
	}

	// What the operator sees: the relay backed off while the stream had no
	// leader, counted the failed publishes, and said when it recovered.
	saysOutage(t, p)
	metrics := get(t, "http://"+addr+"/metrics")
	failed := metricSum(metrics, "outbox_publish_errors_total", `kind="transient"`)
	if failed == 0 {
		t.Errorf("outbox_publish_errors_total{kind=\"transient\"} is 0 after the leader was killed mid-publish")
	}
	t.Logf("%d events checked (%d copies dropped by id); %s killed, %s elected %s later; %v transient publish errors; relay log:\n%s",
		res.Committed(), dups, leader, next, elected.Round(time.Millisecond), failed, p.stderr.String())
}

// The cluster tests write phaseOne while the fault hits, and phaseTwo once
// the cluster has a new leader: events that only a new leader can take, so
// that finding them all in the stream or topic shows that publishing
// resumed.
var (
	phaseOne = workload.Config{Aggregates: 100, Transactions: 2000, Writers: 4, RollbackPct: 5}
	phaseTwo = workload.Config{Aggregates: 100, Transactions: 200, Writers: 4, RollbackPct: 5}
)

// afterFault waits for phase one's writes, writes phase two and returns
// both.
func afterFault(t *testing.T, pool *pgxpool.Pool, tb outboxdriver.Table, wait func() *workload.Result) *workload.Result {
	t.Helper()
	res := wait()
	two, err := workload.Run(context.Background(), pool, tb, phaseTwo)
	if err != nil {
		t.Fatal(err)
	}
	res.Add(two)
	return res
}

// saysOutage waits for relay p to have logged a broker outage and its end.
func saysOutage(t *testing.T, p *relayProc) {
	t.Helper()
	await.Eventually(t, 30*time.Second, func() error {
		logs := p.stderr.String()
		for _, want := range []string{"relay: the broker is unreachable", "relay: recovered: the broker takes messages again"} {
			if !strings.Contains(logs, want) {
				return fmt.Errorf("the relay's log does not say %q:\n%s", want, logs)
			}
		}
		return nil
	})
}

// brokerListeners wraps the listeners of a kfake cluster's brokers so that
// a test can kill one: its open connections are cut, and a connection it
// accepts later is closed at once.
type brokerListeners struct {
	mu sync.Mutex
	ls map[string]*killableListener // by address
}

func (b *brokerListeners) listen(network, address string) (net.Listener, error) {
	ln, err := net.Listen(network, address)
	if err != nil {
		return nil, err
	}
	kl := &killableListener{Listener: ln}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ls == nil {
		b.ls = map[string]*killableListener{}
	}
	b.ls[ln.Addr().String()] = kl
	return kl, nil
}

// kill kills the broker listening on addr.
func (b *brokerListeners) kill(t *testing.T, addr string) {
	t.Helper()
	b.mu.Lock()
	kl := b.ls[addr]
	b.mu.Unlock()
	if kl == nil {
		t.Fatalf("no broker listens on %s", addr)
	}
	kl.kill()
}

type killableListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
	dead  bool
}

func (l *killableListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead {
		c.Close()
	} else {
		l.conns = append(l.conns, c)
	}
	return c, nil
}

func (l *killableListener) kill() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dead = true
	for _, c := range l.conns {
		c.Close()
	}
	l.conns = nil
}

// hwm sums the high watermarks of topic's partitions: the records the
// cluster holds.
func hwm(c *kfake.Cluster, topic string) int64 {
	var n int64
	for _, p := range c.PartitionInfos(topic) {
		n += p.HighWatermark
	}
	return n
}

// TestClusterLeaderLossKafka runs the relay against a three-broker Kafka
// cluster (kfake) while partition leadership moves: first every partition
// moves to another broker (an orderly reassignment), then the broker that
// leads partition 0 dies (its connections cut, its listener closed) and
// the survivors take over its partitions. The relay's client finds the new
// leaders and goes on; every committed event is in the topic, in commit
// order per aggregate within its partition.
func TestClusterLeaderLossKafka(t *testing.T) {
	t.Parallel()
	testClusterLeaderLossKafka(t, "poll")
}

func testClusterLeaderLossKafka(t *testing.T, src string) {
	const topic, partitions = "outbox.event.order", 6
	var lns brokerListeners
	cluster, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(partitions, topic), kfake.ListenFn(lns.listen))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	addrs := cluster.ListenAddrs() // node i listens on addrs[i]
	tb, db := migratedFor(t, src)
	addr := freeAddr(t)
	p := startRelay(t, append(append(append(append([]string{}, db.flags...), db.relayFlags...), faultArgs...),
		"--sink", "kafka://"+strings.Join(addrs, ","), "--metrics-addr", addr)...)

	ctx := context.Background()
	wait := writeAsyncIn(t, db.pool, tb, phaseOne)
	records := func(n int64) func() error {
		return func() error {
			if h := hwm(cluster, topic); h < n {
				return fmt.Errorf("the topic holds %d records, want %d", h, n)
			}
			return nil
		}
	}
	await.Eventually(t, 60*time.Second, records(200))

	// An orderly reassignment: every partition moves to the next broker.
	for _, pi := range cluster.PartitionInfos(topic) {
		if err := cluster.MoveTopicPartition(topic, pi.Partition, (pi.Leader+1)%3); err != nil {
			t.Fatal(err)
		}
	}
	await.Eventually(t, 60*time.Second, records(hwm(cluster, topic)+200))

	// The leader of partition 0 dies; the survivors take its partitions.
	victim := cluster.LeaderFor(topic, 0)
	if err := cluster.RemoveNode(victim); err != nil {
		t.Fatal(err)
	}
	lns.kill(t, addrs[victim])
	for _, pi := range cluster.PartitionInfos(topic) {
		if pi.Leader == victim {
			t.Fatalf("partition %d is still led by the dead broker %d", pi.Partition, victim)
		}
	}
	res := afterFault(t, db.pool, tb, wait)
	waitBacklogZeroIn(t, db.pool, tb, 90*time.Second)
	checkKafka(t, addrs, topic, res, nil)
	if st, _ := outboxpgx.New(db.pool).Status(ctx, tb); st.DeadLetters != 0 {
		t.Fatalf("%d events dead-lettered by a leader change", st.DeadLetters)
	}

	// What the operator sees: the Kafka client's warning naming the dead
	// broker; and when a produce waited past half the lease TTL, the
	// relay's outage lines and failed publishes.
	logs := p.stderr.String()
	dead := regexp.MustCompile(`level=WARN msg="kafka client: [^"]*".* broker=` + strconv.Itoa(int(victim)) + `\b`)
	if !dead.MatchString(logs) {
		t.Errorf("the relay's log has no warning of the Kafka client naming broker %d:\n%s", victim, logs)
	}
	metrics := get(t, "http://"+addr+"/metrics")
	failed := metricSum(metrics, "outbox_publish_errors_total", `kind="transient"`)
	if strings.Contains(logs, "relay: the broker is unreachable") {
		saysOutage(t, p)
		if failed == 0 {
			t.Errorf("the relay logged a broker outage but outbox_publish_errors_total{kind=\"transient\"} is 0")
		}
	}
	t.Logf("%d events checked; broker %d killed; %d records in the topic; %v transient publish errors; relay log:\n%s",
		res.Committed(), victim, hwm(cluster, topic), failed, p.stderr.String())
}
