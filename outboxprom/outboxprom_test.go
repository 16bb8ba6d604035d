package outboxprom

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/relay"
)

func TestEveryFamilyIsExportedFromTheStart(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := New(reg, func(context.Context) (outboxdriver.Status, error) {
		return outboxdriver.Status{Backlog: 7, OldestUnpublishedAge: 3 * time.Second, DeadLetters: 2}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	m.PartitionsOwned(5)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, f := range families {
		got[f.GetName()] = true
	}
	for _, name := range []string{
		"outbox_oldest_unpublished_age_seconds", "outbox_backlog_events", "outbox_published_total",
		"outbox_publish_errors_total", "outbox_retries_total", "outbox_dead_letter_events",
		"outbox_dead_lettered_total", "outbox_commit_to_publish_seconds", "outbox_partitions_owned",
		"outbox_claimed_events_total", "outbox_held_aggregates", "outbox_oldest_held_age_seconds",
		"outbox_partitions_unowned", "outbox_dead_lettered_by_class_total", "outbox_last_claim_age_seconds",
		"outbox_lease_renewal_age_seconds", "outbox_status_up",
	} {
		if !got[name] {
			t.Errorf("%s missing before any traffic", name)
		}
	}
	if v := testutil.ToFloat64(m.owned); v != 5 {
		t.Fatalf("partitions owned = %v", v)
	}
	m.Published("outbox.event.order", 2*time.Millisecond)
	m.PublishFailed("outbox.event.order", true)
	m.Retried("outbox.event.order")
	if v := testutil.ToFloat64(m.published.WithLabelValues("outbox.event.order")); v != 1 {
		t.Fatalf("published = %v", v)
	}
	want := "outbox_backlog_events 7\n"
	if err := testutil.GatherAndCompare(reg, strings.NewReader("# HELP outbox_backlog_events Unpublished events: the table's rows, and under log tailing the events a streamer decoded and has not published that are not rows (message and insert+delete mode; those not decoded yet are not counted).\n# TYPE outbox_backlog_events gauge\n"+want), "outbox_backlog_events"); err != nil {
		t.Fatal(err)
	}
}

func TestStatusFailureIsVisible(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := New(reg, func(context.Context) (outboxdriver.Status, error) {
		return outboxdriver.Status{}, errors.New("db down")
	}); err != nil {
		t.Fatal(err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader("# HELP outbox_status_up 1 when the last status read from the database succeeded.\n# TYPE outbox_status_up gauge\noutbox_status_up 0\n"), "outbox_status_up"); err != nil {
		t.Fatal(err)
	}
}

// The destination label keeps the first MaxDestinations destinations, the
// largest backlog first; the others are summed under "other", with the
// oldest age among them.
func TestDestinationLabelsAreBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewWithConfig(reg, &Config{MaxDestinations: 2, Destinations: func(context.Context) ([]DestinationBacklog, error) {
		return []DestinationBacklog{
			{Destination: "small", Events: 1, OldestAge: 9 * time.Second},
			{Destination: "big", Events: 10, OldestAge: time.Second},
			{Destination: "mid", Events: 5, OldestAge: 2 * time.Second},
			{Destination: "tiny", Events: 1, OldestAge: 4 * time.Second},
		}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := `# HELP outbox_destination_backlog_events Unpublished events by destination (at most MaxDestinations labels, the rest as "other").
# TYPE outbox_destination_backlog_events gauge
outbox_destination_backlog_events{destination="big"} 10
outbox_destination_backlog_events{destination="mid"} 5
outbox_destination_backlog_events{destination="other"} 2
# HELP outbox_destination_oldest_unpublished_age_seconds Age of the oldest unpublished event by destination.
# TYPE outbox_destination_oldest_unpublished_age_seconds gauge
outbox_destination_oldest_unpublished_age_seconds{destination="big"} 1
outbox_destination_oldest_unpublished_age_seconds{destination="mid"} 2
outbox_destination_oldest_unpublished_age_seconds{destination="other"} 9
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "outbox_destination_backlog_events", "outbox_destination_oldest_unpublished_age_seconds"); err != nil {
		t.Fatal(err)
	}
	// The label set is the relay's, not the scrape's: a destination seen
	// later stays "other" in every metric.
	m.DeadLetteredAs("new", relay.DeadLetterRefused)
	m.DeadLetteredAs("big", relay.DeadLetterExhausted)
	if v := testutil.ToFloat64(m.deadByClass.WithLabelValues(Other, "refused")); v != 1 {
		t.Fatalf("dead letters of a destination past the cap under other = %v, want 1", v)
	}
	if v := testutil.ToFloat64(m.deadByClass.WithLabelValues("big", "exhausted")); v != 1 {
		t.Fatalf("dead letters of big = %v, want 1", v)
	}
}

// The drain estimate: 0 without a backlog in the relay's partitions, +Inf
// while it holds one and has published nothing, backlog / rate once it
// publishes.
func TestDrainEstimate(t *testing.T) {
	backlog := int64(0)
	reg := prometheus.NewRegistry()
	m, err := NewWithConfig(reg, &Config{RelayName: "r1", Status: func(context.Context) (outboxdriver.Status, error) {
		return outboxdriver.Status{Partitions: []outboxdriver.PartitionStatus{
			{Partition: 0, Owner: "r1", Backlog: backlog},
			{Partition: 1, Owner: "r2", Backlog: 1000},
			{Partition: 2, Owner: "", Backlog: 7},
		}}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	eta := func() float64 {
		t.Helper()
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() == "outbox_drain_eta_seconds" {
				return f.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no outbox_drain_eta_seconds")
		return 0
	}
	if v := eta(); v != 0 {
		t.Fatalf("estimate without a backlog = %v, want 0", v)
	}
	backlog = 100
	if v := eta(); !math.IsInf(v, 1) {
		t.Fatalf("estimate with a backlog and nothing published = %v, want +Inf", v)
	}
	for range 50 {
		m.Published("d", time.Millisecond)
	}
	v := eta()
	// 50 events since the window's first sample, at most elapsed ago.
	if most := 100 / (50 / time.Since(m.start).Seconds()); math.IsInf(v, 0) || v <= 0 || v > most*1.01 {
		t.Fatalf("estimate = %v, want 100 events / the publish rate (at most %v)", v, most)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader("# HELP outbox_partitions_unowned Partitions no live relay leases.\n# TYPE outbox_partitions_unowned gauge\noutbox_partitions_unowned 1\n"), "outbox_partitions_unowned"); err != nil {
		t.Fatal(err)
	}
}

func TestCDCSlotMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	fail := false
	err := RegisterCDC(reg, "s1", func(context.Context) (outboxdriver.SlotStatus, time.Duration, error) {
		if fail {
			return outboxdriver.SlotStatus{}, 0, errors.New("db down")
		}
		return outboxdriver.SlotStatus{Slot: "s1", Exists: true, Active: true, LagBytes: 4096}, 1500 * time.Millisecond, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `# HELP outbox_cdc_lag_seconds Time since the commit of the oldest transaction whose events the relay has not yet published (0 when none is pending).
# TYPE outbox_cdc_lag_seconds gauge
outbox_cdc_lag_seconds{slot="s1"} 1.5
# HELP outbox_cdc_slot_active 1 when a relay streams the replication slot, 0 when nobody does (or the slot is missing).
# TYPE outbox_cdc_slot_active gauge
outbox_cdc_slot_active{slot="s1"} 1
# HELP outbox_cdc_slot_lag_bytes WAL the replication slot retains: the server's current WAL position minus the slot's restart LSN.
# TYPE outbox_cdc_slot_lag_bytes gauge
outbox_cdc_slot_lag_bytes{slot="s1"} 4096
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "outbox_cdc_lag_seconds", "outbox_cdc_slot_active", "outbox_cdc_slot_lag_bytes"); err != nil {
		t.Fatal(err)
	}
	fail = true
	if err := testutil.GatherAndCompare(reg, strings.NewReader("# HELP outbox_cdc_status_up 1 when the last read of the replication slot succeeded.\n# TYPE outbox_cdc_status_up gauge\noutbox_cdc_status_up{slot=\"s1\"} 0\n"), "outbox_cdc_status_up"); err != nil {
		t.Fatal(err)
	}
}

// The time partition gauges appear for a table partitioned by time only.
func TestTimePartitionMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	var tp *outboxdriver.TimePartitionStatus
	if _, err := New(reg, func(context.Context) (outboxdriver.Status, error) {
		return outboxdriver.Status{TimePartitions: tp}, nil
	}); err != nil {
		t.Fatal(err)
	}
	names := []string{"outbox_time_partitions_maintained_age_seconds", "outbox_time_partitions_kept", "outbox_time_partition_default_rows"}
	if n, err := testutil.GatherAndCount(reg, names...); err != nil || n != 0 {
		t.Fatalf("a table without time partitions: %d series, %v", n, err)
	}
	tp = &outboxdriver.TimePartitionStatus{Unit: "day", DefaultRows: 3,
		Kept: []outboxdriver.KeptPartition{{Partition: "outbox_p20261130", Unpublished: 2}}}
	want := `# HELP outbox_time_partition_default_rows Rows in the default partition, whose created_at no partition covers; only for a table partitioned by time.
# TYPE outbox_time_partition_default_rows gauge
outbox_time_partition_default_rows 3
# HELP outbox_time_partitions_kept Time partitions past the window that the last maintenance kept for their unpublished events; only for a table partitioned by time.
# TYPE outbox_time_partitions_kept gauge
outbox_time_partitions_kept 1
# HELP outbox_time_partitions_maintained_age_seconds Seconds since the time partitions of the table were last maintained (+Inf: never); only for a table partitioned by time.
# TYPE outbox_time_partitions_maintained_age_seconds gauge
outbox_time_partitions_maintained_age_seconds +Inf
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	tp.MaintainedAt = time.Now().Add(-time.Minute)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == names[0] {
			if v := f.GetMetric()[0].GetGauge().GetValue(); v < 59 || v > 120 {
				t.Fatalf("maintained a minute ago: %v s", v)
			}
		}
	}
}
