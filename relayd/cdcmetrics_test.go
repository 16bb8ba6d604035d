package relayd_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxpgx/cdc"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/relayd"
	"github.com/outboxkit/outbox/route"
)

// slotGauge reads the one sample of the gauge name of the slot from reg;
// it fails the test when the series is missing.
func slotGauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	v, ok := gauge(t, reg, name)
	if !ok {
		t.Fatalf("no metric %s", name)
	}
	return v
}

// A log-tailing relay exports its slot's metrics: the slot is active
// while it streams; the WAL the slot retains grows while no relay streams
// and events are written, and shrinks once a relay relayed them; the lag
// behind the commits is 0 once everything is done.
func TestLogTailingMetricsFollowTheSlot(t *testing.T) {
	ctx := testenv.Context(t, 3*time.Minute)
	pool := testenv.CDCPool(t)
	tb := cdcTable(t, pool)
	drv := outboxpgx.New(pool)
	_, js := testenv.JetStream(t)
	st, prefix := testenv.Stream(t, js)
	router, err := route.New(&route.Config{Destination: prefix + ".all"})
	if err != nil {
		t.Fatal(err)
	}
	url := testenv.CDCDatabaseURL(t)
	open := func() (*relayd.Relay, *prometheus.Registry) {
		reg := prometheus.NewRegistry()
		rl, err := relayd.Open(ctx, url, natsSink(t, ctx, testenv.NATSURL(), prefix), &relayd.Options{
			Schema: tb.Schema, Table: tb.Name, Source: relayd.SourceCDC, Registerer: reg,
			CDC:   cdc.Config{StatusInterval: 100 * time.Millisecond},
			Relay: relay.Config{Router: router, LeaseTTL: time.Second},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rl.Stop(context.Background()) })
		return rl, reg
	}
	var a *relayd.Relay
	var regA *prometheus.Registry
	testenv.CDCTurn(t, pool, func() { // Open creates the slot
		a, regA = open()
		if v := slotGauge(t, regA, "outbox_cdc_slot_exists"); v != 1 {
			t.Fatalf("slot exists = %v once Open returned", v)
		}
		if err := a.Start(ctx); err != nil {
			t.Fatal(err)
		}
		// Active alone is not enough: a slot still being created (waiting
		// for other sessions' transactions to end) is active too, and is
		// gone again if its creator stops before it is done; a made slot
		// has a confirmed position.
		await.Eventually(t, time.Minute, func() error {
			s, err := drv.Status(ctx, tb)
			if err != nil {
				return err
			}
			if len(s.Slots) != 1 || s.Slots[0].ConfirmedLSN == "" || slotGauge(t, regA, "outbox_cdc_slot_active") != 1 {
				return fmt.Errorf("the slot is not made and active: slots %+v, slot active = %v", s.Slots, slotGauge(t, regA, "outbox_cdc_slot_active"))
			}
			return nil
		})
	})
	if v := slotGauge(t, regA, "outbox_cdc_status_up"); v != 1 {
		t.Fatalf("status up = %v", v)
	}
	if err := a.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	slot := func() outboxdriver.SlotStatus {
		t.Helper()
		s, err := drv.Status(ctx, tb)
		if err != nil || len(s.Slots) != 1 {
			t.Fatalf("status = %+v, %v", s.Slots, err)
		}
		return s.Slots[0]
	}
	stopped := slot()
	if stopped.Active || !stopped.Exists {
		t.Fatalf("slot after the relay stopped: %+v", stopped)
	}

	// 2,000 events of about 1 KB while no relay streams.
	const n, perTx = 2000, 100
	ob, err := outbox.New(outboxpgx.New(pool, outboxpgx.WithMessages()), &outbox.Config{Schema: tb.Schema, Table: tb.Name})
	if err != nil {
		t.Fatal(err)
	}
	pad := strings.Repeat("x", 1000)
	for i := 0; i < n; i += perTx {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			evs := make([]outbox.Event, perTx)
			for j := range evs {
				evs[j] = outbox.Event{AggregateType: "order", AggregateID: fmt.Sprint(j % 10), Type: "Placed",
					Payload: fmt.Appendf(nil, `{"n": %d, "pad": %q}`, i+j, pad)}
			}
			return ob.WriteTx(ctx, tx, evs...)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	b, regB := open()
	grown := slotGauge(t, regB, "outbox_cdc_slot_lag_bytes")
	if grown < float64(stopped.LagBytes)+n*1000 {
		t.Fatalf("slot lag %v bytes after writing %d KB with no relay, %d before", grown, n, stopped.LagBytes)
	}
	if v := slotGauge(t, regB, "outbox_cdc_slot_active"); v != 0 {
		t.Fatalf("slot active = %v with no relay streaming", v)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.WaitStreamMsgs(t, st, n, time.Minute)
	// The slot's restart LSN moves once the server logged a snapshot of
	// the running transactions past the confirmed LSN (every 15s on a busy
	// server, at a checkpoint).
	await.Eventually(t, 90*time.Second, func() error {
		if lag := slotGauge(t, regB, "outbox_cdc_slot_lag_bytes"); lag >= grown-n*1000 {
			return fmt.Errorf("the retained WAL does not shrink once the events are relayed: %v bytes, want below %v", lag, grown-n*1000)
		}
		return nil
	})
	if v := slotGauge(t, regB, "outbox_cdc_lag_seconds"); v != 0 {
		t.Fatalf("lag = %vs with every event relayed", v)
	}
	if v := slotGauge(t, regB, "outbox_cdc_slot_active"); v != 1 {
		t.Fatalf("slot active = %v while the relay streams", v)
	}
}
