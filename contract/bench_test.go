package contract_test

import (
	"fmt"
	"strings"
	"testing"
)

// benchPayload is a 1 KB OrderPlaced v2 payload.
func benchPayload() []byte {
	var lines []string
	for i := range 12 {
		lines = append(lines, fmt.Sprintf(`{"sku": "sku-%04d", "qty": %d}`, i, i+1))
	}
	p := `{"orderId": 4611686018427387904, "total": 1234.5, "currency": "EUR",
	"customer": {"email": "someone@example.com"},
	"shipping": {"address": "Somestreet 1, 12345 Sometown, Somecountry"},
	"lines": [` + strings.Join(lines, ", ") + `]}`
	for len(p) < 1024 {
		p = strings.Replace(p, `"total"`, ` "total"`, 1)
	}
	return []byte(p)
}

// BenchmarkCheck measures the validation of one 1 KB event against its
// compiled contract, as WriteTx and the relay pay it per event.
func BenchmarkCheck(b *testing.B) {
	r := load(&testing.T{}, "testdata/orders")
	p := benchPayload()
	if len(p) < 1024 || len(p) > 1100 {
		b.Fatalf("payload of %d bytes", len(p))
	}
	if _, err := r.Check("order", "OrderPlaced", "", p, false); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Check("order", "OrderPlaced", "", p, false); err != nil {
			b.Fatal(err)
		}
	}
}
