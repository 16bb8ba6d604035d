package relay

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

// A claim that finds the pauses half due goes on with the view it has and
// reads them in the background; a view a whole poll interval old is read
// before the claim, so a pause still holds within one poll interval; and
// a relay that stops waits for the read ahead. The reads are held up by a
// transaction that locks the pause table, as a migration or a slow
// database would.
func TestClaimsDoNotWaitForAPauseReadAhead(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	drv := outboxpgx.New(pool)
	if _, err := drv.Migrate(ctx, tb, nil); err != nil {
		t.Fatal(err)
	}
	src, err := drv.NewSource(tb, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	pauseTable := tb.WithDefaults().Qualified("_pause")
	order, err := outboxdriver.ParsePauseScope("aggregatetype=order")
	if err != nil {
		t.Fatal(err)
	}

	// The test ages the view itself; an hour never passes.
	const every = time.Hour
	db, _ := newOutages(discard)
	p := newPauses(src, every, false, discard, db)
	bg, stop := context.WithCancel(ctx)
	defer stop()
	p.start(bg)
	if p.refresh(ctx) {
		t.Fatal("first read: everything paused, want nothing")
	}
	age := func(d time.Duration) {
		p.mu.Lock()
		p.readAt = time.Now().Add(-d)
		p.mu.Unlock()
	}
	reading := func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.reading
	}
	paused := func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.set.AggregateTypes["order"]
	}
	// hold locks the pause table in a transaction of its own, which runs
	// change before the lock is let go.
	hold := func(change string, args ...any) pgx.Tx {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		if _, err := tx.Exec(ctx, `LOCK TABLE `+pauseTable+` IN ACCESS EXCLUSIVE MODE`); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, change, args...); err != nil {
			t.Fatal(err)
		}
		return tx
	}
	// waitingRead waits until a read of the pauses waits for the lock.
	waitingRead := func() {
		t.Helper()
		await.Eventually(t, 10*time.Second, func() error {
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'`, tb.Name+"_pause").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				return errors.New("no read of the pauses waits for the locked table")
			}
			return nil
		})
	}
	refreshed := func() <-chan bool {
		ch := make(chan bool, 1)
		go func() { ch <- p.refresh(ctx) }()
		return ch
	}

	// Half due: the claim goes on at once, a read ahead waits for the lock,
	// and what it read is applied when the lock goes.
	tx := hold(`INSERT INTO `+pauseTable+` (scope, value, actor, role, reason) VALUES ($1, $2, 'test', 'admin', 'test')`,
		string(order.Kind), order.Value)
	age(every * 3 / 4)
	select {
	case all := <-refreshed():
		if all {
			t.Fatal("half-due view: everything paused, want nothing")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a claim with a half-due view of the pauses waited 10s for the read")
	}
	waitingRead()
	if !reading() {
		t.Fatal("a read of the pauses waits, but no read ahead runs")
	}
	if paused() {
		t.Fatal("the pause is applied before its transaction committed")
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	await.Eventually(t, 10*time.Second, func() error {
		if running, held := reading(), paused(); running || !held {
			return fmt.Errorf("since the pause committed: read ahead running %v, order paused %v", running, held)
		}
		return nil
	})

	// Due: the claim reads before it goes on, and sees the resume.
	tx = hold(`DELETE FROM `+pauseTable+` WHERE scope = $1 AND value = $2`, string(order.Kind), order.Value)
	age(every + time.Minute)
	done := refreshed()
	waitingRead()
	if reading() {
		t.Fatal("a due view was read ahead, want it read before the claim")
	}
	select {
	case <-done:
		t.Fatal("a claim went on with a view of the pauses a poll interval old")
	default:
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the claim's read of the pauses did not return 10s after the lock went")
	}
	if paused() {
		t.Fatal("the claim read the pauses after the resume, and still has order paused")
	}

	// Stopping ends a read ahead and waits for it.
	hold(`SELECT 1`)
	age(every * 3 / 4)
	<-refreshed()
	waitingRead()
	stop()
	stopped := make(chan struct{})
	go func() { p.wait(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the read ahead did not end 10s after the relay stopped")
	}
	if reading() {
		t.Fatal("the read ahead ended but is still marked running")
	}
}
