package inboxprom

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outbox/inbox"
)

// Metrics implements inbox.Metrics with Prometheus collectors. One Metrics
// can serve several inboxes (consumers) in a process.
type Metrics struct {
	messages  *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	consumers sync.Map // consumers observed so far
}

var _ inbox.Metrics = (*Metrics)(nil)

// New registers the inbox metrics on reg.
func New(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inbox_messages_total",
			Help: "Messages an inbox handled, by consumer and outcome (processed, duplicate, stale, failed, invalid).",
		}, []string{"consumer", "outcome"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "inbox_handle_seconds",
			Help:    "Time to handle one message (dedupe record, version guard, handler, commit), by consumer and outcome.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16), // 0.5ms .. ~16s
		}, []string{"consumer", "outcome"}),
	}
	for _, c := range []prometheus.Collector{m.messages, m.latency} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Handled implements inbox.Metrics. The first observation of a consumer
// exports every outcome's counter, so dashboards see zeros rather than
// missing series.
func (m *Metrics) Handled(consumer string, o inbox.Outcome, took time.Duration) {
	if _, seen := m.consumers.LoadOrStore(consumer, true); !seen {
		for _, other := range inbox.Outcomes() {
			m.messages.WithLabelValues(consumer, other.String())
		}
	}
	m.messages.WithLabelValues(consumer, o.String()).Inc()
	m.latency.WithLabelValues(consumer, o.String()).Observe(took.Seconds())
}
