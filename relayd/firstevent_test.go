package relayd_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

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

// An idle relay is woken by the commit of an event, in every write mode:
// the polling relay by the notify trigger while it is registered idle,
// log tailing by the stream. Its poll interval here is ten minutes, and
// each event must arrive within a minute of its commit, so no event waits
// for a poll (docs/benchmarks.md#latency has the times).
func TestIdleRelayIsWokenByTheCommit(t *testing.T) {
	// A cluster of the test's own, with wal_level = logical: its slots go
	// with it.
	pg := testenv.StartPrivatePostgres(t)
	ctx := testenv.Context(t, 4*time.Minute)
	pool, err := pgxpool.New(ctx, pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	_, js := testenv.JetStream(t)
	const poll = 10 * time.Minute
	for _, c := range []struct {
		name   string
		source string
		mode   cdc.Mode
		opts   []outboxpgx.Option
	}{
		{"polling", relayd.SourcePoll, 0, nil},
		{"log tailing, table mode", relayd.SourceCDC, cdc.ModeTable, nil},
		{"log tailing, message mode", relayd.SourceCDC, cdc.ModeMessages, []outboxpgx.Option{outboxpgx.WithMessages()}},
	} {
		tb := outboxdriver.Table{Schema: "public", Name: testenv.Name("outbox")}
		drv := outboxpgx.New(pool, c.opts...)
		if _, err := drv.Migrate(ctx, tb, &outboxdriver.MigrateOptions{CDC: c.source == relayd.SourceCDC}); err != nil {
			t.Fatalf("%s: migrate: %v", c.name, err)
		}
		st, prefix := testenv.Stream(t, js)
		router, err := route.New(&route.Config{Destination: prefix + ".all"})
		if err != nil {
			t.Fatal(err)
		}
		rl, err := relayd.Open(ctx, pg.URL(), natsSink(t, ctx, testenv.NATSURL(), prefix), &relayd.Options{
			Schema: tb.Schema, Table: tb.Name, Source: c.source, CDC: cdc.Config{Mode: c.mode},
			Relay: relay.Config{Router: router, LeaseTTL: 5 * time.Second, PollInterval: poll},
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := rl.Start(ctx); err != nil {
			t.Fatal(err)
		}
		// Idle: the polling relay registered for wake-ups, or the stream
		// running.
		idle := func() error {
			var ok bool
			var err error
			if c.source == relayd.SourcePoll {
				err = pool.QueryRow(ctx, `SELECT pg_sequence_last_value(to_regclass($1)) > (extract(epoch FROM clock_timestamp()) * 1000)::bigint`,
					tb.Qualified("_awake")).Scan(&ok)
			} else {
				err = pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid
					WHERE s.slot_name = $1 AND r.state = 'streaming')`, cdc.DefaultSlot(tb)).Scan(&ok)
			}
			if err != nil || !ok {
				return fmt.Errorf("%s: the relay is not idle yet (%v)", c.name, err)
			}
			return nil
		}
		ob, err := outbox.New(drv, &outbox.Config{Schema: tb.Schema, Table: tb.Name})
		if err != nil {
			t.Fatal(err)
		}
		// Three lone events, each once the relay is idle again.
		for i := range 3 {
			await.Eventually(t, time.Minute, idle)
			if err := ob.Write(ctx, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprint(i), Type: "Placed", Payload: []byte(`{}`)}); err != nil {
				t.Fatalf("%s: write: %v", c.name, err)
			}
			testenv.WaitStreamMsgs(t, st, uint64(i+1), time.Minute) // far below the poll interval
		}
		if err := rl.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
