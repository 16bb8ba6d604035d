package outboxprom

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxkit/outbox/contract"
)

// outbox_contract_uncovered_events_total counts, from a real registry,
// the events let through without a contract, by aggregate type and type,
// and shows a zero before the first.
func TestUncoveredEventsMetric(t *testing.T) {
	r, err := contract.Load("../contract/testdata/orders")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SetMissing(contract.MissingAllow); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := RegisterContracts(reg, r); err != nil {
		t.Fatal(err)
	}
	const head = "# HELP outbox_contract_uncovered_events_total Events let through without a contract (missing policy allow), by aggregate type and type.\n" +
		"# TYPE outbox_contract_uncovered_events_total counter\n"
	if err := testutil.GatherAndCompare(reg, strings.NewReader(head+
		`outbox_contract_uncovered_events_total{aggregatetype="",type=""} 0`+"\n"), "outbox_contract_uncovered_events_total"); err != nil {
		t.Fatalf("before any uncovered event: %v", err)
	}
	for _, typ := range []string{"OrderShipped", "OrderShipped", "OrderPlaced"} { // OrderPlaced has a contract
		if _, err := r.Check("order", typ, "", []byte(`{"orderId": 1, "total": 1, "currency": "EUR"}`), false); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.Check("user", "SignedUp", "", nil, false); err != nil {
		t.Fatal(err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(head+
		`outbox_contract_uncovered_events_total{aggregatetype="order",type="OrderShipped"} 2`+"\n"+
		`outbox_contract_uncovered_events_total{aggregatetype="user",type="SignedUp"} 1`+"\n"), "outbox_contract_uncovered_events_total"); err != nil {
		t.Fatal(err)
	}
}
