package outboxpgx

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxkit/outbox/outboxdriver"
)

// Floors keep long transactions from slowing the claim down.
//
// A claim reads the pending index in seq order from its start. Rows the
// relay deleted stay in the index until VACUUM removes them, and VACUUM
// cannot remove them while any transaction older than the delete is open:
// one long transaction anywhere in the database (a report, pg_dump, a
// session left idle in a transaction) makes every claim step over every
// event relayed since it began, and delivery slows down by the minute.
//
// So each partition has a floor: a seq below which every row of the
// partition is published (or was never committed). Claims start at the
// lowest floor of their partitions and step over nothing older. A floor
// may only rise past rows whose fate is final, and a row's fate is open
// while the transaction that inserted it runs. Every such transaction
// holds RowExclusiveLock on the table from before it took its seq until it
// ends, so the source probes, in one round trip every floorTick:
//
//  1. the sequence's last value L, then
//  2. the transactions holding RowExclusiveLock on the table (W).
//
// Every seq up to L was handed out before W was read, so its transaction
// had ended by then or is in W. Once a later probe finds none of W left,
// every row up to L is committed (visible) or gone, and a statement after
// that probe may raise each floor to the partition's first unpublished
// row, or to L+1 if it has none. (The probe reads the pending index in seq
// order from the lowest floor, at most floorScan rows: a partition with
// none among them rises to the last row read, below which it has none.) Transactions that do not write to the
// table (the long ones this is about) never hold that lock, so they never
// hold a floor back; a long transaction that did insert an event does,
// as it must.
//
// Rows can also come back below a floor with their old seq. Dead letters
// retried by an operator do (they keep their place in their aggregate):
// the retry sends the notification rewindPayload, and a source that
// receives it drops its floors to zero; so does a source whose listener
// reconnected (notifications sent meanwhile are lost). A source that has
// not read the notification (it is not listening, or not yet) sees the
// retry's audit row: a claim starts from zero when the audit table's last
// id is not the one the floors were probed with, and the next probe drops
// them. Rows inserted by
// plain SQL with an explicit seq below a floor are found when the floors
// drop to zero by themselves, every floorReset. The floors also drop when
// the sequence's last value falls below them (the table was made again),
// and are off for good when the sequence caches values (CACHE > 1: a
// session then hands out a cached seq long after the probe, in a
// transaction the probe could not see).
type floors struct {
	tick     sync.Mutex // one probe at a time
	mu       sync.Mutex // guards what follows
	at       map[int]int64
	next     time.Time // the next probe
	resetAt  time.Time // the next reset to zero
	pending  *probe    // waiting for its writers to end
	final    int64     // every seq up to it is final; -1: none known
	gen      int       // counts drops to zero: a probe begun before one is void
	audit    int64     // the audit table's last id when the floors were probed; -1: not known
	disabled bool
	// ctx ends the running probe when the Source is closed, and none
	// starts after.
	ctx  context.Context
	stop context.CancelFunc
}

type probe struct {
	last    int64
	writers []string
}

const (
	// floorScan bounds the pending rows a probe reads to raise the
	// floors (one index, in seq order; the table has no index by
	// partition): a backlog costs each probe at most this many.
	floorScan  = 1024
	floorTick  = 100 * time.Millisecond
	floorReset = 5 * time.Minute
	// floorProbeTimeout bounds one probe.
	floorProbeTimeout = 10 * time.Second
	// rewindPayload is the notification that drops the floors.
	rewindPayload = "rewind"
)

// close ends the running probe, waits for it, and starts no other.
func (f *floors) close() {
	f.stop()
	f.tick.Lock()
	//lint:ignore SA2001 a running probe holds the lock: taking it waits for the probe's end
	f.tick.Unlock()
}

// rewind drops every floor to zero.
func (f *floors) rewind() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.zero()
}

// zero drops every floor to zero; f.mu is held, or f is not shared yet.
func (f *floors) zero() {
	f.at, f.final, f.pending = map[int]int64{}, -1, nil
	f.gen++
}

// below returns the lowest floor of leases' partitions, and the audit
// table's last id it holds for: a claim that finds another id starts from
// zero instead (a dead letter was retried since, below the floors).
func (f *floors) below(leases []outboxdriver.Lease) (floor, audit int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(leases) == 0 {
		return 0, f.audit
	}
	low := int64(-1)
	for _, l := range leases {
		v := f.at[l.Partition]
		if low < 0 || v < low {
			low = v
		}
	}
	return low, f.audit
}

// raise keeps the floors of partitions at the new values where higher;
// f.mu is held.
func (f *floors) raise(parts []int32, seqs []int64) {
	for i, p := range parts {
		if seqs[i] > f.at[int(p)] {
			f.at[int(p)] = seqs[i]
		}
	}
}

