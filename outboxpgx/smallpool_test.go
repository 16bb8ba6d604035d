package outboxpgx_test

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/route"
	"github.com/outboxkit/outbox/sink/stdoutsink"
)

// A relay whose lanes hold every connection of its pool (three
// connections, four lanes, the pauses due again before every batch is
// published) drains a backlog: what it reads while it holds a batch goes
// over that batch's connection, never a second one of the pool.
func TestRelayDrainsThroughAPoolItsLanesHoldWhole(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t, 2*time.Minute)
	pool := testenv.PoolMax(t, 3)
	tb := testenv.Table(t, pool)
	drv := outboxpgx.New(pool)
	if _, err := drv.Migrate(ctx, tb, nil); err != nil {
		t.Fatal(err)
	}
	const events = 3000
	if _, err := pool.Exec(ctx, `INSERT INTO `+tb.Qualified("")+` (id, aggregatetype, aggregateid, type, payload)
SELECT gen_random_uuid(), 'order', 'a' || (g % 64), 'Placed', json_build_object('n', g / 64 + 1)
FROM generate_series(0, $1 - 1) AS g ORDER BY g`, events); err != nil {
		t.Fatal(err)
	}
	src, err := drv.NewSource(tb, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	router, err := route.New(&route.Config{})
	if err != nil {
		t.Fatal(err)
	}
	out := &published{order: map[string][]int{}, copies: map[string]int{}}
	rl, err := relay.New(src, stdoutsink.New(out), &relay.Config{
		BatchSize: 20, Lanes: 4, LeaseTTL: 2 * time.Second, PollInterval: time.Millisecond, Router: router,
		Logger: slog.New(slog.NewTextHandler(&testenv.Buffer{}, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := rl.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer rl.Stop(ctx)
	await.Eventually(t, 90*time.Second, func() error {
		out.mu.Lock()
		got := len(out.copies)
		out.mu.Unlock()
		if got != events {
			return fmt.Errorf("%d of %d events published: the relay is stuck", got, events)
		}
		return nil
	})
}
