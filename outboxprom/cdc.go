package outboxprom

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outbox/outboxdriver"
)

// CDCStatsFunc reads a log-tailing relay's replication slot (from the
// database) and its lag (commit to publish, from the relay's memory) on
// each scrape.
type CDCStatsFunc func(ctx context.Context) (outboxdriver.SlotStatus, time.Duration, error)

var (
	cdcLabels      = []string{"slot"}
	cdcLagBytes    = prometheus.NewDesc("outbox_cdc_slot_lag_bytes", "WAL the replication slot retains: the server's current WAL position minus the slot's restart LSN.", cdcLabels, nil)
	cdcUnconfirmed = prometheus.NewDesc("outbox_cdc_slot_unconfirmed_bytes", "WAL past the replication slot's confirmed LSN: the server's current WAL position minus confirmed_flush_lsn (events not decoded yet are in it).", cdcLabels, nil)
	cdcLagSeconds  = prometheus.NewDesc("outbox_cdc_lag_seconds", "Time since the commit of the oldest transaction whose events the relay has not yet published (0 when none is pending).", cdcLabels, nil)
	cdcActive      = prometheus.NewDesc("outbox_cdc_slot_active", "1 when a relay streams the replication slot, 0 when nobody does (or the slot is missing).", cdcLabels, nil)
	cdcExists      = prometheus.NewDesc("outbox_cdc_slot_exists", "1 when the replication slot exists and is not invalidated.", cdcLabels, nil)
	cdcStatusUp    = prometheus.NewDesc("outbox_cdc_status_up", "1 when the last read of the replication slot succeeded.", cdcLabels, nil)
	cdcDescriptors = []*prometheus.Desc{cdcLagBytes, cdcUnconfirmed, cdcLagSeconds, cdcActive, cdcExists, cdcStatusUp}
)

// RegisterCDC registers the metrics of a log-tailing relay's replication
// slot on reg: outbox_cdc_slot_lag_bytes,
// outbox_cdc_slot_unconfirmed_bytes, outbox_cdc_lag_seconds,
// outbox_cdc_slot_active, outbox_cdc_slot_exists and
// outbox_cdc_status_up, labelled with the slot's name and read from stats
// at each scrape (bounded by a 5s timeout).
func RegisterCDC(reg prometheus.Registerer, slot string, stats CDCStatsFunc) error {
	return reg.Register(&cdcCollector{slot: slot, stats: stats})
}

type cdcCollector struct {
	slot  string
	stats CDCStatsFunc
}

func (c *cdcCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range cdcDescriptors {
		ch <- d
	}
}

func (c *cdcCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, lag, err := c.stats(ctx)
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, c.slot)
	}
	if err != nil {
		gauge(cdcStatusUp, 0)
		return
	}
	gauge(cdcStatusUp, 1)
	exists := st.Exists && st.WALStatus != "lost"
	gauge(cdcLagBytes, float64(st.LagBytes))
	gauge(cdcUnconfirmed, float64(st.UnconfirmedBytes))
	gauge(cdcLagSeconds, lag.Seconds())
	gauge(cdcActive, b2f(exists && st.Active))
	gauge(cdcExists, b2f(exists))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
