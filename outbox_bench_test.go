package outbox_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxpgx"
)

// benchEvents returns n events about one order, with a payload of the size
// a small business event has.
func benchEvents(n int) []outbox.Event {
	evs := make([]outbox.Event, n)
	for i := range evs {
		evs[i] = outbox.Event{
			AggregateType: "order",
			AggregateID:   "4611686018427387904",
			Type:          "OrderLineAdded",
			Payload:       []byte(`{"order_id":4611686018427387904,"line":` + strconv.Itoa(i) + `,"sku":"sku-1234","quantity":1}`),
		}
	}
	return evs
}

// BenchmarkQueue measures what WriteTx and Queue do before any SQL runs:
// validation, a UUIDv7 each, the trace context of ctx, and the INSERT's
// arguments, here queued on a pgx.Batch that is never sent.
func BenchmarkQueue(b *testing.B) {
	ob, err := outbox.New(outboxpgx.New(nil), nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for _, n := range []int{1, 100} {
		b.Run("events="+strconv.Itoa(n), func(b *testing.B) {
			evs := benchEvents(n)
			var pb pgx.Batch
			if err := ob.Queue(ctx, &pb, evs...); err != nil || pb.Len() != 1 {
				b.Fatalf("Queue: %d statements, %v", pb.Len(), err)
			}
			b.ReportAllocs()
			for b.Loop() {
				pb.QueuedQueries = pb.QueuedQueries[:0]
				if err := ob.Queue(ctx, &pb, evs...); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
