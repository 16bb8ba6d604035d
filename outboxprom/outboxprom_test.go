package outboxprom

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxkit/outbox/outboxdriver"
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
		"outbox_claimed_events_total",
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
	if err := testutil.GatherAndCompare(reg, strings.NewReader("# HELP outbox_backlog_events Unpublished events in the outbox table.\n# TYPE outbox_backlog_events gauge\n"+want), "outbox_backlog_events"); err != nil {
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
