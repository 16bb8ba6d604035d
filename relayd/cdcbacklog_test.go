package relayd_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxpgx/cdc"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/relayd"
	"github.com/outboxkit/outbox/route"
)

// In message and insert+delete mode the table holds nothing, yet the
// backlog shows: while the broker is unreachable, `outbox status --json`
// (the same driver Status and JSON) and the relay's backlog and
// oldest-age metrics count the events the streamer decoded and has not
// published, say the count is a lower bound and how much WAL is not
// confirmed, and the oldest age grows. A relay stopped meanwhile leaves
// its last record, reported stale, with the oldest age still growing;
// once a relay publishes, both read 0.
func TestLogTailingBacklogInEveryMode(t *testing.T) {
	for _, mode := range []cdc.Mode{cdc.ModeMessages, cdc.ModeInsertDelete} {
		t.Run(mode.String(), func(t *testing.T) { testLogTailingBacklog(t, mode) })
	}
}

func testLogTailingBacklog(t *testing.T, mode cdc.Mode) {
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
	nats := proxy(t, "127.0.0.1:4222", testenv.NATSURL())
	natsURL := withHost(t, testenv.NATSURL(), nats.Addr())
	dbURL := testenv.CDCDatabaseURL(t)
	open := func() (*relayd.Relay, *prometheus.Registry) {
		reg := prometheus.NewRegistry()
		rl, err := relayd.Open(ctx, dbURL, natsSink(t, ctx, natsURL, prefix), &relayd.Options{
			Schema: tb.Schema, Table: tb.Name, Source: relayd.SourceCDC, Registerer: reg,
			CDC: cdc.Config{Mode: mode},
			Relay: relay.Config{Router: router, LeaseTTL: time.Second,
				RetryBase: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rl.Stop(context.Background()) })
		return rl, reg
	}
	status := func() ops.StatusJSON {
		t.Helper()
		s, err := drv.Status(ctx, tb)
		if err != nil {
			t.Fatal(err)
		}
		return ops.NewStatusJSON(s)
	}
	metric := func(reg *prometheus.Registry, name string) float64 {
		t.Helper()
		v, ok := gauge(t, reg, name)
		if !ok {
			t.Fatalf("no metric %s", name)
		}
		return v
	}

	var a *relayd.Relay
	var regA *prometheus.Registry
	testenv.CDCTurn(t, pool, func() { // Open creates the slot
		a, regA = open()
		if err := a.Start(ctx); err != nil {
			t.Fatal(err)
		}
		await.Eventually(t, time.Minute, func() error {
			js := status()
			if len(js.CDCSlots) != 1 || js.CDCSlots[0].ConfirmedLSN == "" || js.CDCSlots[0].Backlog == nil {
				return fmt.Errorf("the slot is not made, or its streamer recorded no backlog yet: %+v", js.CDCSlots)
			}
			return nil
		})
	})
	if js := status(); js.Backlog != 0 || js.OldestUnpublishedAgeSeconds != 0 || js.BacklogExact || js.CDCSlots[0].Backlog.Mode != mode.String() {
		t.Fatalf("status of an idle outbox = %+v, slot %+v", js, js.CDCSlots[0].Backlog)
	}

	// The broker is unreachable: 300 events in 6 transactions.
	nats.Cut()
	const n, perTx = 300, 50
	opt := outboxpgx.WithMessages()
	if mode == cdc.ModeInsertDelete {
		opt = outboxpgx.WithInsertDelete()
	}
	ob, err := outbox.New(outboxpgx.New(pool, opt), &outbox.Config{Schema: tb.Schema, Table: tb.Name})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i += perTx {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			evs := make([]outbox.Event, perTx)
			for j := range evs {
				evs[j] = outbox.Event{AggregateType: "order", AggregateID: fmt.Sprint(j % 10), Type: "Placed",
					Payload: fmt.Appendf(nil, `{"n": %d}`, i+j)}
			}
			return ob.WriteTx(ctx, tx, evs...)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	var rows int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+tb.Qualified("")).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("the table holds %d rows (%v): the mode writes none", rows, err)
	}
	var first ops.StatusJSON
	await.Eventually(t, time.Minute, func() error {
		first = status()
		s := first.CDCSlots[0]
		switch {
		case first.Backlog != n || s.Backlog.Events != n:
			return fmt.Errorf("backlog %d (slot's record %d), want the %d events decoded", first.Backlog, s.Backlog.Events, n)
		case first.OldestUnpublishedAgeSeconds <= 0 || first.OldestPendingCommitAt == nil:
			return fmt.Errorf("oldest age %vs, oldest pending commit %v: want an age", first.OldestUnpublishedAgeSeconds, first.OldestPendingCommitAt)
		case first.BacklogExact || first.WALBytesPending == nil || *first.WALBytesPending <= 0 || s.WALBytesPending <= 0:
			return fmt.Errorf("backlog exact %v, WAL pending %v (slot %d): want a lower bound and the WAL not confirmed", first.BacklogExact, first.WALBytesPending, s.WALBytesPending)
		case s.Backlog.Stale:
			return fmt.Errorf("the streamer's record is stale (%vs old) while it streams", s.Backlog.RecordAgeSeconds)
		}
		return nil
	})
	t.Logf("%s mode, broker unreachable: backlog %d (exact %v), oldest %.2fs, %d bytes of WAL not confirmed",
		mode, first.Backlog, first.BacklogExact, first.OldestUnpublishedAgeSeconds, *first.WALBytesPending)
	await.Eventually(t, time.Minute, func() error {
		if v := metric(regA, "outbox_backlog_events"); v != n {
			return fmt.Errorf("outbox_backlog_events = %v, want %d", v, n)
		}
		if v := metric(regA, "outbox_oldest_unpublished_age_seconds"); v <= first.OldestUnpublishedAgeSeconds {
			return fmt.Errorf("outbox_oldest_unpublished_age_seconds = %v, want it to grow past %v", v, first.OldestUnpublishedAgeSeconds)
		}
		if v := metric(regA, "outbox_cdc_slot_unconfirmed_bytes"); v <= 0 {
			return fmt.Errorf("outbox_cdc_slot_unconfirmed_bytes = %v, want the WAL not confirmed", v)
		}
		return nil
	})

	// The relay stops with the broker still unreachable: its last record
	// stays and goes stale, and the oldest age keeps growing.
	stopCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	a.Stop(stopCtx)
	cancel()
	await.Eventually(t, time.Minute, func() error {
		js := status()
		s := js.CDCSlots[0]
		if !s.Backlog.Stale || s.Active || js.Backlog != n || js.OldestUnpublishedAgeSeconds <= first.OldestUnpublishedAgeSeconds {
			return fmt.Errorf("after the relay stopped: backlog %d, oldest %vs (was %vs), slot active %v, record stale %v (%vs old); want %d, growing, a stale record",
				js.Backlog, js.OldestUnpublishedAgeSeconds, first.OldestUnpublishedAgeSeconds, s.Active, s.Backlog.Stale, s.Backlog.RecordAgeSeconds, n)
		}
		return nil
	})

	// The broker is back and a relay streams: everything is published,
	// and the backlog and the oldest age read 0 again.
	nats.Restore()
	b, regB := open()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.WaitStreamMsgs(t, st, n, time.Minute)
	await.Eventually(t, time.Minute, func() error {
		js := status()
		s := js.CDCSlots[0].Backlog
		if js.Backlog != 0 || js.OldestUnpublishedAgeSeconds != 0 || s.Stale || js.OldestPendingCommitAt != nil {
			return fmt.Errorf("once published: backlog %d, oldest %vs, record %+v; want 0, 0, fresh", js.Backlog, js.OldestUnpublishedAgeSeconds, s)
		}
		if v, w := metric(regB, "outbox_backlog_events"), metric(regB, "outbox_oldest_unpublished_age_seconds"); v != 0 || w != 0 {
			return fmt.Errorf("metrics once published: backlog %v, oldest age %v; want 0", v, w)
		}
		return nil
	})
}
