package relayd_test

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/relayd"
)

// countingMetrics counts the publishes it is told of.
type countingMetrics struct{ published atomic.Int64 }

func (*countingMetrics) Claimed(int)                       {}
func (m *countingMetrics) Published(string, time.Duration) { m.published.Add(1) }
func (*countingMetrics) PublishFailed(string, bool)        {}
func (*countingMetrics) Retried(string)                    {}
func (*countingMetrics) DeadLettered(string)               {}
func (*countingMetrics) PartitionsOwned(int)               {}

// The caller's Relay.Config.Metrics and the Prometheus metrics of
// Options.Registerer both count every publish: setting one does not
// replace the other. Source and Sink give the caller what the relay runs
// with.
func TestRegistererAndMetricsBothCount(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	ob, err := outbox.New(outboxpgx.New(pool), &outbox.Config{Schema: tb.Schema, Table: tb.Name})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Migrate(ctx, nil); err != nil {
		t.Fatal(err)
	}
	own := &countingMetrics{}
	reg := prometheus.NewRegistry()
	snk := newTrackedSink()
	rl, err := relayd.Open(ctx, testenv.DatabaseURL(), snk, &relayd.Options{
		Schema: tb.Schema, Table: tb.Name, Registerer: reg,
		Relay: relay.Config{Metrics: own, PollInterval: 50 * time.Millisecond, LeaseTTL: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Stop(context.WithoutCancel(ctx))
	if rl.Sink() != snk {
		t.Fatalf("Sink() = %v, want the sink given to Open", rl.Sink())
	}
	if rl.Source() == nil || rl.Source().RelayName() != rl.RelayName() {
		t.Fatalf("Source() = %v, want the relay's source", rl.Source())
	}
	if err := rl.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ob.Write(ctx, outbox.Event{AggregateType: "order", AggregateID: "1", Type: "Placed"},
		outbox.Event{AggregateType: "order", AggregateID: "2", Type: "Placed"}); err != nil {
		t.Fatal(err)
	}
	await.Eventually(t, 30*time.Second, func() error {
		fams, err := reg.Gather()
		if err != nil {
			return err
		}
		var prom float64
		for _, f := range fams {
			if f.GetName() == "outbox_published_total" {
				for _, m := range f.GetMetric() {
					prom += m.GetCounter().GetValue()
				}
			}
		}
		if n := own.published.Load(); n != 2 || prom != 2 {
			return fmt.Errorf("the caller's Metrics counted %d publishes and outbox_published_total reads %v, want 2 and 2", n, prom)
		}
		return nil
	})
}

// A program that embeds the relay links no broker's client but those it
// opens itself: relayd depends on none of them.
func TestRelaydLinksNoBrokerClient(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/outboxkit/outbox/relayd").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, client := range []string{
		"github.com/nats-io/", "github.com/twmb/franz-go", "github.com/rabbitmq/amqp091-go", "github.com/eclipse/paho",
		"cloud.google.com/go/pubsub", "github.com/aws/aws-sdk-go-v2", "github.com/redis/go-redis",
		"github.com/outboxkit/outbox/sink/",
	} {
		for _, dep := range strings.Fields(string(out)) {
			if strings.HasPrefix(dep, client) {
				t.Errorf("relayd depends on %s", dep)
			}
		}
	}
}