// observe takes a probe's result: a bound it makes final, or a candidate
// that waits for its writers to end; f.mu is held.
func (f *floors) observe(p probe) {
	for _, v := range f.at {
		if v > p.last+1 {
			// The sequence went back (the table was dropped and made
			// again, say): the floors speak of rows that are gone.
			f.zero()
			break
		}
	}
	if len(p.writers) == 0 {
		// Nothing that could hold a seq up to p.last is running.
		f.final, f.pending = max(f.final, p.last), nil
		return
	}
	if f.pending != nil && !slices.ContainsFunc(p.writers, func(w string) bool { return slices.Contains(f.pending.writers, w) }) {
		f.final = max(f.final, f.pending.last)
		f.pending = nil
	}
	if f.pending == nil {
		f.pending = &p
	}
}

// tickFloors starts a probe of the floors of leases' partitions when a
// tick is due and no probe runs, and returns without waiting for it: the
// claim starts from the floors known so far, and the probe raises them for
// the claims after it. On the claim's path the probe (five statements in
// one round trip, one of them a read of pg_locks) delayed the relay's
// wake-up on a new event every floorTick
// (docs/benchmarks.md#long-transactions). Probes run one at a time; Close
// waits for the one running.
func (s *source) tickFloors(leases []outboxdriver.Lease) {
	f := &s.floors
	if !f.tick.TryLock() {
		return // a probe runs
	}
	now := time.Now()
	f.mu.Lock()
	if f.disabled || f.ctx.Err() != nil || now.Before(f.next) {
		f.mu.Unlock()
		f.tick.Unlock()
		return
	}
	f.next = now.Add(floorTick)
	if now.After(f.resetAt) {
		if !f.resetAt.IsZero() {
			f.zero()
		}
		f.resetAt = now.Add(floorReset)
	}
	gen := f.gen
	final := f.final
	f.final = -1
	var parts []int32
	var at []int64
	if final >= 0 {
		for _, l := range leases {
			parts, at = append(parts, int32(l.Partition)), append(at, f.at[l.Partition])
		}
	}
	ctx := f.ctx
	f.mu.Unlock()
	go func() {
		defer f.tick.Unlock()
		// A probe that hangs (a frozen link) ends within floorProbeTimeout;
		// claims meanwhile start from the floors as they are.
		ctx, cancel := context.WithTimeout(ctx, floorProbeTimeout)
		defer cancel()
		s.probeFloors(ctx, gen, final, parts, at)
	}()
}

// probeFloors runs one probe (see floors) and takes its result: the floors
// of parts raised from at when final is known (>= 0), and the candidate
// bound of the next probe. gen is the floors' generation when the probe
// was begun. A failure leaves the floors as they are; an error of the
// server (a missing privilege, say) turns floors off for this source, as
// claims from zero are always correct.
func (s *source) probeFloors(ctx context.Context, gen int, final int64, parts []int32, at []int64) {
	f := &s.floors
	var pb pgx.Batch
	// One transaction, read committed: each statement still sees what
	// committed before it began. No sequential scans (see Claim).
	pb.Queue(`BEGIN`)
	pb.Queue(`SELECT set_config('enable_seqscan', 'off', true)`)
	var raised []int64
	if final >= 0 && len(parts) > 0 {
		// After the probe that made final known: its snapshot sees every
		// row up to final that will ever be seen.
		pb.Queue(s.q.floors, parts, at, final).QueryRow(func(row pgx.Row) error { return row.Scan(&raised) })
	}
	var p probe
	var last *int64
	var cache int64
	pb.Queue(s.q.lastSeq, s.names.Table).QueryRow(func(row pgx.Row) error { return row.Scan(&cache, &last) })
	pb.Queue(s.q.writers, s.names.Table).QueryRow(func(row pgx.Row) error { return row.Scan(&p.writers) })
	// Last, so that a retry the floors query missed is seen here.
	var audit int64
	pb.Queue(s.q.lastAudit).QueryRow(func(row pgx.Row) error { return row.Scan(&audit) })
	pb.Queue(`COMMIT`)
	if err := s.pool.SendBatch(ctx, &pb).Close(); err != nil {
		var pgErr *pgconn.PgError
		// Class 42: a missing privilege, function or table; anything else
		// (a connection cut, a timeout) is tried again at the next tick.
		if errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "42") {
			f.mu.Lock()
			f.disabled = true
			f.mu.Unlock()
			s.Log.Warn("outboxpgx: claims start from the table's first row (floors are off): a long transaction will slow them down", "err", err)
		}
		return
	}
	if cache != 1 {
		// Sessions then hand out cached values later, in transactions
		// that did not hold the lock when probed: nothing is final.
		f.mu.Lock()
		f.disabled, f.at = true, map[int]int64{}
		f.mu.Unlock()
		s.Log.Warn("outboxpgx: the seq column's sequence caches values; claims start from the table's first row (floors are off): a long transaction will slow them down", "cache", cache)
		return
	}
	if last != nil {
		p.last = *last
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gen != gen {
		return // dropped to zero meanwhile: what this probe saw may be above a row put back
	}
	retried := f.audit >= 0 && audit != f.audit
	f.audit = audit
	if retried {
		// Dead letters were retried (or discarded) since the last probe:
		// retried rows are back below the floors. The notification that
		// says so may not have reached this source (no listener, or not
		// read yet); the audit table always does.
		f.zero()
		return
	}
	if len(raised) == len(parts) && len(parts) > 0 {
		f.raise(parts, raised)
	}
	f.observe(p)
}
