package outbox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/contract"
	"github.com/outboxkit/outbox/outboxpgx"
)

// BenchmarkQueueContracts is BenchmarkQueue for one event with a 1 KB
// payload, without and with a contract registry: the difference is what
// checking an event against its compiled contract costs WriteTx.
func BenchmarkQueueContracts(b *testing.B) {
	reg, err := contract.Load("contract/testdata/orders")
	if err != nil {
		b.Fatal(err)
	}
	var lines []string
	for i := range 12 {
		lines = append(lines, fmt.Sprintf(`{"sku": "sku-%04d", "qty": %d}`, i, i+1))
	}
	p := `{"orderId": 4611686018427387904, "total": 1234.5, "currency": "EUR", "customer": {"email": "someone@example.com"},
	"shipping": {"address": "Somestreet 1, 12345 Sometown, Somecountry"}, "lines": [` + strings.Join(lines, ", ") + `]}`
	p += strings.Repeat(" ", max(0, 1024-len(p)))
	ev := outbox.Event{AggregateType: "order", AggregateID: "4611686018427387904", Type: "OrderPlaced", Payload: []byte(p)}
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
