package bench_test

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/cmd/outbox/internal/bench"
	"github.com/outboxkit/outbox/internal/testenv"
)

// kinesaliteURL is the bench's sink URL for kinesalite, where .ci/test
// starts it.
const kinesaliteURL = "kinesis://?region=us-east-1&endpoint=http://127.0.0.1:4567"

// TestDrainCloudBrokers runs the drain scenario on a small backlog against
// an in-process Pub/Sub server and kinesalite: the relay and the raw
// client each move the whole backlog (the scenario fails when the consumer
// misses an event or rows are left), in the same run, and the relay is
// compared with the lower limit.
func TestDrainCloudBrokers(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "test") // kinesalite takes any credentials
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	for name, sinkURL := range map[string]string{"pubsub": bench.PubSubInProcess, "kinesis": kinesaliteURL} {
		t.Run(name, func(t *testing.T) {
			if name == "kinesis" {
				if c, err := net.DialTimeout("tcp", "127.0.0.1:4567", 2*time.Second); err != nil {
					t.Fatalf("kinesalite is not reachable at 127.0.0.1:4567: %v; start it with: npm ci --prefix .ci/node && node .ci/node/node_modules/kinesalite/cli.js --port 4567 --createStreamMs 0 --deleteStreamMs 0 --shardLimit 1000 & (bash .ci/test --setup-only does)", err)
				} else {
					c.Close()
				}
			}
			pool := bigPool(t)
			ctx := testenv.Context(t, 3*time.Minute)
			res, err := bench.Drain(ctx, bench.Config{Pool: pool, Schema: testenv.Name("bench"), Events: 1500, Batch: 200, Sink: sinkURL})
			if err != nil {
				t.Fatal(err)
			}
			if len(res) != 3 {
				t.Fatalf("%d results, want raw_sql, raw_broker, relay", len(res))
			}
			for i, c := range []string{bench.CaseDrainSQL, bench.CaseDrainBroker, bench.CaseDrainRelay} {
				r := res[i]
				if r.Case != c || r.Ops != 1500 || r.PerSecond <= 0 || r.Delivery == nil || r.Delivery.Events != 1500 {
					t.Fatalf("result %d: %+v", i, r)
				}
			}
			if want := map[string]string{"pubsub": "Google Pub/Sub: in-process pstest", "kinesis": "Amazon Kinesis: endpoint http://127.0.0.1:4567"}[name]; !strings.HasPrefix(res[2].Delivery.Broker, want) {
				t.Errorf("broker %q, want it to start with %q", res[2].Delivery.Broker, want)
			}
			relay := res[2].Delivery
			if want := res[2].PerSecond / min(res[0].PerSecond, res[1].PerSecond); relay.VsLimit != want {
				t.Fatalf("relay figures %+v, want vs limit %.3f", relay, want)
			}
		})
	}
}

// A bench sink URL that names what the bench makes itself is refused.
func TestDrainCloudBrokerURLs(t *testing.T) {
	pool := bigPool(t)
	ctx := testenv.Context(t, time.Minute)
	for raw, want := range map[string]string{
		"pubsub://proj/topic":               "the bench makes topics of its own",
		"kinesis://mine?region=us-east-1":   "leave the stream out",
		"kinesis://?region=us-east-1&bad=1": "unknown parameter",
	} {
		_, err := bench.Drain(ctx, bench.Config{Pool: pool, Schema: testenv.Name("bench"), Events: 10, Sink: raw})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("sink %q: %v, want an error with %q", raw, err, want)
		}
	}
}
