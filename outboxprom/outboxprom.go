// Package outboxprom exposes the relay's metrics to Prometheus. It registers
// on the prometheus.Registerer the caller passes, never on the global one.
// docs/operations.md (Metrics) lists every metric with its labels.
package outboxprom

import (
	"context"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/relay"
)

// StatusFunc reads the table's state on each scrape.
type StatusFunc func(ctx context.Context) (outboxdriver.Status, error)

// DestinationBacklog is the backlog bound for one destination.
type DestinationBacklog struct {
	Destination string
	Events      int64
	OldestAge   time.Duration
}

// DestinationsFunc reads the backlog by destination on each scrape.
type DestinationsFunc func(ctx context.Context) ([]DestinationBacklog, error)

// DefaultMaxDestinations is Config.MaxDestinations' default.
const DefaultMaxDestinations = 50

// Other is the destination label of every destination past
// Config.MaxDestinations.
const Other = "other"

// Config configures New. Every field is optional.
type Config struct {
	// Status, when set, is read at each scrape (bounded by a 5s timeout)
	// for the table's gauges: backlog, oldest unpublished age, dead
	// letters, held aggregates and their oldest hold, unowned partitions
	// and, with RelayName, the estimated time to drain.
	Status StatusFunc
	// Destinations, when set, is read at each scrape for the backlog and
	// the oldest unpublished age by destination.
	Destinations DestinationsFunc
	// RelayName is the name this relay leases partitions under: the
	// estimated time to drain counts the backlog of its partitions.
	RelayName string
	// MaxDestinations bounds the destination label of the metrics that
	// carry one and are new in this version (backlog and age by
	// destination, dead letters by class): the first MaxDestinations
	// destinations seen keep their name, later ones are reported as
	// "other". Defaults to 50.
	MaxDestinations int
	// RateWindow is the span over which the publish rate behind the
	// estimated time to drain is averaged. Defaults to one minute.
	RateWindow time.Duration
}

// Metrics implements relay.Metrics with Prometheus collectors.
type Metrics struct {
	published     *prometheus.CounterVec
	publishErrors *prometheus.CounterVec
	deadLettered  *prometheus.CounterVec
	deadByClass   *prometheus.CounterVec
	claimed       prometheus.Counter
	retries       *prometheus.CounterVec
	owned         prometheus.Gauge
	commitToPub   prometheus.Histogram
	schemaBad     prometheus.Gauge
	schemaTable   prometheus.Gauge
	schemaRelay   prometheus.Gauge

	dests   *labels
	total   atomic.Int64 // events published by this relay
	start   time.Time
	claimAt atomic.Int64 // unix nanoseconds of the last successful claim, 0 if none
	leaseAt atomic.Int64 // unix nanoseconds of the last lease upkeep that reached the database
}

var (
	_ relay.Metrics           = (*Metrics)(nil)
	_ relay.DeadLetterClasses = (*Metrics)(nil)
	_ relay.SchemaMetrics     = (*Metrics)(nil)
)

// New registers the relay's metrics on reg. If status is not nil, the
// table's gauges (outbox_backlog_events, outbox_oldest_unpublished_age_seconds,
// outbox_dead_letter_events, ...) are read from it at each scrape (bounded
// by a 5s timeout). NewWithConfig takes every option.
func New(reg prometheus.Registerer, status StatusFunc) (*Metrics, error) {
	return NewWithConfig(reg, &Config{Status: status})
}

// NewWithConfig registers the relay's metrics on reg as cfg says; cfg may
// be nil.
func NewWithConfig(reg prometheus.Registerer, cfg *Config) (*Metrics, error) {
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.MaxDestinations <= 0 {
		c.MaxDestinations = DefaultMaxDestinations
	}
	if c.RateWindow <= 0 {
		c.RateWindow = time.Minute
	}
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
		deadByClass: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_dead_lettered_by_class_total",
			Help: "Events moved to the dead-letter table, by destination and class (invalid, refused, exhausted).",
		}, []string{"destination", "class"}),
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
		schemaBad: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outbox_schema_incompatible",
			Help: "1 while the outbox table needs a newer relay than this one (it claims nothing then), else 0 (docs/operations.md, Upgrades).",
		}),
		schemaTable: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outbox_schema_table_version", Help: "The outbox table's schema version, as this relay last read it.",
		}),
		schemaRelay: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outbox_schema_relay_version", Help: "The newest schema version this relay's code knows.",
		}),
		dests: &labels{max: c.MaxDestinations, seen: map[string]bool{}},
		start: time.Now(),
	}
	ages := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "outbox_last_claim_age_seconds",
		Help: "Seconds since this relay's last successful claim (empty or not); since start when none yet.",
	}, func() float64 { return m.since(&m.claimAt) })
	lease := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "outbox_lease_renewal_age_seconds",
		Help: "Seconds since this relay's last lease upkeep that reached the database; since start when none yet.",
	}, func() float64 { return m.since(&m.leaseAt) })
	cs := []prometheus.Collector{m.published, m.publishErrors, m.deadLettered, m.deadByClass, m.claimed, m.retries, m.owned, m.commitToPub, m.schemaBad, m.schemaTable, m.schemaRelay, ages, lease}
	if c.Status != nil || c.Destinations != nil {
		cs = append(cs, &statusCollector{cfg: c, m: m, rate: rateWindow{span: c.RateWindow, samples: []sample{{at: m.start}}}})
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
	for _, class := range []relay.DeadLetterClass{relay.DeadLetterInvalid, relay.DeadLetterRefused, relay.DeadLetterExhausted} {
		m.deadByClass.WithLabelValues("", string(class))
	}
	return m, nil
}

