package relay

import (
	"context"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// The tests of this file run in a synctest bubble: time stands still
// unless a test waits, and then it moves on at once by exactly the wait.

const poll = 100 * time.Millisecond

func wantLog(t *testing.T, src *fakeSource, want ...string) {
	t.Helper()
	if got := src.Log(); !slices.Equal(got, want) {
		t.Fatalf("source calls:\n  got  %s\n  want %s", strings.Join(got, ", "), strings.Join(want, ", "))
	}
}

// mustEmpty takes an empty claim that must be followed by a wait, and
// returns the wait.
func mustEmpty(t *testing.T, wk *wakeups) time.Duration {
	t.Helper()
	d, ok := wk.empty(context.Background())
	if !ok {
		t.Fatal("empty claim: the relay registered and claims again, want a wait")
	}
	return d
}

// mustRegister takes an empty claim that must (re)register the relay.
func mustRegister(t *testing.T, wk *wakeups) {
	t.Helper()
	if d, ok := wk.empty(context.Background()); ok {
		t.Fatalf("empty claim: wait %v, want to register and claim again at once", d)
	}
}

// registered returns the wake-up state of a relay over a fresh fakeSource,
// registered for wake-ups.
func registered(t *testing.T, wakes bool) (*fakeSource, *wakeups) {
	t.Helper()
	src := &fakeSource{wakes: wakes}
	wk := newWakeups(src, poll, discardOutage())
	mustRegister(t, wk)
	wantLog(t, src, "set-idle 300ms")
	return src, wk
}

// Caught up, the relay registers and looks once more; then, without
// wake-ups on commit, its waits double from minWait to the poll interval.
func TestWakeupsRegisterThenDoubleTheWaitsUpToThePollInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src, wk := registered(t, false)
		var got []time.Duration
		for range 9 {
			got = append(got, mustEmpty(t, wk))
		}
		ms := time.Millisecond
		want := []time.Duration{ms, 2 * ms, 4 * ms, 8 * ms, 16 * ms, 32 * ms, 64 * ms, poll, poll}
		if !slices.Equal(got, want) {
			t.Fatalf("waits %v, want %v", got, want)
		}
		wantLog(t, src, "set-idle 300ms")
	})
}

// With a source that wakes the relay on commit, a relay that registered
// anew looks once more after relook (for the events of writers that had
// not seen the registration yet), then waits the whole poll interval.
func TestWakeupsWithWakesOnCommitWaitThePollInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src, wk := registered(t, true)
		if d := mustEmpty(t, wk); d != relook {
			t.Fatalf("first wait after registering: %v, want relook %v", d, relook)
		}
		for i := range 3 {
			if d := mustEmpty(t, wk); d != poll {
				t.Fatalf("wait %d: %v, want the poll interval %v", i, d, poll)
			}
		}
		wantLog(t, src, "set-idle 300ms")
	})
}

// Only a new registration is followed by the relook: not a renewal, which
// writers already knew of; again after the relay left the registry and
// came back. A clean batch right after a new registration is followed by
// another claim, not by a wait for a wake-up.
func TestWakeupsRelookOnlyAfterANewRegistration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		src, wk := registered(t, true)
		if got := wk.caughtUp(ctx); got != carryOn {
			t.Fatalf("a clean batch right after registering: caughtUp %v, want carryOn", got)
		}
		if d := mustEmpty(t, wk); d != relook {
			t.Fatalf("after registering: wait %v, want relook %v", d, relook)
		}
		time.Sleep(poll + time.Nanosecond)
		mustRegister(t, wk) // a renewal
		if d := mustEmpty(t, wk); d != poll {
			t.Fatalf("after a renewal: wait %v, want the poll interval %v", d, poll)
		}
		wk.claimed(ctx, 10, true) // a full batch: leaves the registry
		mustRegister(t, wk)
		if d := mustEmpty(t, wk); d != relook {
			t.Fatalf("after registering again: wait %v, want relook %v", d, relook)
		}
		wantLog(t, src, "set-idle 300ms", "set-idle 300ms", "set-idle 0s", "set-idle 300ms")
	})
}

