// Package outboxprom exposes the relay's metrics to Prometheus. It registers
// on the prometheus.Registerer the caller passes, never on the global one.
package outboxprom

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/relay"
)

// StatusFunc reads the table's state on each scrape.
type StatusFunc func(ctx context.Context) (outboxdriver.Status, error)

// Metrics implements relay.Metrics with Prometheus collectors.
type Metrics struct {
	published     *prometheus.CounterVec
	publishErrors *prometheus.CounterVec
	deadLettered  *prometheus.CounterVec
	claimed       prometheus.Counter
	retries       *prometheus.CounterVec
	owned         prometheus.Gauge
	commitToPub   prometheus.Histogram
}

var _ relay.Metrics = (*Metrics)(nil)

// New registers the relay's metrics on reg. If status is not nil, the
// gauges outbox_backlog_events, outbox_oldest_unpublished_age_seconds and
// outbox_dead_letter_events are read from it at each scrape (bounded by a
// 5s timeout).
func New(reg prometheus.Registerer, status StatusFunc) (*Metrics, error) {
	m := &Metrics{
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_published_total", Help: "Events the broker acknowledged.",
		}, []string{"destination"}),
		publishErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_publish_errors_total", Help: "Publish attempts that failed, by kind (transient or permanent).",
		}, []string{"destination", "kind"}),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_dead_lettered_total", Help: "Events moved to the dead-letter table.",
		}, []string{"destination"}),
		claimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outbox_claimed_events_total", Help: "Events claimed for publishing.",
		}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_retries_total", Help: "Events scheduled for another attempt after a failed publish.",
		}, []string{"destination"}),
		owned: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outbox_partitions_owned", Help: "Partitions this relay leases.",
		}),
		commitToPub: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "outbox_commit_to_publish_seconds",
			Help:    "Time from an event's insertion to the broker's acknowledgement.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18), // 0.5ms .. ~65s
		}),
	}
	cs := []prometheus.Collector{m.published, m.publishErrors, m.deadLettered, m.claimed, m.retries, m.owned, m.commitToPub}
	if status != nil {
		cs = append(cs, &statusCollector{status: status})
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	// Every family is exported from the start, so dashboards and alerts
	// see zeros rather than missing series. The empty destination is the
	// same as no label in Prometheus.
	m.published.WithLabelValues("")
	m.publishErrors.WithLabelValues("", "transient")
	m.publishErrors.WithLabelValues("", "permanent")
	m.deadLettered.WithLabelValues("")
	m.retries.WithLabelValues("")
	return m, nil
}

// Claimed implements relay.Metrics.
func (m *Metrics) Claimed(n int) { m.claimed.Add(float64(n)) }

// Published implements relay.Metrics.
func (m *Metrics) Published(dest string, since time.Duration) {
	m.published.WithLabelValues(dest).Inc()
	m.commitToPub.Observe(since.Seconds())
}

// PublishFailed implements relay.Metrics.
func (m *Metrics) PublishFailed(dest string, permanent bool) {
	kind := "transient"
	if permanent {
		kind = "permanent"
	}
	m.publishErrors.WithLabelValues(dest, kind).Inc()
}

// Retried implements relay.Metrics.
func (m *Metrics) Retried(dest string) { m.retries.WithLabelValues(dest).Inc() }

// PartitionsOwned implements relay.Metrics.
func (m *Metrics) PartitionsOwned(n int) { m.owned.Set(float64(n)) }

// DeadLettered implements relay.Metrics.
func (m *Metrics) DeadLettered(dest string) { m.deadLettered.WithLabelValues(dest).Inc() }

var (
	backlogDesc = prometheus.NewDesc("outbox_backlog_events", "Unpublished events in the outbox table.", nil, nil)
	ageDesc     = prometheus.NewDesc("outbox_oldest_unpublished_age_seconds", "Age of the oldest unpublished event (0 when none).", nil, nil)
	deadDesc    = prometheus.NewDesc("outbox_dead_letter_events", "Events in the dead-letter table.", nil, nil)
	upDesc      = prometheus.NewDesc("outbox_status_up", "1 when the last status read from the database succeeded.", nil, nil)
)

type statusCollector struct{ status StatusFunc }

func (c *statusCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- backlogDesc
	ch <- ageDesc
	ch <- deadDesc
	ch <- upDesc
}

func (c *statusCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.status(ctx)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, 1)
	ch <- prometheus.MustNewConstMetric(backlogDesc, prometheus.GaugeValue, float64(st.Backlog))
	ch <- prometheus.MustNewConstMetric(ageDesc, prometheus.GaugeValue, st.OldestUnpublishedAge.Seconds())
	ch <- prometheus.MustNewConstMetric(deadDesc, prometheus.GaugeValue, float64(st.DeadLetters))
}
