package cdc_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxmysql/cdc"
)

// TestBinlogConcurrentWriters: events of concurrent writers' transactions
// (some rolled back) arrive once each, every aggregate in order.
func TestBinlogConcurrentWriters(t *testing.T) {
	f := newFixture(t)
	src := f.source("r1", cdc.ModeTable, outboxdriver.RetentionDelete)
	leases := f.acquire(src, 10*time.Second)
	f.streaming(src, leases)
	var wg sync.WaitGroup
	var mu sync.Mutex
	committed := 0
	for w := range 6 {
		wg.Go(func() {
			for i := range 50 {
				commit := i%7 != 3
				evs := []outbox.Event{}
				for k := range 1 + i%3 {
					evs = append(evs, ev(fmt.Sprintf("w%d", w), i*10+k))
				}
				f.write(commit, evs...)
				if commit {
					mu.Lock()
					committed += len(evs)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	got := f.collect(src, leases, committed)
	seen := checkOrder(t, got)
	for id, n := range seen {
		if n != 1 {
			t.Errorf("event %s published %d times", id, n)
		}
	}
	// Nothing more comes: a marker written last is the next event.
	marker := ev("marker", 1)
	marker.ID = "00000000-0000-4000-8000-00000000beef"
	f.write(true, marker)
	if next := f.collect(src, leases, 1); next[0].ID != marker.ID {
		t.Fatalf("after all %d events came %s (seen %d times before), want the marker", committed, next[0].ID, seen[next[0].ID])
	}
}
