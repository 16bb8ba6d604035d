package cdc_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/route"
	"github.com/outboxkit/outbox/sink"
)

// blockingSink acknowledges every message at once, except those of one
// aggregate (key), which wait until release is closed. It records the
// first acknowledgement of each id, in order.
type blockingSink struct {
	key     string
	gate    chan struct{} // every Publish waits for it first
	release chan struct{}
	blocked chan struct{} // closed when a message of key first waits

	mu      sync.Mutex
	once    sync.Once
	seen    map[string]bool
	acked   []sink.Message
	waiting bool
}

func newBlockingSink(key string) *blockingSink {
	return &blockingSink{key: key, gate: make(chan struct{}), release: make(chan struct{}), blocked: make(chan struct{}), seen: map[string]bool{}}
}

func (s *blockingSink) Publish(ctx context.Context, msgs []sink.Message) []error {
	errs := make([]error, len(msgs))
	select {
	case <-s.gate:
	case <-ctx.Done():
		for i := range errs {
			errs[i] = ctx.Err()
		}
		return errs
	}
	var held []int
	for i, m := range msgs {
		if string(m.Key) == s.key {
			held = append(held, i)
			continue
		}
		s.ack(m)
	}
	if len(held) == 0 {
		return errs
	}
	s.mu.Lock()
	s.waiting = true
	s.mu.Unlock()
	s.once.Do(func() { close(s.blocked) })
	select {
	case <-s.release:
		for _, i := range held {
			s.ack(msgs[i])
		}
	case <-ctx.Done():
		for _, i := range held {
			errs[i] = ctx.Err()
		}
	}
	s.mu.Lock()
	s.waiting = false
	s.mu.Unlock()
	return errs
}

func (s *blockingSink) ack(m sink.Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.seen[m.ID] {
		s.seen[m.ID] = true
		s.acked = append(s.acked, m)
	}
}

// count returns how many of ids were acknowledged, and whether a message
// of the blocked aggregate still waits.
func (s *blockingSink) count(ids []string) (n int, waiting bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if s.seen[id] {
			n++
		}
	}
	return n, s.waiting
}

func (s *blockingSink) Close() error { return nil }

// While one aggregate's publish hangs, the relay keeps publishing the
// other aggregates' events committed after it (in the other lanes'
// batches), with the polling source and with log tailing alike; once it is
// answered, every event arrives, each aggregate's in commit order.
func TestOneHangingAggregateDoesNotStopTheOthers(t *testing.T) {
	t.Parallel()
	for _, source := range []string{"poll", "cdc"} {
		t.Run(source, func(t *testing.T) {
			t.Parallel()
			f := newCDC(t)
			const batch, aggregates, perAggregate = 20, 40, 25
			snk := newBlockingSink("x")
			router, err := route.New(nil)
			if err != nil {
				t.Fatal(err)
			}
			// The publish of the hanging aggregate times out after half the
			// lease TTL: far beyond what the test waits for.
			cfg := relay.Config{BatchSize: batch, LeaseTTL: time.Minute, Router: router}
			var src outboxdriver.Source
			if source == "cdc" {
				f.setup()
				src = f.source("r1", nil)
			} else {
				src, err = outboxpgx.New(f.pool).NewSource(f.tb, &outboxdriver.SourceConfig{RelayName: "r1", Logger: f.log})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { src.Close() })
			}
			f.relayInto(src, snk, cfg)
			if source == "cdc" {
				f.streaming()
				f.eventually("the new slot is drained", func() bool {
					var drained bool
					err := f.pool.QueryRow(f.ctx, `SELECT drained FROM `+f.tb.Qualified("_cdc")).Scan(&drained)
					return err == nil && drained
				})
			}
			// A backlog in commit order: some events of every aggregate,
			// then the hanging aggregate's one, then many more.
			ob := f.writer(modeTable)
			var order [][]outbox.Event // by aggregate, in commit order
			for range aggregates {
				order = append(order, nil)
			}
			var after, all []string
			writeRound := func(round int, keep *[]string) {
				var evs []outbox.Event
				for a := range aggregates {
					e := cdcEvent(fmt.Sprintf("o%d", a), round)
					order[a] = append(order[a], e)
					evs = append(evs, e)
					all = append(all, e.ID)
					if keep != nil {
						*keep = append(*keep, e.ID)
					}
					if len(evs) == 10 {
						f.write(ob, evs...)
						evs = nil
					}
				}
			}
			for round := range 5 {
				writeRound(round, nil)
			}
			x := cdcEvent("x", 1)
			f.write(ob, x)
			all = append(all, x.ID)
			for round := 5; round < perAggregate; round++ {
				writeRound(round, &after)
			}
			if source == "cdc" {
				// Publishing starts once the stream has sent the whole
				// backlog, so that the relay's claims are full batches from
				// the start (as in a backlog) rather than each transaction as
				// it arrives.
				var end string
				if err := f.pool.QueryRow(f.ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&end); err != nil {
					t.Fatal(err)
				}
				f.eventually("the stream sent the backlog", func() bool {
					var ok bool
					err := f.pool.QueryRow(f.ctx, `SELECT coalesce(bool_or(r.sent_lsn >= $2::pg_lsn), false) FROM pg_replication_slots s
						JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1`, f.slot(), end).Scan(&ok)
					return err == nil && ok
				})
			}
			close(snk.gate)
			select {
			case <-snk.blocked:
			case <-time.After(30 * time.Second):
				t.Fatal("the hanging aggregate's event was never published")
			}
			// Most of what committed after it is published while it hangs:
			// with one batch in flight at a time nothing beyond its own
			// batch (at most 19) would be.
			want := len(after) / 2
			await.Eventually(t, 25*time.Second, func() error {
				n, waiting := snk.count(after)
				if !waiting {
					t.Fatalf("the hanging publish returned before %d of the %d later events were published (%d were)", want, len(after), n)
				}
				if n < want {
					return fmt.Errorf("while one aggregate's publish hangs, %d of the %d events committed after it were published, want %d", n, len(after), want)
				}
				t.Logf("%d of the %d events committed after the hanging one were published while it hung", n, len(after))
				return nil
			})
			close(snk.release)
			f.eventually("every event is published", func() bool {
				n, _ := snk.count(all)
				return n == len(all)
			})
			snk.mu.Lock()
			defer snk.mu.Unlock()
			pos := map[string]int{}
			for i, m := range snk.acked {
				pos[m.ID] = i
			}
			for _, evs := range order {
				for i := 1; i < len(evs); i++ {
					if pos[evs[i-1].ID] > pos[evs[i].ID] {
						t.Fatalf("aggregate %s: event %d published before event %d", evs[i].AggregateID, i, i-1)
					}
				}
			}
		})
	}
}