// since returns the seconds since the time at holds, or since start.
func (m *Metrics) since(at *atomic.Int64) float64 {
	t := m.start
	if ns := at.Load(); ns != 0 {
		t = time.Unix(0, ns)
	}
	return time.Since(t).Seconds()
}

// labels bounds a label's values: the first max values seen keep their
// name, later ones become Other.
type labels struct {
	mu   sync.Mutex
	max  int
	seen map[string]bool
}

func (l *labels) of(v string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen[v] || v == Other {
		return v
	}
	if len(l.seen) >= l.max {
		return Other
	}
	l.seen[v] = true
	return v
}

// Claimed implements relay.Metrics.
func (m *Metrics) Claimed(n int) {
	m.claimed.Add(float64(n))
	m.claimAt.Store(time.Now().UnixNano())
}

// Published implements relay.Metrics.
func (m *Metrics) Published(dest string, since time.Duration) {
	m.published.WithLabelValues(dest).Inc()
	m.total.Add(1)
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
func (m *Metrics) PartitionsOwned(n int) {
	m.owned.Set(float64(n))
	m.leaseAt.Store(time.Now().UnixNano())
}

// SchemaChecked implements relay.SchemaMetrics.
func (m *Metrics) SchemaChecked(c outboxdriver.SchemaCheck) {
	bad := 0.0
	if !c.Compatible() {
		bad = 1
	}
	m.schemaBad.Set(bad)
	m.schemaTable.Set(float64(c.TableVersion))
	m.schemaRelay.Set(float64(c.RelayVersion))
}

// DeadLettered implements relay.Metrics.
func (m *Metrics) DeadLettered(dest string) { m.deadLettered.WithLabelValues(dest).Inc() }

// DeadLetteredAs implements relay.DeadLetterClasses.
func (m *Metrics) DeadLetteredAs(dest string, class relay.DeadLetterClass) {
	m.deadByClass.WithLabelValues(m.dests.of(dest), string(class)).Inc()
}

var (
	backlogDesc = prometheus.NewDesc("outbox_backlog_events", "Unpublished events: the table's rows, and under log tailing the events a streamer decoded and has not published that are not rows (message and insert+delete mode; those not decoded yet are not counted).", nil, nil)
	ageDesc     = prometheus.NewDesc("outbox_oldest_unpublished_age_seconds", "Age of the oldest unpublished event (0 when none): a row of the table, or under log tailing the commit of the oldest event decoded and not published.", nil, nil)
	deadDesc    = prometheus.NewDesc("outbox_dead_letter_events", "Events in the dead-letter table.", nil, nil)
	upDesc      = prometheus.NewDesc("outbox_status_up", "1 when the last status read from the database succeeded.", nil, nil)
	heldDesc    = prometheus.NewDesc("outbox_held_aggregates", "Aggregates whose later events wait for an earlier one (retrying or dead-lettered under the hold policy).", nil, nil)
	delayedDesc = prometheus.NewDesc("outbox_delayed_events", "Unpublished events whose deliver_at is still ahead (they count in the backlog).", nil, nil)
	parkedDesc  = prometheus.NewDesc("outbox_parked_events", "Events of held aggregates that log tailing parked in the database until the aggregate is released.", nil, nil)
	heldAgeDesc = prometheus.NewDesc("outbox_oldest_held_age_seconds", "How long the aggregate held longest has been held (0 when none).", nil, nil)
	unownedDesc = prometheus.NewDesc("outbox_partitions_unowned", "Partitions no live relay leases.", nil, nil)
	tpAgeDesc   = prometheus.NewDesc("outbox_time_partitions_maintained_age_seconds", "Seconds since the time partitions of the table were last maintained (+Inf: never); only for a table partitioned by time.", nil, nil)
	tpKeptDesc  = prometheus.NewDesc("outbox_time_partitions_kept", "Time partitions past the window that the last maintenance kept for their unpublished events; only for a table partitioned by time.", nil, nil)
	tpDefDesc   = prometheus.NewDesc("outbox_time_partition_default_rows", "Rows in the default partition, whose created_at no partition covers; only for a table partitioned by time.", nil, nil)
	etaDesc     = prometheus.NewDesc("outbox_drain_eta_seconds", "Estimated seconds until this relay has published the backlog of its partitions at its publish rate of the last RateWindow (0 with no backlog, +Inf when nothing was published).", nil, nil)
	destBacklog = prometheus.NewDesc("outbox_destination_backlog_events", "Unpublished events by destination (at most MaxDestinations labels, the rest as \"other\").", []string{"destination"}, nil)
	destAge     = prometheus.NewDesc("outbox_destination_oldest_unpublished_age_seconds", "Age of the oldest unpublished event by destination.", []string{"destination"}, nil)
)

// statusTimeout bounds the reads of one scrape.
const statusTimeout = 5 * time.Second

type statusCollector struct {
	cfg  Config
	m    *Metrics
	rate rateWindow
}

func (c *statusCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- upDesc
	if c.cfg.Status != nil {
		for _, d := range []*prometheus.Desc{backlogDesc, ageDesc, deadDesc, heldDesc, heldAgeDesc, parkedDesc, delayedDesc, unownedDesc, tpAgeDesc, tpKeptDesc, tpDefDesc} {
			ch <- d
		}
		if c.cfg.RelayName != "" {
			ch <- etaDesc
		}
	}
	if c.cfg.Destinations != nil {
		ch <- destBacklog
		ch <- destAge
	}
}

func (c *statusCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), statusTimeout)
	defer cancel()
	up := 1.0
	if c.cfg.Status != nil {
		if st, err := c.cfg.Status(ctx); err != nil {
			up = 0
		} else {
			c.status(ch, st)
		}
	}
	if c.cfg.Destinations != nil {
		if ds, err := c.cfg.Destinations(ctx); err != nil {
			up = 0
		} else {
			c.destinations(ch, ds)
		}
	}
	ch <- prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, up)
}

