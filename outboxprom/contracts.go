package outboxprom

import (
	"github.com/prometheus/client_golang/prometheus"
)

// UncoveredCounter reports the events let through without a contract
// (the registry's missing policy "allow"), by aggregate type and type.
// *contract.Registry implements it; its label values are bounded
// (contract.MaxUncoveredTypes pairs, then "other").
type UncoveredCounter interface {
	EachUncovered(fn func(aggregateType, eventType string, events int64))
}

var contractUncovered = prometheus.NewDesc("outbox_contract_uncovered_events_total",
	"Events let through without a contract (missing policy allow), by aggregate type and type.",
	[]string{"aggregatetype", "type"}, nil)

// RegisterContracts registers outbox_contract_uncovered_events_total on
// reg, read from c at each scrape: the writer's registry
// (outbox.Config.Contracts) or the relay's (relay.Config.Contracts, which
// outbox relay --contracts registers). Until an event goes through
// uncovered, the family holds one series with empty labels at 0, so that
// dashboards and alerts see a zero rather than nothing.
func RegisterContracts(reg prometheus.Registerer, c UncoveredCounter) error {
	return reg.Register(&contractsCollector{c: c})
}

type contractsCollector struct{ c UncoveredCounter }

func (c *contractsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- contractUncovered }

func (c *contractsCollector) Collect(ch chan<- prometheus.Metric) {
	seen := false
	c.c.EachUncovered(func(aggregateType, eventType string, events int64) {
		seen = true
		ch <- prometheus.MustNewConstMetric(contractUncovered, prometheus.CounterValue, float64(events), aggregateType, eventType)
	})
	if !seen {
		ch <- prometheus.MustNewConstMetric(contractUncovered, prometheus.CounterValue, 0, "", "")
	}
}
