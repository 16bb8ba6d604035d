package relayd_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

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

// Options.Source "cdc" relays by log tailing: Open checks the database
// and creates the publication and the slot (writers in message mode can
// write at once), a row and a
// logical decoding message both reach the broker, and Stop leaves no
// goroutine behind and lets go of the slot, so that migrate --down drops
// it.
func TestOpenWithLogTailing(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	pool := testenv.CDCPool(t)
	tb := cdcTable(t, pool)
	_, js := testenv.JetStream(t)
	st, prefix := testenv.Stream(t, js)
	router, err := route.New(&route.Config{Destination: prefix + ".all"})
	if err != nil {
		t.Fatal(err)
	}
	url := testenv.CDCDatabaseURL(t)
	before := goroutinesOnly()
	var rl *relayd.Relay
	testenv.CDCTurn(t, pool, func() { // Open creates the slot
		rl, err = relayd.Open(ctx, url, natsSink(t, ctx, testenv.NATSURL(), prefix), &relayd.Options{
			Schema: tb.Schema, Table: tb.Name, Source: relayd.SourceCDC,
			Relay: relay.Config{Router: router, LeaseTTL: time.Second},
		})
		if err != nil {
			t.Fatal(err)
		}
		var made bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, cdc.DefaultSlot(tb)).Scan(&made); err != nil || !made {
			t.Fatalf("Open did not make the slot: %v", err)
		}
		if err := rl.Start(ctx); err != nil {
			t.Fatal(err)
		}
		await.Eventually(t, 30*time.Second, func() error {
			var streaming bool
			err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid
				WHERE s.slot_name = $1 AND r.state IN ('catchup', 'streaming'))`, cdc.DefaultSlot(tb)).Scan(&streaming)
			if err != nil || !streaming {
				return fmt.Errorf("the relay does not stream (%v)", err)
			}
			return nil
		})
	})
	for _, opts := range [][]outboxpgx.Option{nil, {outboxpgx.WithMessages()}} {
		ob, err := outbox.New(outboxpgx.New(pool, opts...), &outbox.Config{Schema: tb.Schema, Table: tb.Name})
		if err != nil {
			t.Fatal(err)
		}
		if err := ob.Write(ctx, outbox.Event{AggregateType: "order", AggregateID: "1", Type: "Placed", Payload: []byte(`{"n": 1}`)}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitStreamMsgs(t, st, 2, 30*time.Second)
	if err := rl.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := goleak.Find(before...); err != nil {
		t.Fatalf("Stop left goroutines behind: %v", err)
	}
}

// cdcTable migrates a table in a fresh schema of testenv.CDCDatabase
// (pool), while no other log-tailing test runs DDL; when the test ends it
// is reverted (which drops its slot) and the schema dropped.
func cdcTable(t *testing.T, pool *pgxpool.Pool) outboxdriver.Table {
	t.Helper()
	ctx := testenv.Context(t, time.Minute)
	tb := outboxdriver.Table{Schema: testenv.Name("t"), Name: "outbox"}
	drv := outboxpgx.New(pool)
	testenv.CDCTurn(t, pool, func() {
		if _, err := drv.Migrate(ctx, tb, nil); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() {
		testenv.CDCTurn(t, pool, func() {
			if _, err := drv.MigrateDown(context.Background(), tb, 0); err != nil {
				t.Errorf("migrate down: %v", err)
			}
			pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+outboxdriver.QuoteIdent(tb.Schema)+` CASCADE`)
		})
	})
	return tb
}

// Open refuses a source it does not know.
func TestOpenRefusesAnUnknownSource(t *testing.T) {
	ctx := testenv.Context(t, time.Minute)
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	if _, err := outboxpgx.New(pool).Migrate(ctx, tb, nil); err != nil {
		t.Fatal(err)
	}
	_, err := relayd.Open(ctx, testenv.DatabaseURL(), newTrackedSink(), &relayd.Options{Schema: tb.Schema, Table: tb.Name, Source: "debezium"})
	if err == nil || !strings.Contains(err.Error(), `unknown source "debezium"`) {
		t.Fatalf("Open with source debezium = %v", err)
	}
	// The binary log is MySQL's and MariaDB's.
	_, err = relayd.Open(ctx, testenv.DatabaseURL(), newTrackedSink(), &relayd.Options{Schema: tb.Schema, Table: tb.Name, Source: relayd.SourceBinlog})
	if err == nil || !strings.Contains(err.Error(), "needs MySQL or MariaDB") {
		t.Fatalf("Open with source binlog on PostgreSQL = %v", err)
	}
}
