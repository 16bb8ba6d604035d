package kinesissink

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"go.uber.org/goleak"

	"github.com/outboxkit/outbox/internal/faultproxy"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/sinktest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// kinesaliteAddr is where .ci/test starts kinesalite.
const kinesaliteAddr = "127.0.0.1:4567"

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

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
	})
}

// reachable fails the test when kinesalite is not running.
func reachable(t *testing.T) {
	t.Helper()
	c, err := net.DialTimeout("tcp", kinesaliteAddr, 2*time.Second)
	if err != nil {
		t.Fatalf("kinesalite is not reachable at %s: %v; start it with: npm install --prefix .ci/node kinesalite && node .ci/node/node_modules/kinesalite/cli.js --port 4567 --createStreamMs 0 --shardLimit 1000 & (bash .ci/test --setup-only does)", kinesaliteAddr, err)
	}
	c.Close()
}

func ctx10s(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// env is one test's namespace on kinesalite, reached through a fault proxy.
type env struct {
	admin  *kinesis.Client
	proxy  *faultproxy.Proxy
	prefix string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	reachable(t)
	p, err := faultproxy.Start(kinesaliteAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return &env{admin: client(t, kinesaliteAddr), proxy: p, prefix: testenv.Name("k")}
}

// stream creates stream name (three shards) once and waits for it.
func (e *env) stream(t *testing.T, name string) string {
	t.Helper()
	st := e.prefix + "-" + name
	_, err := e.admin.CreateStream(ctx10s(t), &kinesis.CreateStreamInput{StreamName: aws.String(st), ShardCount: aws.Int32(3)})
	var inUse *types.ResourceInUseException
	if err != nil && !errors.As(err, &inUse) {
		t.Fatalf("create stream %s: %v", st, err)
	}
	w := kinesis.NewStreamExistsWaiter(e.admin, func(o *kinesis.StreamExistsWaiterOptions) { o.MinDelay = 50 * time.Millisecond })
	if err := w.Wait(ctx10s(t), &kinesis.DescribeStreamInput{StreamName: aws.String(st)}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.admin.DeleteStream(context.Background(), &kinesis.DeleteStreamInput{StreamName: aws.String(st)})
	})
	return st
}

type envelope struct {
	ID            string  `json:"id"`
	Destination   string  `json:"destination"`
	Key           *string `json:"key"`
	KeyBase64     string  `json:"key_base64"`
	Headers       []struct{ Key, Value string }
	Payload       json.RawMessage `json:"payload"`
	PayloadBase64 *string         `json:"payload_base64"`
}

// held reads every record of streams, shard by shard.
func (e *env) held(t *testing.T, streams []string) []sinktest.Received {
	t.Helper()
	var got []sinktest.Received
	for _, st := range streams {
		shards, err := e.admin.ListShards(ctx10s(t), &kinesis.ListShardsInput{StreamName: aws.String(st)})
		if err != nil {
			t.Fatalf("list shards of %s: %v", st, err)
		}
		for _, sh := range shards.Shards {
			it, err := e.admin.GetShardIterator(ctx10s(t), &kinesis.GetShardIteratorInput{
				StreamName: aws.String(st), ShardId: sh.ShardId, ShardIteratorType: types.ShardIteratorTypeTrimHorizon})
			if err != nil {
				t.Fatal(err)
			}
			iter := it.ShardIterator
			for iter != nil {
				out, err := e.admin.GetRecords(ctx10s(t), &kinesis.GetRecordsInput{ShardIterator: iter})
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range out.Records {
					got = append(got, decode(t, st, r))
				}
				if len(out.Records) == 0 {
					break
				}
				iter = out.NextShardIterator
			}
		}
	}
	return got
}

func decode(t *testing.T, stream string, r types.Record) sinktest.Received {
	t.Helper()
	var env envelope
	if err := json.Unmarshal(r.Data, &env); err != nil {
		t.Fatalf("record %s: envelope: %v", aws.ToString(r.SequenceNumber), err)
	}
	if env.Destination != stream {
		t.Errorf("record %s: envelope destination %q on stream %q", env.ID, env.Destination, stream)
	}
	hs := map[string][]string{}
	for _, h := range env.Headers {
		hs[h.Key] = append(hs[h.Key], h.Value)
	}
	var key []byte
	if env.Key != nil && *env.Key != "" {
		key = []byte(*env.Key)
		if aws.ToString(r.PartitionKey) != *env.Key {
			t.Errorf("record %s: partition key %q, key %q", env.ID, aws.ToString(r.PartitionKey), *env.Key)
		}
	}
	var value []byte
	switch {
	case env.PayloadBase64 != nil:
		v, err := base64.StdEncoding.DecodeString(*env.PayloadBase64)
		if err != nil {
			t.Fatal(err)
		}
		value = v
	case string(env.Payload) != "null" && len(env.Payload) > 0:
		value = env.Payload
	}
	return sinktest.Received{ID: env.ID, Destination: stream, Key: key, Value: value, Headers: hs}
}

func (e *env) read(t *testing.T, streams []string, want int) []sinktest.Received {
	t.Helper()
	// Up to 10s for want messages, then 200ms for duplicates and
	// stragglers; the suite judges what arrived.
	_ = await.Poll(10*time.Second, func() error {
		if n := len(e.held(t, streams)); n < want {
			return fmt.Errorf("%d of %d messages arrived", n, want)
		}
		return nil
	})
	time.Sleep(200 * time.Millisecond)
	return e.held(t, streams)
}

// TestConformance runs the sink conformance suite against kinesalite, one
// set of three-shard streams per test, with the sink behind a fault proxy.
func TestConformance(t *testing.T) {
	e := sinktest.PerTest(newEnv)
	sinktest.Run(t, sinktest.Harness{
		New: func(t *testing.T) sink.Sink {
			s, err := New(client(t, e(t).proxy.Addr()), &Config{Logger: quiet, RetryDelay: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Dest: func(t *testing.T, name string) string { return e(t).stream(t, name) },
		Read: func(t *testing.T, dests []string, want int) []sinktest.Received {
			return e(t).read(t, dests, want)
		},
		DedupeKey: false, // Kinesis does not de-duplicate
		KeyHeader: "",    // the partition key, and the envelope's "key"
		TooLarge: func(t *testing.T, dest string) *sink.Message {
			return &sink.Message{Destination: dest, Key: []byte("k"), Value: make([]byte, maxRecordBytes)}
		},
		Outage: func(t *testing.T) func() {
			p := e(t).proxy
			p.Cut()
			return p.Restore
		},
	})
}
