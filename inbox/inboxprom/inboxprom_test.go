package inboxprom_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/inboxprom"
)

func TestCountsByConsumerAndOutcome(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := inboxprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.Handled("billing", inbox.Processed, 3*time.Millisecond)
	m.Handled("billing", inbox.Processed, 5*time.Millisecond)
	m.Handled("billing", inbox.Duplicate, time.Millisecond)
	m.Handled("shipping", inbox.Stale, time.Millisecond)
	want := `
# HELP inbox_messages_total Messages an inbox handled, by consumer and outcome (processed, duplicate, stale, failed, invalid).
# TYPE inbox_messages_total counter
inbox_messages_total{consumer="billing",outcome="duplicate"} 1
inbox_messages_total{consumer="billing",outcome="failed"} 0
inbox_messages_total{consumer="billing",outcome="invalid"} 0
inbox_messages_total{consumer="billing",outcome="processed"} 2
inbox_messages_total{consumer="billing",outcome="stale"} 0
inbox_messages_total{consumer="shipping",outcome="duplicate"} 0
inbox_messages_total{consumer="shipping",outcome="failed"} 0
inbox_messages_total{consumer="shipping",outcome="invalid"} 0
inbox_messages_total{consumer="shipping",outcome="processed"} 0
inbox_messages_total{consumer="shipping",outcome="stale"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "inbox_messages_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(reg, "inbox_handle_seconds"); n != 3 {
		t.Fatalf("inbox_handle_seconds has %d series, want 3 (billing processed, billing duplicate, shipping stale)", n)
	}
	// A second registration on the same registry is refused, not silently shared.
	if _, err := inboxprom.New(reg); err == nil {
		t.Fatal("registering twice on one registry succeeded")
	}
}

func TestCountsDeadLettersByConsumerFromZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := inboxprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.Handled("billing", inbox.Failed, time.Millisecond)
	m.Handled("shipping", inbox.Invalid, time.Millisecond)
	m.DeadLettered("shipping")
	m.DeadLettered("shipping")
	want := `
# HELP inbox_dead_letters_total Dead letters an inbox recorded, by consumer.
# TYPE inbox_dead_letters_total counter
inbox_dead_letters_total{consumer="billing"} 0
inbox_dead_letters_total{consumer="shipping"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "inbox_dead_letters_total"); err != nil {
		t.Fatal(err)
	}
}
