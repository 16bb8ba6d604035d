package relay

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/outboxkit/outbox/internal/backoff"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/sink"
)

// discard is a logger for tests whose logs say nothing they check.
var discard = slog.New(slog.DiscardHandler)

// discardOutage is a database outage tracker that logs nowhere.
func discardOutage() *backoff.Outage {
	db, _ := newOutages(discard)
	return db
}

// fakeSource is an in-memory outboxdriver.Source. Claim hands out the
// queued batches of records, then empty ones; every claim, wait, idle
// registration and finish is written to its log, in order. Its Wait
// returns after d, or at once when it wakes on commit and a non-empty
// batch is queued (as if that batch's commits had sent a wake-up).
type fakeSource struct {
	wakes bool // WakesOnCommit

	mu       sync.Mutex
	queue    [][]outboxdriver.Record
	log      []string
	outcomes []outboxdriver.Outcome
	claims   int
	// Once maxClaims claims were made, the next one calls stop and fails
	// with context.Canceled: a test's way to end the relay's loop.
	maxClaims int
	stop      context.CancelFunc
}

var _ outboxdriver.Source = (*fakeSource)(nil)

func (s *fakeSource) logf(format string, args ...any) {
	s.log = append(s.log, fmt.Sprintf(format, args...))
}

func (s *fakeSource) Log() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.log...)
}

func (s *fakeSource) Claim(_ context.Context, _ []outboxdriver.Lease, limit int) (outboxdriver.Batch, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stop != nil && s.claims == s.maxClaims {
		s.stop()
		return nil, context.Canceled
	}
	s.claims++
	var recs []outboxdriver.Record
	if len(s.queue) > 0 {
		recs, s.queue = s.queue[0], s.queue[1:]
	}
	if len(recs) > limit {
		panic(fmt.Sprintf("fakeSource: a queued batch of %d records exceeds the limit %d", len(recs), limit))
	}
	s.logf("claim %d", len(recs))
	return &fakeBatch{src: s, recs: recs}, nil
}

func (s *fakeSource) Wait(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.logf("wait %v", d)
	woken := s.wakes && len(s.queue) > 0 && len(s.queue[0]) > 0
	s.mu.Unlock()
	if woken {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	return nil
}

func (s *fakeSource) SetIdle(_ context.Context, ttl time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.logf("set-idle %v", ttl)
	return nil
}

func (s *fakeSource) WakesOnCommit() bool { return s.wakes }

func (s *fakeSource) Heartbeat(context.Context, time.Duration) (int, int, error) { return 1, 1, nil }

func (s *fakeSource) Acquire(context.Context, int, time.Duration) ([]outboxdriver.Lease, error) {
	return nil, nil
}

func (s *fakeSource) Renew(_ context.Context, leases []outboxdriver.Lease, _ time.Duration) ([]outboxdriver.Lease, error) {
	return leases, nil
}

func (s *fakeSource) Release(context.Context, []outboxdriver.Lease, bool) error { return nil }

func (s *fakeSource) Cleanup(context.Context, []outboxdriver.Lease, time.Duration, int) (int, error) {
	return 0, nil
}

// Pauses, ExcludeAggregateTypes and MaintainTimePartitions: nothing is
// ever paused, and the table has no time partitions.
func (s *fakeSource) Pauses(context.Context) ([]outboxdriver.Pause, error) { return nil, nil }
func (s *fakeSource) ExcludeAggregateTypes([]string)                       {}
func (s *fakeSource) MaintainTimePartitions(context.Context, outboxdriver.TimePartitionMaintenance) ([]outboxdriver.TimePartitionChange, error) {
	return nil, nil
}

func (s *fakeSource) RelayName() string { return "fake" }
func (s *fakeSource) Close() error      { return nil }

// fakeBatch is a claim of a fakeSource.
type fakeBatch struct {
	src  *fakeSource
	recs []outboxdriver.Record
}

func (b *fakeBatch) Records() []outboxdriver.Record { return b.recs }

func (b *fakeBatch) Pauses(ctx context.Context) ([]outboxdriver.Pause, error) {
	return b.src.Pauses(ctx)
}

func (b *fakeBatch) Finish(_ context.Context, out outboxdriver.Outcome) error {
	b.src.mu.Lock()
	defer b.src.mu.Unlock()
	b.src.logf("finish %d published %d failed", len(out.Published), len(out.Failed))
	b.src.outcomes = append(b.src.outcomes, out)
	return nil
}

func (b *fakeBatch) Release(context.Context) {}

// fakeSink acknowledges every message except those whose event id is in
// fail, and records the ids of each Publish call. The relay publishes a
// batch from one goroutine.
type fakeSink struct {
	fail  map[string]error
	waves [][]string
}

func (s *fakeSink) Publish(_ context.Context, msgs []sink.Message) []error {
	ids := make([]string, len(msgs))
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		ids[i], errs[i] = m.ID, s.fail[m.ID]
	}
	s.waves = append(s.waves, ids)
	return errs
}

func (s *fakeSink) Close() error { return nil }

// records returns a record for each id, such as "a1": an event of the
// order aggregate named by the id's first letter ("a").
func records(ids ...string) []outboxdriver.Record {
	recs := make([]outboxdriver.Record, len(ids))
	for i, id := range ids {
		recs[i] = outboxdriver.Record{ID: id, Seq: int64(i + 1), AggregateType: "order", AggregateID: id[:1], Type: "Placed"}
	}
	return recs
}
