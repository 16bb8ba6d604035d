package relayd_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/faultproxy"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/relayd"
	"github.com/outboxkit/outbox/route"
)

// rig is a relay opened through TCP proxies in front of the real
// PostgreSQL and NATS, so a test can cut either and let it through again,
// with events already written: three "order" and two "customer" events
// carrying canary in their payload, and one poison event (an aggregate id
// with a line break, which cannot be the message key).
type rig struct {
	t        *testing.T
	ctx      context.Context
	rl       *relayd.Relay
	st       jetstream.Stream
	prefix   string
	db, nats *faultproxy.Proxy
	poisonID string
	canary   string
}

func newRig(t *testing.T, reg prometheus.Registerer, log *slog.Logger) *rig {
	t.Helper()
	r := &rig{t: t, ctx: testenv.Context(t, 3*time.Minute), canary: "CANARY-" + testenv.Hex(t)}
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	drv := outboxpgx.New(pool)
	ob, err := outbox.New(drv, &outbox.Config{Schema: tb.Schema, Table: tb.Name})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.Migrate(r.ctx, nil); err != nil {
		t.Fatal(err)
	}
	var events []outbox.Event
	for i, at := range []string{"order", "order", "order", "customer", "customer"} {
		events = append(events, outbox.Event{AggregateType: at, AggregateID: fmt.Sprint(i), Type: "Changed",
			Payload: []byte(`{"secret": "` + r.canary + `"}`)})
	}
	if err := ob.Write(r.ctx, events...); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(r.ctx, `INSERT INTO `+tb.Qualified("")+` (id, aggregatetype, aggregateid, type, payload)
VALUES (gen_random_uuid(), 'order', E'poison\nid', 'Changed', $1::json) RETURNING id::text`, `{"secret": "`+r.canary+`"}`).Scan(&r.poisonID); err != nil {
		t.Fatal(err)
	}

	_, js := testenv.JetStream(t)
	r.st, r.prefix = testenv.Stream(t, js)
	router, err := route.New(&route.Config{Replacement: r.prefix + ".${routedByValue}"})
	if err != nil {
		t.Fatal(err)
	}
	r.db = proxy(t, "127.0.0.1:5432", testenv.DatabaseURL())
	r.nats = proxy(t, "127.0.0.1:4222", testenv.NATSURL())
	dbURL := withHost(t, testenv.DatabaseURL(), r.db.Addr())
	natsURL := withHost(t, testenv.NATSURL(), r.nats.Addr())
	r.rl, err = relayd.Open(r.ctx, dbURL, natsSink(t, r.ctx, natsURL, r.prefix), &relayd.Options{
		Schema: tb.Schema, Table: tb.Name, Registerer: reg,
		Relay: relay.Config{Router: router, PollInterval: 50 * time.Millisecond, LeaseTTL: time.Second, Logger: log,
			RetryBase: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.rl.Stop(context.Background()) })
	return r
}

// proxy starts a fault proxy to the host of serviceURL (def when it
// names none).
func proxy(t *testing.T, def, serviceURL string) *faultproxy.Proxy {
	t.Helper()
	target := def
	if u, err := url.Parse(serviceURL); err == nil && u.Host != "" {
		target = u.Host
	}
	p, err := faultproxy.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func withHost(t *testing.T, raw, host string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = host
	return u.String()
}

// gauge reads one sample of a family from reg (labels as name=value
// pairs); ok is false when there is none.
func gauge(t *testing.T, reg *prometheus.Registry, name string, lbls ...string) (v float64, ok bool) {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(lbls); i += 2 {
				if have[lbls[i]] != lbls[i+1] {
					continue next
				}
			}
			return value(m), true
		}
	}
	return 0, false
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	}
	return math.NaN()
}