// A registration is renewed once more than a poll interval has passed
// since it was made, both after an empty claim and after a clean batch.
func TestWakeupsRenewTheRegistrationAfterAPollInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		src, wk := registered(t, true)

		time.Sleep(poll)
		mustEmpty(t, wk)
		if got := wk.caughtUp(ctx); got != awaitWakeup {
			t.Fatalf("after exactly a poll interval: caughtUp %v, want awaitWakeup", got)
		}
		wantLog(t, src, "set-idle 300ms")

		time.Sleep(time.Nanosecond)
		mustRegister(t, wk)
		wantLog(t, src, "set-idle 300ms", "set-idle 300ms")

		time.Sleep(poll + time.Nanosecond)
		if got := wk.caughtUp(ctx); got != claimAgain {
			t.Fatalf("after a clean batch past a poll interval: caughtUp %v, want claimAgain", got)
		}
		wantLog(t, src, "set-idle 300ms", "set-idle 300ms", "set-idle 300ms")
		if got := wk.caughtUp(ctx); got != awaitWakeup {
			t.Fatalf("right after the renewal: caughtUp %v, want awaitWakeup", got)
		}
	})
}

// A clean short batch lets the relay wait for a wake-up only while it is
// registered with a source that wakes it on commit.
func TestWakeupsCaughtUpWaitsOnlyForACommitWakeup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		unregistered := newWakeups(&fakeSource{wakes: true}, poll, discardOutage())
		if got := unregistered.caughtUp(ctx); got != carryOn {
			t.Errorf("not registered: caughtUp %v, want carryOn", got)
		}
		_, polling := registered(t, false)
		if got := polling.caughtUp(ctx); got != carryOn {
			t.Errorf("registered, no wake-ups on commit: caughtUp %v, want carryOn", got)
		}
		_, waking := registered(t, true)
		mustEmpty(t, waking) // the relook after registering
		if got := waking.caughtUp(ctx); got != awaitWakeup {
			t.Errorf("registered, wake-ups on commit: caughtUp %v, want awaitWakeup", got)
		}
	})
}

// Claims that average leaveFlow events take the relay out of the registry
// (steady); an empty claim is then followed by waits of minWait doubling
// up to maxSteadyWait, and the relay registers again when the next wait
// would be longer.
func TestWakeupsLeaveTheRegistryDuringASteadyFlow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		src, wk := registered(t, true)
		// The average of claims of 5 reaches leaveFlow (3) at the fifth.
		for range 4 {
			wk.claimed(ctx, 5, false)
		}
		wantLog(t, src, "set-idle 300ms")
		wk.claimed(ctx, 5, false)
		wantLog(t, src, "set-idle 300ms", "set-idle 0s")
		if !wk.steady {
			t.Fatal("left the registry for a flow, but not steady")
		}
		if d := mustEmpty(t, wk); d != minWait {
			t.Fatalf("first wait in a steady flow %v, want %v", d, minWait)
		}
		if d := mustEmpty(t, wk); d != 2*minWait {
			t.Fatalf("second wait in a steady flow %v, want %v", d, 2*minWait)
		}
		mustRegister(t, wk)
		if wk.steady {
			t.Fatal("registered again, but still steady")
		}
		wantLog(t, src, "set-idle 300ms", "set-idle 0s", "set-idle 300ms")
	})
}

// Out of the registry for a flow, the relay registers again once the
// average falls under rejoinFlow, however short its waits are.
func TestWakeupsRejoinWhenTheFlowFalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		src, wk := registered(t, true)
		for range 5 {
			wk.claimed(ctx, 5, false)
		}
		// Single events between empty claims: every wait is minWait,
		// while the average falls (3.36, then 2.69, 2.35, 1.88, 1.70,
		// 1.36 with the empty claims).
		for range 2 {
			if d := mustEmpty(t, wk); d != minWait {
				t.Fatalf("wait %v, want %v", d, minWait)
			}
			wk.claimed(ctx, 1, false)
		}
		if wk.flow < rejoinFlow || !wk.steady {
			t.Fatalf("flow %.2f, steady %v before the last empty claim: the test's arithmetic is off", wk.flow, wk.steady)
		}
		mustRegister(t, wk)
		wantLog(t, src, "set-idle 300ms", "set-idle 0s", "set-idle 300ms")
	})
}

// A full batch takes the relay out of the registry without the steady
// mode: the next empty claim registers it again at once.
func TestWakeupsAFullBatchLeavesTheRegistry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		src, wk := registered(t, false)
		wk.claimed(ctx, 500, true)
		if wk.steady {
			t.Fatal("a full batch set the steady mode")
		}
		mustRegister(t, wk)
		wantLog(t, src, "set-idle 300ms", "set-idle 0s", "set-idle 300ms")
	})
}

