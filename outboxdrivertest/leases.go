package outboxdrivertest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
)

// checkLeases fails unless leases cover partitions 0..n-1 once each, each
// with an epoch of at least 1.
func checkLeases(t *testing.T, what string, leases []outboxdriver.Lease, n int) {
	t.Helper()
	seen := map[int]bool{}
	for _, l := range leases {
		if l.Partition < 0 || l.Partition >= n || seen[l.Partition] || l.Epoch < 1 {
			t.Fatalf("%s: leases %+v; want partitions 0..%d once each, epochs >= 1", what, leases, n-1)
		}
		seen[l.Partition] = true
	}
	if len(seen) != n {
		t.Fatalf("%s: %d leases, want all %d partitions", what, len(leases), n)
	}
}

// epochs maps partitions to epochs.
func epochs(leases []outboxdriver.Lease) map[int]int64 {
	m := map[int]int64{}
	for _, l := range leases {
		m[l.Partition] = l.Epoch
	}
	return m
}

// testLeaseFence, with one Source: Heartbeat counts the relay and the
// partitions; Acquire takes only what nobody holds; Renew returns what is
// still held; a partition released and acquired again has a higher epoch,
// and the batch claimed under the old lease is refused by Finish with
// ErrLeaseLost, recording nothing; Release(all) frees every lease.
func (s *suite) testLeaseFence(t *testing.T) {
	e := s.newEnv(t, partitions)
	var written []string
	for n := range 3 {
		x := ev(fmt.Sprint("agg-", n), 0)
		e.write(x)
		written = append(written, x.ID)
	}
	src := e.source(outboxdriver.SourceConfig{})
	relays, n, err := src.Heartbeat(e.ctx, time.Minute)
	if err != nil || relays != 1 || n != partitions {
		t.Fatalf("Heartbeat = %d relays, %d partitions (err %v); want 1 and the %d migrated", relays, n, err, partitions)
	}
	leases, err := src.Acquire(e.ctx, 1000, time.Minute)
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	checkLeases(t, "Acquire of 1000", leases, n)
	if more, err := src.Acquire(e.ctx, 1000, time.Minute); err != nil || len(more) != 0 {
		t.Fatalf("Acquire of partitions the relay already holds = %+v (err %v); want none", more, err)
	}
	if kept, err := src.Renew(e.ctx, leases, time.Minute); err != nil || !sameLeases(kept, leases) {
		t.Fatalf("Renew = %+v (err %v); want every lease held, %+v", kept, err, leases)
	}
	stale := []outboxdriver.Lease{{Partition: leases[0].Partition, Epoch: leases[0].Epoch + 100}}
	if kept, err := src.Renew(e.ctx, stale, time.Minute); err != nil || len(kept) != 0 {
		t.Fatalf("Renew of a lease with another epoch = %+v (err %v); want none", kept, err)
	}
	b := e.open(src, leases, 10)
	if !sameIDs(ids(b.Records()), written) {
		t.Fatalf("claimed %v, want the 3 written", describe(b.Records()))
	}
	if err := src.Release(e.ctx, leases, false); err != nil {
		t.Fatalf("release: %v", err)
	}
	again, err := src.Acquire(e.ctx, 1000, time.Minute)
	if err != nil {
		t.Fatalf("acquire after release: %v", err)
	}
	checkLeases(t, "Acquire after Release", again, n)
	old := epochs(leases)
	for _, l := range again {
		if l.Epoch <= old[l.Partition] {
			t.Fatalf("partition %d acquired again with epoch %d after %d; want a higher one", l.Partition, l.Epoch, old[l.Partition])
		}
	}
	r := b.Records()
	err = b.Finish(e.ctx, outboxdriver.Outcome{
		Published: []string{r[0].ID},
		Failed: []outboxdriver.Failure{
			{ID: r[1].ID, Err: errors.New("busy"), RetryAfter: time.Hour},
			{ID: r[2].ID, Err: errors.New("poison"), DeadLetter: true, Hold: true},
		},
	})
	if !errors.Is(err, outboxdriver.ErrLeaseLost) {
		t.Fatalf("Finish of a batch claimed under a released lease = %v; want ErrLeaseLost", err)
	}
	if st := e.status(); st.Backlog != 3 || st.Published != 0 || st.DeadLetters != 0 || st.Held != 0 {
		t.Fatalf("status %+v after a refused Finish; want backlog 3, nothing published, dead-lettered or held: nothing recorded", st)
	}
	got := e.claim(src, again, 10)
	if !sameIDs(ids(got), written) {
		t.Fatalf("claim under the new leases = %v; want the 3 written, untouched", describe(got))
	}
	for _, r := range got {
		if r.Attempts != 0 {
			t.Fatalf("%s has %d attempts after a refused Finish; want 0", describe([]outboxdriver.Record{r}), r.Attempts)
		}
	}
	if err := src.Release(e.ctx, again, true); err != nil {
		t.Fatalf("release all: %v", err)
	}
	for _, p := range e.status().Partitions {
		if p.Owner != "" {
			t.Fatalf("partition %+v still owned after Release(all)", p)
		}
	}
}

// sameLeases reports whether a and b hold the same leases, in any order.
func sameLeases(a, b []outboxdriver.Lease) bool {
	if len(a) != len(b) {
		return false
	}
	m := epochs(a)
	for _, l := range b {
		if e, ok := m[l.Partition]; !ok || e != l.Epoch {
			return false
		}
	}
	return true
}