// The metrics an alert uses move on a real relay run: the backlog and its
// age by destination, the drain estimate (+Inf while the broker is down
// and the relay holds a backlog, 0 once it drained), held aggregates and
// their age, dead letters by class, and the ages of the last claim and
// lease renewal.
func TestMetricsMoveOnARelayRun(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := newRig(t, reg, nil)
	order, customer := r.prefix+".order", r.prefix+".customer"
	mustGauge := func(name string, lbls ...string) float64 {
		t.Helper()
		v, ok := gauge(t, reg, name, lbls...)
		if !ok {
			t.Fatalf("no %s%v exported", name, lbls)
		}
		return v
	}
	// Before the relay runs: the backlog by destination, no holds.
	if v := mustGauge("outbox_destination_backlog_events", "destination", order); v != 4 {
		t.Fatalf("backlog of %s = %v, want 4 (three events and the poison one)", order, v)
	}
	if v := mustGauge("outbox_destination_backlog_events", "destination", customer); v != 2 {
		t.Fatalf("backlog of %s = %v, want 2", customer, v)
	}
	if v := mustGauge("outbox_destination_oldest_unpublished_age_seconds", "destination", order); v <= 0 {
		t.Fatalf("oldest age of %s = %v, want > 0", order, v)
	}
	if v := mustGauge("outbox_held_aggregates"); v != 0 {
		t.Fatalf("held aggregates = %v before any run", v)
	}
	if v := mustGauge("outbox_dead_lettered_by_class_total", "destination", "", "class", "invalid"); v != 0 {
		t.Fatalf("dead letters of class invalid = %v before any run", v)
	}

	// The broker is down: the relay leases the partitions, dead-letters
	// the poison event (it never reaches the broker) and holds its
	// aggregate, and cannot drain the rest.
	r.nats.Cut()
	if err := r.rl.Start(r.ctx); err != nil {
		t.Fatal(err)
	}
	await.Eventually(t, time.Minute, func() error {
		if v, _ := gauge(t, reg, "outbox_drain_eta_seconds"); !math.IsInf(v, 1) {
			return fmt.Errorf("the drain estimate is %v while the broker is down, want +Inf", v)
		}
		return nil
	})
	await.Eventually(t, time.Minute, func() error {
		d, _ := gauge(t, reg, "outbox_dead_lettered_by_class_total", "destination", "", "class", "invalid")
		h, _ := gauge(t, reg, "outbox_held_aggregates")
		if d != 1 || h != 1 {
			return fmt.Errorf("%v events dead-lettered as invalid and %v aggregates held, want the poison event and its aggregate", d, h)
		}
		return nil
	})
	if v := mustGauge("outbox_partitions_unowned"); v != 0 {
		t.Fatalf("unowned partitions = %v with one relay running", v)
	}
	for _, name := range []string{"outbox_last_claim_age_seconds", "outbox_lease_renewal_age_seconds"} {
		if v := mustGauge(name); v < 0 || v > 5 {
			t.Fatalf("%s = %v on a running relay, want a few seconds at most", name, v)
		}
	}
	await.Eventually(t, time.Minute, func() error {
		if v, _ := gauge(t, reg, "outbox_oldest_held_age_seconds"); v <= 0 {
			return fmt.Errorf("the oldest hold's age is %v, want it to grow", v)
		}
		return nil
	})

	// The broker is back: everything else is published.
	r.nats.Restore()
	testenv.WaitStreamMsgs(t, r.st, 5, time.Minute)
	await.Eventually(t, time.Minute, func() error {
		o, _ := gauge(t, reg, "outbox_destination_backlog_events", "destination", order)
		c, _ := gauge(t, reg, "outbox_destination_backlog_events", "destination", customer)
		eta, _ := gauge(t, reg, "outbox_drain_eta_seconds")
		if o != 0 || c != 0 || eta != 0 {
			return fmt.Errorf("backlog %v to %s and %v to %s, drain estimate %vs; want all 0", o, order, c, customer, eta)
		}
		return nil
	})
	if v := mustGauge("outbox_published_total", "destination", order); v != 3 {
		t.Fatalf("published to %s = %v, want 3", order, v)
	}
	if v := mustGauge("outbox_dead_letter_events"); v != 1 {
		t.Fatalf("dead letter events = %v, want 1", v)
	}
	// The database is cut: the lease renewal and the last claim age.
	r.db.Cut()
	await.Eventually(t, time.Minute, func() error {
		v, _ := gauge(t, reg, "outbox_lease_renewal_age_seconds")
		c, _ := gauge(t, reg, "outbox_last_claim_age_seconds")
		if v <= 1 || c <= 1 {
			return fmt.Errorf("lease renewal age %vs, last claim age %vs while the database is cut; want both past the lease TTL of 1s", v, c)
		}
		return nil
	})
	r.db.Restore()
}

