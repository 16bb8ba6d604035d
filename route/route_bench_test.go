package route

import (
	"testing"
)

// BenchmarkRouterMessage measures the mapping of a claimed record (with
// headers and a trace context) to a broker message, which the relay does
// for every event: Debezium's default routing, and with two header columns
// placed as well.
func BenchmarkRouterMessage(b *testing.B) {
	for _, bc := range []struct {
		name string
		cfg  *Config
	}{
		{"default", nil},
		{"header_columns", &Config{HeaderColumns: []string{"type:eventType", "aggregateid"}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			r, err := New(bc.cfg)
			if err != nil {
				b.Fatal(err)
			}
			rc := rec()
			m, err := r.Message(rc)
			if err != nil || m.Destination != "outbox.event.order" {
				b.Fatalf("Message: destination %q, %v", m.Destination, err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := r.Message(rc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
