package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/internal/workload"
)

// failEveryNth fails every nth Publish request to the fake Pub/Sub, so that
// ordering keys are paused by the client and resumed by the relay's retries.
type failEveryNth struct {
	n             int64
	calls, failed atomic.Int64
}

func (f *failEveryNth) React(any) (bool, any, error) {
	if f.calls.Add(1)%f.n == 0 {
		f.failed.Add(1)
		return true, nil, status.Error(codes.FailedPrecondition, "injected failure")
	}
	return false, nil, nil
}

// TestEndToEndPubSub runs the relay against the Pub/Sub client's fake
// server (pstest) through PUBSUB_EMULATOR_HOST, with one publish request in
// seven failing: every committed event arrives, each aggregate's events in
// commit order (duplicates only by id), the ordering key being the
// aggregate id.
func TestEndToEndPubSub(t *testing.T) {
	t.Parallel()
	tb, flags := migrated(t)
	fail := &failEveryNth{n: 7}
	srv := pstest.NewServer(pstest.ServerReactorOption{FuncName: "Publish", Reactor: fail})
	defer srv.Close()
	startRelayEnv(t, []string{"PUBSUB_EMULATOR_HOST=" + srv.Addr},
		append(flags, "--sink", "pubsub://outbox-e2e", "--pubsub-create-topics", "--retry-base", "20ms", "--retry-max", "200ms")...)
	res, err := workload.Run(context.Background(), testenv.Pool(t), tb, workload.Config{Aggregates: 40, Transactions: 1500, Writers: 4, RollbackPct: 10})
	if err != nil {
		t.Fatal(err)
	}
	var ds []workload.Delivery
	// Up to 60s; workload.Check reports what is missing.
	_ = await.Poll(60*time.Second, func() error {
		ds = ds[:0]
		ids := map[string]bool{}
		for _, m := range srv.Messages() {
			if m.Topic != "projects/outbox-e2e/topics/outbox.event.order" || m.Attributes["id"] == "" {
				t.Fatalf("message on %s with attributes %v", m.Topic, m.Attributes)
			}
			ds = append(ds, workload.Delivery{ID: m.Attributes["id"], Key: m.OrderingKey, Payload: m.Data})
			ids[m.Attributes["id"]] = true
		}
		if len(ids) < res.Committed() {
			return fmt.Errorf("%d of %d committed events arrived", len(ids), res.Committed())
		}
		return nil
	})
	dups, err := workload.Check(res, ds)
	if err != nil {
		t.Fatal(err)
	}
	if fail.failed.Load() == 0 {
		t.Fatal("no publish failed: the test did not exercise paused ordering keys")
	}
	t.Logf("%d events, %d publish requests of which %d failed, %d duplicate copies", res.Committed(), fail.calls.Load(), fail.failed.Load(), dups)
}
