package cdc_test

import (
	"testing"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxpgx/cdc"
	"github.com/outboxkit/outbox/relay"
)

// Stats says whether the slot exists and is streamed, and how far the
// relay is behind the commits it received: the lag grows while an event
// is claimed and not done, and is 0 once it is. Status lists the slot.
func TestCDCStatsShowTheSlotAndTheLag(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	f.setup()
	src := f.source("r1", nil)
	leases := f.acquire(src, 10*time.Second)
	var err error
	claim := func(want int) outboxdriver.Batch {
		t.Helper()
		var b outboxdriver.Batch
		f.eventually("claimed", func() bool {
			b, err = src.Claim(f.ctx, leases, 100)
			if err != nil {
				t.Logf("claim: %v", err)
				return false
			}
			if len(b.Records()) < want {
				b.Release(f.ctx)
				return false
			}
			return true
		})
		return b
	}
	claim(0).Release(f.ctx) // starts the stream
	f.streaming()
	st, err := src.Stats(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Slot != f.slot() || !st.Exists || !st.Active || !st.Streaming || st.Owner != "r1" || st.Pending != 0 || st.Lag != 0 {
		t.Fatalf("idle stats = %+v", st)
	}
	status, err := f.drv.Status(f.ctx, f.tb)
	if err != nil {
		t.Fatal(err)
	}
	if len(status.Slots) != 1 || status.Slots[0].Slot != f.slot() || !status.Slots[0].Active || status.Slots[0].ConfirmedLSN == "" {
		t.Fatalf("status slots = %+v", status.Slots)
	}

	e := cdcEvent("a", 1)
	f.write(f.writer(modeMessage), e)
	b := claim(1)
	st1, err := src.Stats(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st1.Pending != 1 || st1.Lag <= 0 {
		t.Fatalf("stats with an event claimed = %+v", st1)
	}
	f.eventually("the lag grows while the event is not done", func() bool {
		st2, err := src.Stats(f.ctx)
		return err == nil && st2.Lag > st1.Lag+20*time.Millisecond
	})
	if err := b.Finish(f.ctx, outboxdriver.Outcome{Published: []string{e.ID}}); err != nil {
		t.Fatal(err)
	}
	st, err = src.Stats(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pending != 0 || st.Lag != 0 {
		t.Fatalf("stats once published = %+v", st)
	}
	src.Close()
	f.eventually("the slot is inactive once the source closed", func() bool {
		st, err := src.Stats(f.ctx)
		return err == nil && st.Exists && !st.Active && !st.Streaming
	})
}

// On a table whose _cdc has no backlog columns yet (before schema version
// 22) a relay of this version streams and publishes as before and records
// nothing; the status then says the slot's backlog is not counted. After
// the migration its streamer records it.
func TestCDCBacklogBeforeSchema22IsNotCounted(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	f.ddl(func() {
		if _, err := f.drv.MigrateDown(f.ctx, f.tb, 19); err != nil {
			t.Fatal(err)
		}
	})
	stop := f.streamingRelay()
	e := cdcEvent("a", 1)
	// A writer of the release of version 19 emits the message itself
	// (this build's writes through _cdc_emit, version 23).
	f.exec(`SELECT pg_logical_emit_message(true, $1, json_build_object('v', 1, 'id', $2::uuid,
    'aggregatetype', 'order', 'aggregateid', 'a', 'type', 'Placed')::text)`, outboxpgx.MessagePrefix(f.tb), e.ID)
	f.waitFor(e.ID)
	st, err := f.drv.Status(f.ctx, f.tb)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Slots) != 1 || st.Slots[0].Backlog != nil || !st.BacklogInWAL || st.Backlog != 0 {
		t.Fatalf("status before version 22: backlog %d, in WAL %v, slots %+v; want the slot not counted", st.Backlog, st.BacklogInWAL, st.Slots)
	}
	stop()
	f.ddl(func() {
		if _, err := f.drv.Migrate(f.ctx, f.tb, nil); err != nil {
			t.Fatal(err)
		}
	})
	f.relay(f.source("r2", &cdc.Config{Mode: cdc.ModeMessages}), relay.Config{})
	f.eventually("the streamer records its backlog after the migration", func() bool {
		st, err := f.drv.Status(f.ctx, f.tb)
		return err == nil && len(st.Slots) == 1 && st.Slots[0].Backlog != nil && st.Slots[0].Backlog.Mode == "message" &&
			!st.Slots[0].Backlog.Stale && st.BacklogInWAL && st.Backlog == 0
	})
}
