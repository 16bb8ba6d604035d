package pgschema

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
)

// A read of the view that keeps failing (here: the pool was closed) is
// tried again at the pace of a read that came back, once per half
// WakeViewMaxAge, not on every write; meanwhile, with no read ever come
// back, writers leave the question to the server (WakeCTE's check).
func TestWakeViewRetriesAFailingReadAtItsPace(t *testing.T) {
	pool := testenv.Pool(t)
	pool.Close()
	tb := outboxdriver.Table{Schema: "public", Name: "outbox"}
	var reads atomic.Int64
	v := NewWakeView(func(ctx context.Context, t outboxdriver.Table) (awake, now int64, trigger bool, err error) {
		reads.Add(1)
		err = pool.QueryRow(ctx, WakeViewSQL, WakeViewArgs(t)...).Scan(&awake, &now, &trigger)
		return awake, now, trigger, err
	})
	clock := time.Now()
	v.SetClock(tb, func() time.Time { return clock })
	// A thousand writes in the same instant start one read.
	for range 1000 {
		if !v.Wake(tb) {
			t.Fatal("a writer without a view did not leave the question to the server (WakeCTE)")
		}
	}
	waitReads := func(want int64) {
		t.Helper()
		await.Eventually(t, 10*time.Second, func() error {
			if n, running := reads.Load(), v.reading(tb); n < want || running {
				return fmt.Errorf("%d reads (one running: %v), want %d done", n, running, want)
			}
			return nil
		})
	}
	waitReads(1)
	// It failed; writes just short of the pace start none.
	clock = clock.Add(driverkit.WakeViewMaxAge/2 - time.Microsecond)
	v.SetClock(tb, func() time.Time { return clock })
	for range 1000 {
		v.Wake(tb)
	}
	if n := reads.Load(); n != 1 {
		t.Fatalf("%d reads of a failing view within half WakeViewMaxAge of the first, want 1", n)
	}
	// At the pace, one more.
	clock = clock.Add(time.Microsecond)
	v.SetClock(tb, func() time.Time { return clock })
	for range 1000 {
		v.Wake(tb)
	}
	waitReads(2)
	if n := reads.Load(); n != 2 {
		t.Fatalf("%d reads, want 2", n)
	}
}
