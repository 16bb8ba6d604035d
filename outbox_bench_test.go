package outbox_test

import (
	"context"
	"strconv"
	"testing"

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

// BenchmarkRows measures the encoding of events into rows that WriteTx and
// outboxpgx's Driver.Queue do before any SQL: validation, a UUIDv7 each,
// the trace context of ctx.
func BenchmarkRows(b *testing.B) {
	ob, err := outbox.New(outboxpgx.New(), nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for _, n := range []int{1, 100} {
		b.Run("events="+strconv.Itoa(n), func(b *testing.B) {
			evs := benchEvents(n)
			rows, err := ob.Rows(ctx, evs...)
			if err != nil || len(rows) != n {
				b.Fatalf("Rows: %d rows, %v", len(rows), err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ob.Rows(ctx, evs...); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
