package outbox_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/contract"
	"github.com/outboxkit/outbox/outboxpgx"
)

// BenchmarkQueueContracts is BenchmarkQueue for one event with a 1 KB
// payload, without and with a contract registry: the difference is what
// checking an event against its compiled contract costs WriteTx (the
// registry and payload of contract.BenchmarkCheck).
func BenchmarkQueueContracts(b *testing.B) {
	reg, err := contract.Load("contract/testdata/bench")
	if err != nil {
		b.Fatal(err)
	}
	p, err := os.ReadFile("contract/testdata/bench/order-placed.json")
	if err != nil {
		b.Fatal(err)
	}
	ev := outbox.Event{AggregateType: "order", AggregateID: "4611686018427387904", Type: "OrderPlaced", Payload: p}
	ctx := context.Background()
	for _, name := range []string{"without", "with"} {
		b.Run("contracts="+name, func(b *testing.B) {
			cfg := &outbox.Config{}
			if name == "with" {
				cfg.Contracts = reg
			}
			ob, err := outbox.New(outboxpgx.New(nil), cfg)
			if err != nil {
				b.Fatal(err)
			}
			var pb pgx.Batch
			b.SetBytes(int64(len(p)))
			b.ReportAllocs()
			for b.Loop() {
				pb.QueuedQueries = pb.QueuedQueries[:0]
				if err := ob.Queue(ctx, &pb, ev); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
