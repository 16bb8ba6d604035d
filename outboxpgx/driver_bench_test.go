package outboxpgx_test

import (
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

// BenchmarkStatement measures the building of the INSERT statement and its
// arguments for one row (VALUES) and for 100 rows (unnest over arrays), as
// WriteTx and Queue do for every transaction, through QueueInsert. No
// database is involved.
func BenchmarkStatement(b *testing.B) {
	d := outboxpgx.New(nil)
	t := outboxdriver.Table{Schema: "public", Name: "outbox"}
	for _, n := range []int{1, 100} {
		b.Run("rows="+strconv.Itoa(n), func(b *testing.B) {
			rows := make([]outboxdriver.Row, n)
			for i := range rows {
				rows[i] = outboxdriver.Row{
					ID:            "0190a5a4-0000-7000-8000-" + strconv.Itoa(100000000000+i),
					AggregateType: "order",
					AggregateID:   "4611686018427387904",
					Type:          "OrderLineAdded",
					Payload:       []byte(`{"order_id":4611686018427387904,"line":` + strconv.Itoa(i) + `,"sku":"sku-1234","quantity":1}`),
				}
			}
			var pb pgx.Batch
			if err := d.QueueInsert(&pb, t, rows); err != nil || pb.Len() != 1 || len(pb.QueuedQueries[0].Arguments) != 8 {
				b.Fatalf("QueueInsert: %v, %d statements", err, pb.Len())
			}
			b.ReportAllocs()
			for b.Loop() {
				pb.QueuedQueries = pb.QueuedQueries[:0]
				_ = d.QueueInsert(&pb, t, rows)
			}
		})
	}
}