// lines is a log handler that writes each record as "msg key=value ..."
// with values formatted as they are, unescaped, one record per Write: a
// line break inside a value would show as a second line.
type lines struct {
	mu  *sync.Mutex
	buf *bytes.Buffer
	n   *int // records handled
}

func (l lines) Enabled(context.Context, slog.Level) bool { return true }
func (l lines) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Level.String() + " " + r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value.Any())
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.WriteString(b.String() + "\n")
	*l.n++
	return nil
}
func (l lines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l lines) WithGroup(string) slog.Handler      { return l }

func (l lines) snapshot() ([]string, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Split(strings.TrimSuffix(l.buf.String(), "\n"), "\n"), *l.n
}

func (l lines) has(sub string) bool {
	ls, _ := l.snapshot()
	for _, s := range ls {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// logged is a condition for testenv.Eventually: for each of subs, a line
// holds it.
func (l lines) logged(subs ...string) func() error {
	return func() error {
		for _, s := range subs {
			if !l.has(s) {
				return fmt.Errorf("no line says %q", s)
			}
		}
		return nil
	}
}

// A relay run with the broker down then up, the database down then up,
// and a poison event: every record is one line, a "recovered" line
// follows each outage, the lines about an event name it (event id,
// aggregate type and id, partition, attempt), and the payload, which
// holds a recognisable canary, appears in no line.
func TestLogsLinkAndNeverHoldPayloads(t *testing.T) {
	var n int
	h := lines{mu: &sync.Mutex{}, buf: &bytes.Buffer{}, n: &n}
	r := newRig(t, nil, slog.New(h))
	r.nats.Cut()
	if err := r.rl.Start(r.ctx); err != nil {
		t.Fatal(err)
	}
	await.Eventually(t, time.Minute, h.logged("the broker is unreachable"))
	r.nats.Restore()
	testenv.WaitStreamMsgs(t, r.st, 5, time.Minute)
	await.Eventually(t, time.Minute, h.logged("recovered: the broker"))
	r.db.Cut()
	await.Eventually(t, time.Minute, h.logged("the database fails"))
	r.db.Restore()
	await.Eventually(t, time.Minute, h.logged("recovered: the database"))
	if err := r.rl.Stop(r.ctx); err != nil {
		t.Fatal(err)
	}

	got, records := h.snapshot()
	if len(got) != records {
		t.Errorf("%d records made %d lines: a record held a line break:\n%s", records, len(got), strings.Join(got, "\n"))
	}
	var dead bool
	for _, l := range got {
		if strings.Contains(l, r.canary) {
			t.Errorf("a log line holds the payload: %s", l)
		}
		if strings.Contains(l, "dead-lettering event") {
			dead = true
			for _, want := range []string{"event_id=" + r.poisonID, "aggregatetype=order", "aggregateid=poison; id", "partition=", "attempt=1"} {
				if !strings.Contains(l, want) {
					t.Errorf("the dead-letter line lacks %q: %s", want, l)
				}
			}
		}
	}
	if !dead {
		t.Errorf("no line about the dead-lettered event:\n%s", strings.Join(got, "\n"))
	}
}