// testLeasesBetweenRelays: two Sources (relays) on one table. Heartbeat
// counts both; Acquire is exclusive; Renew extends; after a lease expires
// the other relay acquires it with a higher epoch; the stale owner's Finish
// fails with ErrLeaseLost and records nothing, its Renew and Claim get
// nothing; Release(all) frees the leases and the registration.
func (s *suite) testLeasesBetweenRelays(t *testing.T) {
	e := s.newEnv(t, partitions)
	var written []string
	for n := range 10 {
		x := ev(fmt.Sprint("agg-", n), 0)
		e.write(x)
		written = append(written, x.ID)
	}
	a := e.source(outboxdriver.SourceConfig{})
	b := e.source(outboxdriver.SourceConfig{})
	if relays, n, err := a.Heartbeat(e.ctx, time.Minute); err != nil || relays != 1 || n != partitions {
		t.Fatalf("first Heartbeat = %d relays, %d partitions (err %v); want 1 and %d", relays, n, err, partitions)
	}
	if relays, _, err := b.Heartbeat(e.ctx, time.Minute); err != nil || relays != 2 {
		t.Fatalf("second relay's Heartbeat = %d relays (err %v); want 2", relays, err)
	}
	aLeases, err := a.Acquire(e.ctx, 1000, 5*time.Second)
	if err != nil {
		t.Fatalf("a acquire: %v", err)
	}
	checkLeases(t, "a's Acquire", aLeases, partitions)
	if got, err := b.Acquire(e.ctx, 1000, time.Minute); err != nil || len(got) != 0 {
		t.Fatalf("b acquired %+v (err %v) of the partitions a holds", got, err)
	}
	// Renew extends: leases taken for 5s run for a minute once renewed.
	if kept, err := a.Renew(e.ctx, aLeases, time.Minute); err != nil || !sameLeases(kept, aLeases) {
		t.Fatalf("a's Renew = %+v (err %v); want all its leases", kept, err)
	}
	for _, p := range e.status().Partitions {
		if p.Owner != a.RelayName() || p.ExpiresIn < 10*time.Second {
			t.Fatalf("partition %+v after a renewal for a minute; want owner %q and well over 10s to run", p, a.RelayName())
		}
	}
	batch := e.open(a, aLeases, 100)
	if !sameIDs(ids(batch.Records()), written) {
		t.Fatalf("a claimed %v, want the 10 written", describe(batch.Records()))
	}
	// a stalls: its leases run out and b takes every partition over.
	if kept, err := a.Renew(e.ctx, aLeases, 300*time.Millisecond); err != nil || !sameLeases(kept, aLeases) {
		t.Fatalf("a's short Renew = %+v (err %v); want all its leases", kept, err)
	}
	var bLeases []outboxdriver.Lease
	await.Eventually(t, 20*time.Second, func() error {
		got, err := b.Acquire(e.ctx, 1000, time.Minute)
		if err != nil {
			t.Fatalf("b acquire: %v", err)
		}
		if bLeases = append(bLeases, got...); len(bLeases) < partitions {
			return fmt.Errorf("b took over %d of %d partitions after a's leases expired", len(bLeases), partitions)
		}
		return nil
	})
	checkLeases(t, "b's take-over", bLeases, partitions)
	old := epochs(aLeases)
	for _, l := range bLeases {
		if l.Epoch <= old[l.Partition] {
			t.Fatalf("partition %d changed owner with epoch %d after %d; want a higher one", l.Partition, l.Epoch, old[l.Partition])
		}
	}
	// The fence: a's late outcome is refused and nothing is recorded.
	err = batch.Finish(e.ctx, outboxdriver.Outcome{Published: ids(batch.Records())})
	if !errors.Is(err, outboxdriver.ErrLeaseLost) {
		t.Fatalf("the stale owner's Finish = %v; want ErrLeaseLost", err)
	}
	if st := e.status(); st.Backlog != 10 {
		t.Fatalf("backlog %d after a refused Finish; want 10", st.Backlog)
	}
	if kept, err := a.Renew(e.ctx, aLeases, time.Minute); err != nil || len(kept) != 0 {
		t.Fatalf("a renewed %+v (err %v) of the leases b took over; want none", kept, err)
	}
	if got := e.claim(a, aLeases, 100); len(got) != 0 {
		t.Fatalf("a claimed %v under leases it lost", describe(got))
	}
	for _, p := range e.status().Partitions {
		if p.Owner != b.RelayName() || p.Epoch != epochs(bLeases)[p.Partition] {
			t.Fatalf("partition %+v; want owner %q at epoch %d", p, b.RelayName(), epochs(bLeases)[p.Partition])
		}
	}
	if got := e.publishAll(b, bLeases); !sameSet(ids(got), written) {
		t.Fatalf("b published %v; want the 10 written", describe(got))
	}
	// Release(all) hands the partitions back and unregisters b.
	if err := b.Release(e.ctx, bLeases, true); err != nil {
		t.Fatalf("b release all: %v", err)
	}
	if relays, _, err := a.Heartbeat(e.ctx, time.Minute); err != nil || relays != 1 {
		t.Fatalf("Heartbeat after b's Release(all) = %d relays (err %v); want 1", relays, err)
	}
	got, err := a.Acquire(e.ctx, 1000, time.Minute)
	if err != nil {
		t.Fatalf("a acquire after b's release: %v", err)
	}
	checkLeases(t, "a's Acquire after b's Release(all)", got, partitions)
}
