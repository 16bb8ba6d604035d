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
	dead      *prometheus.CounterVec
	consumers sync.Map // consumers observed so far
}

var (
	_ inbox.Metrics           = (*Metrics)(nil)
	_ inbox.DeadLetterMetrics = (*Metrics)(nil)
)

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
		dead: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inbox_dead_letters_total",
			Help: "Dead letters an inbox recorded, by consumer.",
		}, []string{"consumer"}),
	}
	for _, c := range []prometheus.Collector{m.messages, m.latency, m.dead} {
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
		m.dead.WithLabelValues(consumer)
	}
	m.messages.WithLabelValues(consumer, o.String()).Inc()
	m.latency.WithLabelValues(consumer, o.String()).Observe(took.Seconds())
}

// DeadLettered implements inbox.DeadLetterMetrics.
func (m *Metrics) DeadLettered(consumer string) {
	m.dead.WithLabelValues(consumer).Inc()
}
