package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/internal/workload"
)

// TestEndToEndKinesis runs the relay against kinesalite (started by
// .ci/test on 127.0.0.1:4567) with the SDK's endpoint override: every
// committed event arrives, each aggregate's events in commit order on its
// shard, the partition key being the aggregate id.
func TestEndToEndKinesis(t *testing.T) {
	t.Parallel()
	const addr = "127.0.0.1:4567"
	if c, err := net.DialTimeout("tcp", addr, 2*time.Second); err != nil {
		t.Fatalf("kinesalite is not reachable at %s: %v; start it with: npm install --prefix .ci/node kinesalite && node .ci/node/node_modules/kinesalite/cli.js --port 4567 --createStreamMs 0 --shardLimit 1000 & (bash .ci/test --setup-only does)", addr, err)
	} else {
		c.Close()
	}
	tb, flags := migrated(t)
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	admin := kinesis.New(kinesis.Options{Region: "us-east-1", BaseEndpoint: aws.String("http://" + addr),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""), HTTPClient: hc})
	stream := testenv.Name("e2e")
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	if _, err := admin.CreateStream(ctx, &kinesis.CreateStreamInput{StreamName: aws.String(stream), ShardCount: aws.Int32(4)}); err != nil {
		t.Fatal(err)
	}
	defer admin.DeleteStream(context.Background(), &kinesis.DeleteStreamInput{StreamName: aws.String(stream)})
	if err := kinesis.NewStreamExistsWaiter(admin).Wait(ctx, &kinesis.DescribeStreamInput{StreamName: aws.String(stream)}, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	startRelayEnv(t, []string{"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test", "AWS_EC2_METADATA_DISABLED=true"},
		append(flags, "--sink", "kinesis://"+stream+"?region=us-east-1&endpoint=http://"+addr)...)
	res, err := workload.Run(ctx, testenv.Pool(t), tb, workload.Config{Aggregates: 40, Transactions: 1500, Writers: 4, RollbackPct: 10})
	if err != nil {
		t.Fatal(err)
	}
	shards, err := admin.ListShards(ctx, &kinesis.ListShardsInput{StreamName: aws.String(stream)})
	if err != nil {
		t.Fatal(err)
	}
	iters := make([]*string, len(shards.Shards))
	for i, sh := range shards.Shards {
		it, err := admin.GetShardIterator(ctx, &kinesis.GetShardIteratorInput{StreamName: aws.String(stream), ShardId: sh.ShardId,
			ShardIteratorType: types.ShardIteratorTypeTrimHorizon})
		if err != nil {
			t.Fatal(err)
		}
		iters[i] = it.ShardIterator
	}
	// Each shard's records in order, one shard after the other: per-key
	// order is per shard.
	perShard := make([][]workload.Delivery, len(iters))
	ids := map[string]bool{}
	// Up to 60s; workload.Check reports what is missing.
	_ = await.Poll(60*time.Second, func() error {
		for i := range iters {
			out, err := admin.GetRecords(ctx, &kinesis.GetRecordsInput{ShardIterator: iters[i]})
			if err != nil {
				t.Fatal(err)
			}
			iters[i] = out.NextShardIterator
			for _, r := range out.Records {
				var env struct {
					ID, Key string
					Payload json.RawMessage
				}
				if err := json.Unmarshal(r.Data, &env); err != nil {
					t.Fatal(err)
				}
				if env.Key != aws.ToString(r.PartitionKey) {
					t.Fatalf("record %s: partition key %q, key %q", env.ID, aws.ToString(r.PartitionKey), env.Key)
				}
				perShard[i] = append(perShard[i], workload.Delivery{ID: env.ID, Key: env.Key, Payload: env.Payload})
				ids[env.ID] = true
			}
		}
		if len(ids) < res.Committed() {
			return fmt.Errorf("%d of %d committed events read", len(ids), res.Committed())
		}
		return nil
	})
	var ds []workload.Delivery
	for _, s := range perShard {
		ds = append(ds, s...)
	}
	if _, err := workload.Check(res, ds); err != nil {
		t.Fatal(err)
	}
}