func (c *statusCollector) status(ch chan<- prometheus.Metric, st outboxdriver.Status) {
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	gauge(backlogDesc, float64(st.Backlog))
	gauge(ageDesc, st.OldestUnpublishedAge.Seconds())
	gauge(deadDesc, float64(st.DeadLetters))
	gauge(heldDesc, float64(st.Held))
	gauge(heldAgeDesc, st.OldestHeldAge.Seconds())
	gauge(parkedDesc, float64(st.Parked))
	gauge(delayedDesc, float64(st.Delayed))
	if tp := st.TimePartitions; tp != nil {
		age := math.Inf(1)
		if !tp.MaintainedAt.IsZero() {
			age = max(time.Since(tp.MaintainedAt).Seconds(), 0)
		}
		gauge(tpAgeDesc, age)
		gauge(tpKeptDesc, float64(len(tp.Kept)))
		gauge(tpDefDesc, float64(tp.DefaultRows))
	}
	var unowned, mine int64
	for _, p := range st.Partitions {
		if p.Owner == "" {
			unowned++
		}
		if p.Owner == c.cfg.RelayName {
			mine += p.Backlog
		}
	}
	for _, s := range st.Slots {
		if s.Backlog != nil && s.Owner == c.cfg.RelayName {
			mine += s.Backlog.Events // log tailing: the streamer's events
		}
	}
	gauge(unownedDesc, float64(unowned))
	if c.cfg.RelayName == "" {
		return
	}
	rate := c.rate.observe(time.Now(), c.m.total.Load())
	eta := 0.0
	switch {
	case mine == 0:
	case rate <= 0:
		eta = math.Inf(1)
	default:
		eta = float64(mine) / rate
	}
	gauge(etaDesc, eta)
}

// destinations folds ds into at most MaxDestinations labels plus Other.
func (c *statusCollector) destinations(ch chan<- prometheus.Metric, ds []DestinationBacklog) {
	type agg struct {
		n   int64
		age time.Duration
	}
	by := map[string]*agg{}
	// The largest first, so that a full label set keeps the names that
	// matter most when it fills on one scrape.
	ds = slices.Clone(ds)
	slices.SortStableFunc(ds, func(a, b DestinationBacklog) int {
		switch {
		case a.Events > b.Events:
			return -1
		case a.Events < b.Events:
			return 1
		}
		return 0
	})
	for _, d := range ds {
		l := c.m.dests.of(d.Destination)
		a := by[l]
		if a == nil {
			a = &agg{}
			by[l] = a
		}
		a.n += d.Events
		a.age = max(a.age, d.OldestAge)
	}
	for l, a := range by {
		ch <- prometheus.MustNewConstMetric(destBacklog, prometheus.GaugeValue, float64(a.n), l)
		ch <- prometheus.MustNewConstMetric(destAge, prometheus.GaugeValue, a.age.Seconds(), l)
	}
}

type sample struct {
	at time.Time
	n  int64
}

// rateWindow averages a counter's rate over the last span, from samples
// taken at each scrape.
type rateWindow struct {
	mu      sync.Mutex
	span    time.Duration
	samples []sample
}

// observe records n at now and returns the rate per second since the
// oldest sample within span (or the newest one older than it).
func (w *rateWindow) observe(now time.Time, n int64) float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.samples = append(w.samples, sample{now, n})
	for len(w.samples) > 2 && !w.samples[1].at.After(now.Add(-w.span)) {
		w.samples = w.samples[1:]
	}
	first := w.samples[0]
	secs := now.Sub(first.at).Seconds()
	if secs <= 0 {
		return 0
	}
	return float64(n-first.n) / secs
}
