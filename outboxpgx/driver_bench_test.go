package outboxpgx_test

import (
	"strconv"
	"testing"

	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

// BenchmarkStatement measures the building of the INSERT statement and its
// arguments for one row (VALUES) and for 100 rows (unnest over arrays), as
// WriteTx and Queue do for every transaction. No database is involved.
func BenchmarkStatement(b *testing.B) {
	d := outboxpgx.New()
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
			sql, args := d.Statement(t, rows)
			if sql == "" || len(args) != 8 {
				b.Fatalf("Statement: %d arguments for %q", len(args), sql)
			}
			b.ReportAllocs()
			for b.Loop() {
				d.Statement(t, rows)
			}
		})
	}
}