// Without wake-ups on commit, claims of many events short of a full batch
// leave the relay registered.
func TestWakeupsWithoutWakesOnCommitAFlowKeepsTheRegistration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		src, wk := registered(t, false)
		for range 20 {
			wk.claimed(ctx, 50, false)
		}
		wantLog(t, src, "set-idle 300ms")
	})
}

// runLoop runs the relay's main loop over src, with one lease, until src
// has served claims claims. Call it in a synctest bubble.
func runLoop(t *testing.T, src *fakeSource, claims int) {
	t.Helper()
	r, err := New(src, &fakeSink{}, &Config{PollInterval: 500 * time.Millisecond, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	r.leases.set([]outboxdriver.Lease{{Partition: 0, Epoch: 1}}, time.Now(), time.Hour, true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src.stop, src.maxClaims = cancel, claims
	r.loop(ctx, ctx)
}

// The main loop, polling a source without wake-ups on commit that has
// nothing: register and look once more, then waits from 1ms doubling up
// to the poll interval (500ms), the registration renewed whenever more
// than a poll interval passed since it was made.
func TestLoopPollsWithDoublingWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &fakeSource{}
		runLoop(t, src, 14)
		want := []string{"claim 0", "set-idle 1.5s"}
		for d := time.Millisecond; d <= 256*time.Millisecond; d *= 2 {
			want = append(want, "claim 0", "wait "+d.String())
		}
		// 511ms after the registration:
		want = append(want, "claim 0", "set-idle 1.5s",
			"claim 0", "wait 500ms", "claim 0", "wait 500ms",
			"claim 0", "set-idle 1.5s")
		wantLog(t, src, want...)
	})
}

// The main loop through a steady flow and after it, with a source that
// wakes it on commit: registered (and past the relook), it waits for a
// wake-up after each short batch; once its claims average leaveFlow
// events it leaves the registry and claims back to back; when the flow
// stops it looks again after 1ms and 2ms, then registers, looks once more
// after the relook, and waits for a wake-up.
func TestLoopLeavesTheRegistryDuringASteadyFlow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &fakeSource{wakes: true}
		src.queue = [][]outboxdriver.Record{nil, nil} // the first claims find nothing
		for range 5 {
			src.queue = append(src.queue, records("a1", "b1", "c1", "d1", "e1"))
		}
		runLoop(t, src, 12)
		wantLog(t, src,
			"claim 0", "set-idle 1.5s",
			"claim 0", "wait "+relook.String(),
			"claim 5", "finish 5 published 0 failed", "wait 500ms",
			"claim 5", "finish 5 published 0 failed", "wait 500ms",
			"claim 5", "finish 5 published 0 failed", "wait 500ms",
			"claim 5", "finish 5 published 0 failed", "wait 500ms",
			"claim 5", "set-idle 0s", "finish 5 published 0 failed",
			"claim 0", "wait 1ms",
			"claim 0", "wait 2ms",
			"claim 0", "set-idle 1.5s",
			"claim 0", "wait "+relook.String(),
			"claim 0", "wait 500ms",
		)
	})
}

// A relay whose leases ran out by its own clock without a renewal (it was
// paused past the TTL, say) claims nothing more: another relay may own
// those partitions now.
func TestLoopClaimsNothingOnceItsLeasesRanOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &fakeSource{}
		r, err := New(src, &fakeSink{}, &Config{PollInterval: 100 * time.Millisecond, LeaseTTL: time.Second, Logger: discard})
		if err != nil {
			t.Fatal(err)
		}
		r.leases.set([]outboxdriver.Lease{{Partition: 0, Epoch: 1}}, time.Now(), time.Second, true)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { r.loop(ctx, ctx); close(done) }()
		claims := func() int {
			src.mu.Lock()
			defer src.mu.Unlock()
			return src.claims
		}
		time.Sleep(time.Second)
		synctest.Wait()
		valid := claims()
		if valid == 0 {
			t.Fatal("no claim while the lease was valid")
		}
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if n := claims(); n != valid {
			t.Fatalf("%d claims after the lease ran out (%d before)", n-valid, valid)
		}
		cancel()
		<-done
	})
}
