package kinesisconsumer_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/inbox/consumertest"
	"github.com/outboxkit/outbox/inbox/internal/pgstore"
	"github.com/outboxkit/outbox/inbox/kinesisconsumer"
	"github.com/outboxkit/outbox/internal/faultproxy"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/kinesissink"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// kinesaliteAddr is where .ci/test starts kinesalite.
const kinesaliteAddr = "127.0.0.1:4567"

// client returns a Kinesis client for the endpoint addr, with the static
// credentials kinesalite accepts.
func client(t *testing.T, addr string) *kinesis.Client {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(hc.CloseIdleConnections)
	return kinesis.New(kinesis.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String("http://" + addr),
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		HTTPClient:   hc,
		Retryer:      aws.NopRetryer{},
	})
}

// reachable fails the test when kinesalite is not running.
func reachable(t *testing.T) {
	t.Helper()
	c, err := net.DialTimeout("tcp", kinesaliteAddr, 2*time.Second)
	if err != nil {
		t.Fatalf("kinesalite is not reachable at %s: %v; start it with: npm install --prefix .ci/node kinesalite && node .ci/node/node_modules/kinesalite/cli.js --port 4567 --createStreamMs 0 --shardLimit 1000 & (bash .ci/test --setup-only does)", kinesaliteAddr, err)
	}
	_ = c.Close()
}

// memCheckpoints is a checkpoint store shared by a test's adapters, as a
// database table would be; a view of it stops saving once its adapter
// crashed.
type memCheckpoints struct {
	mu sync.Mutex
	m  map[string]string
}

func (s *memCheckpoints) get(shard string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[shard]
}

type view struct {
	s    *memCheckpoints
	dead atomic.Bool
}

func (v *view) Get(_ context.Context, _, shard string) (string, error) { return v.s.get(shard), nil }

func (v *view) Set(_ context.Context, _, shard, seq string) error {
	if v.dead.Load() {
		return errors.New("the process is dead")
	}
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	v.s.m[shard] = seq
	return nil
}

// kinesisEnv is one test's stream of three shards on kinesalite,
// published to by kinesissink.
type kinesisEnv struct {
	admin  *kinesis.Client
	stream string
	sink   *kinesissink.Sink
	cps    *memCheckpoints

	mu    sync.Mutex
	views map[consumertest.Adapter]*view
	proxy map[consumertest.Adapter]*faultproxy.Proxy
}

func newKinesisEnv(t *testing.T) *kinesisEnv {
	t.Helper()
	reachable(t)
	e := &kinesisEnv{admin: client(t, kinesaliteAddr), stream: testenv.Name("k"), cps: &memCheckpoints{m: map[string]string{}},
		views: map[consumertest.Adapter]*view{}, proxy: map[consumertest.Adapter]*faultproxy.Proxy{}}
	ctx := testenv.Context(t, 30*time.Second)
	if _, err := e.admin.CreateStream(ctx, &kinesis.CreateStreamInput{StreamName: aws.String(e.stream), ShardCount: aws.Int32(3)}); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	t.Cleanup(func() {
		_, _ = e.admin.DeleteStream(context.Background(), &kinesis.DeleteStreamInput{StreamName: aws.String(e.stream)})
	})
	w := kinesis.NewStreamExistsWaiter(e.admin, func(o *kinesis.StreamExistsWaiterOptions) { o.MinDelay = 50 * time.Millisecond })
	if err := w.Wait(ctx, &kinesis.DescribeStreamInput{StreamName: aws.String(e.stream)}, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	s, err := kinesissink.New(e.admin, &kinesissink.Config{Stream: e.stream})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	e.sink = s
	return e
}

// seqLess compares Kinesis sequence numbers (decimal strings).
func seqLess(a, b string) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}

// unhandled counts the records after each shard's checkpoint.
func (e *kinesisEnv) unhandled(t *testing.T) (int, error) {
	ctx := testenv.Context(t, 30*time.Second)
	shards, err := e.admin.ListShards(ctx, &kinesis.ListShardsInput{StreamName: aws.String(e.stream)})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, s := range shards.Shards {
		cp := e.cps.get(aws.ToString(s.ShardId))
		if cp == kinesisconsumer.ShardEnd {
			continue
		}
		it, err := e.admin.GetShardIterator(ctx, &kinesis.GetShardIteratorInput{StreamName: aws.String(e.stream), ShardId: s.ShardId, ShardIteratorType: types.ShardIteratorTypeTrimHorizon})
		if err != nil {
			return 0, err
		}
		iter := it.ShardIterator
		for iter != nil {
			res, err := e.admin.GetRecords(ctx, &kinesis.GetRecordsInput{ShardIterator: iter})
			if err != nil {
				return 0, err
			}
			for _, r := range res.Records {
				if cp == "" || seqLess(cp, aws.ToString(r.SequenceNumber)) {
					n++
				}
			}
			if len(res.Records) == 0 || res.MillisBehindLatest != nil && *res.MillisBehindLatest == 0 {
				break
			}
			iter = res.NextShardIterator
		}
	}
	return n, nil
}

func (e *kinesisEnv) start(t *testing.T, ib *inbox.Inbox[pgx.Tx], h consumer.Handler[pgx.Tx], cfg consumer.Config) *kinesisconsumer.Consumer[pgx.Tx] {
	t.Helper()
	proxy, err := faultproxy.Start(kinesaliteAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	v := &view{s: e.cps}
	c, err := kinesisconsumer.New(client(t, proxy.Addr()), ib, h, &kinesisconsumer.Config{Config: cfg, Stream: e.stream, Checkpoints: v,
		PollInterval: 100 * time.Millisecond, CheckpointInterval: 200 * time.Millisecond, ShardSyncInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(testenv.Context(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	e.mu.Lock()
	e.views[c], e.proxy[c] = v, proxy
	e.mu.Unlock()
	return c
}

// TestConformance runs the consumer conformance suite on kinesalite and
// the real PostgreSQL, publishing with kinesissink; checkpoints live in a
// store shared by the test's adapters, which a crashed adapter can no
// longer write.
func TestConformance(t *testing.T) {
	env := consumertest.PerTest(newKinesisEnv)
	consumertest.Run(t, consumertest.Harness[pgx.Tx]{
		Store: pgstore.New,
		Dest:  func(t *testing.T, _ string) string { return env(t).stream },
		Publish: func(t *testing.T, msgs []sink.Message) {
			consumertest.PublishAll(t, env(t).sink, msgs)
		},
		Start: func(t *testing.T, ib *inbox.Inbox[pgx.Tx], h consumer.Handler[pgx.Tx], cfg consumer.Config) consumertest.Adapter {
			return env(t).start(t, ib, h, cfg)
		},
		Crash: func(t *testing.T, a consumertest.Adapter) {
			e := env(t)
			e.mu.Lock()
			defer e.mu.Unlock()
			e.views[a].dead.Store(true)
			e.proxy[a].Cut()
		},
		Pending: func(t *testing.T) (int, error) {
			n, err := env(t).unhandled(t)
			if err != nil {
				return 0, fmt.Errorf("count the records after the checkpoints: %w", err)
			}
			return n, nil
		},
		Ordered: true,
		Settle:  30 * time.Second,
	})
}
