package cdc

import (
	"encoding/json"
	"slices"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/outboxdriver"
)

// event is one event a CDC source decoded (from an INSERT into the outbox
// table, a logical decoding message, or a row read while draining the
// table), with its place in the queue.
type event struct {
	ID            string
	AggregateType string
	AggregateID   string
	Type          string
	// Payload is the JSON payload, RawPayload a payload that is not JSON;
	// at most one is set.
	Payload    []byte
	RawPayload []byte
	// HeadersJSON is the headers as the writer stored them (a JSON object).
	HeadersJSON  json.RawMessage
	TraceContext string
	Seq          int64
	CreatedAt    time.Time
	// row says the event is a row of the outbox table (recorded there once
	// published); otherwise it was a message and lives only in the WAL.
	row bool
	// bad says why the event cannot be published as its writer meant it
	// (a message that does not follow the format); the relay dead-letters
	// it.
	bad error
	// orphan says the event names no valid aggregate (a message that does
	// not follow the format): it orders and holds nothing but itself.
	orphan bool
	// walOnly says the event is not a row of the table once decoded (a
	// message; a row under ModeInsertDelete): the table's backlog does
	// not count it, the queue's wal does (queue.push).
	walOnly bool

	// deliverAt is the row's deliver_at when it was still ahead as the
	// event was decoded: the event is parked until then, its aggregate's
	// later events behind it (queue.parkable, Source.unpark).
	deliverAt time.Time

	part int // the partition of its aggregate (partitionOf)
	// pxid is the transaction that inserted a row released from the
	// parked table (txn.front), for the mark.
	pxid uint32

	tx        *txn
	state     evState
	attempts  int
	notBefore time.Time // of a retry
	rec       outboxdriver.Record
}

type evState uint8

const (
	evReady   evState = iota
	evClaimed         // in a batch
	evRetry           // waiting for notBefore
	evDone            // published or dead-lettered (or known to be)
)

// xid is the transaction that inserted e's row.
func (e *event) xid() int64 {
	if e.tx.front {
		return int64(e.pxid)
	}
	return int64(e.tx.xid)
}

// key is the aggregate of e.
func (e *event) key() aggKey {
	if e.orphan {
		return aggKey{"\x00", e.ID}
	}
	return aggKey{e.AggregateType, e.AggregateID}
}

type aggKey struct{ typ, id string }

// record returns the event as the relay sees it.
func (e *event) record() outboxdriver.Record {
	r := e.rec
	r.Attempts = e.attempts
	return r
}

// seal fills the record the relay is handed.
func (e *event) seal() {
	e.part = partitionOf(e.key())
	r := outboxdriver.Record{
		ID: e.ID, Seq: e.Seq, AggregateType: e.AggregateType, AggregateID: e.AggregateID, Type: e.Type,
		TraceContext: e.TraceContext, CreatedAt: e.CreatedAt, Partition: e.part,
	}
	switch {
	case e.Payload != nil:
		r.Payload = e.Payload
	case e.RawPayload != nil:
		r.Payload = e.RawPayload
	}
	r.Headers, r.HeadersErr = driverkit.DecodeHeaders([]byte(e.HeadersJSON))
	if e.bad != nil {
		// Routing refuses a record whose headers could not be read, and
		// the relay dead-letters it: the same path serves a message that
		// is not an outbox event.
		r.HeadersErr = e.bad
		if e.orphan {
			r.AggregateID = e.ID // routed as far as the reason
		}
	}
	e.rec = r
}

// txn is one committed transaction's events, in the order they were
// written, or one part of them: a large transaction is handed to the queue
// in parts of at most partSize events (in order, one after the other), so
// that it never is in memory whole. end is the end of its commit record,
// the LSN the slot may confirm once every event of it and of every earlier
// transaction is done; only the last part has it, and rows read while
// draining the table have none (0). lsn is the commit record's LSN, in
// every part (0 for drained rows).
type txn struct {
	end, lsn pglogrepl.LSN
	// xid is the transaction's id (0 for drained rows, which are visible).
	xid uint32
	// drain says the events are rows read from the table (stream.drain).
	drain bool
	// front says the events were released from the parked table
	// (Source.unpark): they go before the stream's events of their
	// aggregates, and the slot's position does not wait for them.
	front bool
	// commit is the transaction's commit time (zero for drained rows).
	commit time.Time
	events []*event
	left   int // events not done
	// delayed says an event of it has a deliver_at still ahead as it was
	// read (event.deliverAt).
	delayed bool
}

// queue holds the decoded events until they are done, in commit order,
// and decides what may be claimed: an event is claimable when no earlier
// event of its aggregate is still in flight, waiting for a retry or held
// behind a dead letter. It is not safe for concurrent use; the source
// guards it.
type queue struct {
	txns []*txn
	// held maps an aggregate held behind a dead letter (poison policy
	// hold) to that dead letter's id: its later events wait until the
	// dead letter comes back (retried by an operator: the same id is
	// inserted again) and is published, or is discarded.
	held map[aggKey]string
	// skip holds the aggregate types claims leave out (paused).
	skip map[string]bool
	// pending counts events of txns not done; drainLeft those of them
	// that were read from the table; wal those of them that are not rows
	// of the table (event.walOnly): the backlog the table cannot count.
	pending, drainLeft, wal int
	// rowsGone says the stream's rows were deleted in their own
	// transaction (ModeInsertDelete): they count in wal.
	rowsGone bool
	// front holds the events released from the parked table, claimed
	// before any of txns; frontLeft counts those not done, unparking those
	// of each aggregate.
	front     []*txn
	frontLeft int
	unparking map[aggKey]int
	// parked counts, per aggregate, the events in the parked table, as
	// far as known: never fewer than there are (Source.unpark). While
	// it is not 0, or the aggregate is held, the stream's events of the
	// aggregate are parked behind them (parkable) instead of claimed.
	parked map[aggKey]int
	// parks counts the parking writes that committed (Source.unpark).
	parks int
	// parkedUntil maps an aggregate whose first parked event is delayed
	// to when that one is due: unpark does not look for the aggregate's
	// events before (an aggregate not in it is looked for at once).
	parkedUntil map[aggKey]time.Time
	// mark is the end of the newest transaction that is done together
	// with every transaction before it: the LSN the slot may confirm.
	mark pglogrepl.LSN
	// delayedTxns counts the txns with delayed set, so that a claim
	// without any looks at no event (delayedAfter).
	delayedTxns int
}

func newQueue() queue {
	return queue{held: map[aggKey]string{}, parked: map[aggKey]int{}, unparking: map[aggKey]int{}, parkedUntil: map[aggKey]time.Time{}}
}

// push appends a committed transaction.
func (q *queue) push(t *txn) {
	t.left = len(t.events)
	for _, e := range t.events {
		e.tx = t
		e.seal()
		t.delayed = t.delayed || !e.deliverAt.IsZero()
		if e.walOnly = !t.drain && (!e.row || q.rowsGone); e.walOnly {
			q.wal++
		}
	}
	if t.delayed {
		q.delayedTxns++
	}
	q.pending += t.left
	if t.drain {
		q.drainLeft += t.left
	}
	q.txns = append(q.txns, t)
	q.advance()
}

// pushFront appends events released from the parked table.
func (q *queue) pushFront(t *txn) {
	t.front = true
	t.left = len(t.events)
	for _, e := range t.events {
		e.tx = t
		e.seal()
		q.unparking[e.key()]++
	}
	q.frontLeft += t.left
	q.front = append(q.front, t)
}

// parking reports whether the stream's events of aggregate k go to the
// parked table: k has parked events, which go first.
func (q *queue) parking(k aggKey) bool { return q.parked[k] > 0 || q.unparking[k] > 0 }

// parkable returns, marked claimed and in commit order, the stream's
// events that go to the parked table: those of an aggregate held behind a
// dead letter (but that dead letter itself, back from an operator's
// retry) or parking, and a delayed event not yet due at now with the
// events of its aggregate after it. hold adds aggregates about to be
// held, with their dead letters. It parks no event behind an earlier one
// of its aggregate that is in flight or waiting for a retry, and no
// delayed event behind an earlier one of its aggregate that is not done:
// that one goes first, and the delayed one waits in memory meanwhile.
func (q *queue) parkable(hold map[aggKey]string, now time.Time) []*event {
	if len(hold) == 0 && len(q.held) == 0 && len(q.parked) == 0 && len(q.unparking) == 0 && !q.delayedAfter(now) {
		// Nothing held or parking and nothing delayed: every event goes
		// to a claim. The common case, without a map operation per event.
		return nil
	}
	var out []*event
	blocked := map[aggKey]bool{}
	earlier := map[aggKey]bool{}  // an earlier event of the aggregate is to be claimed, or in flight
	delaying := map[aggKey]bool{} // parked from a delayed event on
	for _, t := range q.txns {
		if t.left == 0 {
			continue
		}
		for _, e := range t.events {
			if e.state == evDone || e.orphan {
				continue
			}
			k := e.key()
			h, held := q.held[k]
			if id, ok := hold[k]; ok {
				h, held = id, true
			}
			if !held && !q.parking(k) && !earlier[k] && e.deliverAt.After(now) {
				delaying[k] = true
			}
			switch {
			case blocked[k]:
			case held && e.ID == h:
			case !held && !q.parking(k) && !delaying[k]:
				earlier[k] = true
			case e.state == evReady:
				e.state = evClaimed
				out = append(out, e)
			default:
				blocked[k] = true
			}
		}
	}
	return out
}

// delayedAfter reports whether an event of the stream not done yet is
// delayed past now. It looks only at the transactions that hold a delayed
// event: a claim of a backlog without any walks no event.
func (q *queue) delayedAfter(now time.Time) bool {
	if q.delayedTxns == 0 {
		return false
	}
	for _, t := range q.txns {
		if t.left == 0 || !t.delayed {
			continue
		}
		for _, e := range t.events {
			if e.state != evDone && !e.orphan && e.deliverAt.After(now) {
				return true
			}
		}
	}
	return false
}

// nextDue returns when the earliest delayed parked event that is not due
// at now will be (zero: none). One due already is not counted: its
// aggregate may be held or its events being released, and a waiter woken
// for it at once would spin.
func (q *queue) nextDue(now time.Time) time.Time {
	var at time.Time
	for _, t := range q.parkedUntil {
		if t.After(now) && (at.IsZero() || t.Before(at)) {
			at = t
		}
	}
	return at
}

// claim takes up to limit claimable events of the partitions in parts
// (nil: all): first those released from the parked table, then the
// stream's, in commit order. An aggregate lives in one partition, so what
// it leaves out never orders what it takes.
func (q *queue) claim(limit int, now time.Time, parts *[numPartitions]bool) []*event {
	var out []*event
	blocked := map[aggKey]bool{}
	for _, t := range q.front {
		if t.left == 0 {
			continue
		}
		for _, e := range t.events {
			if e.state == evDone || (parts != nil && !parts[e.part]) {
				continue
			}
			k := e.key()
			ready := e.state == evReady || (e.state == evRetry && !now.Before(e.notBefore))
			if _, held := q.held[k]; held {
				continue // held again: its dead letter, when retried, goes first
			}
			if blocked[k] || !ready || q.skip[e.AggregateType] {
				blocked[k] = true
				continue
			}
			e.state = evClaimed
			out = append(out, e)
			if len(out) == limit {
				return out
			}
		}
	}
	for _, t := range q.txns {
		if t.left == 0 {
			continue
		}
		for _, e := range t.events {
			if e.state == evDone || (parts != nil && !parts[e.part]) {
				continue
			}
			k := e.key()
			ready := e.state == evReady || (e.state == evRetry && !now.Before(e.notBefore))
			if h, ok := q.held[k]; ok {
				// Only the dead letter itself, back from the dead-letter
				// table, goes ahead of the events held behind it.
				if ready && e.ID == h && !blocked[k] {
					e.state = evClaimed
					out = append(out, e)
					blocked[k] = true
					if len(out) == limit {
						return out
					}
				}
				continue
			}
			if blocked[k] || q.parking(k) {
				continue // parking: parkable takes it
			}
			if e.deliverAt.After(now) {
				// Delayed: parkable takes it, with its aggregate's later
				// events, once the earlier ones are done.
				blocked[k] = true
				continue
			}
			if !ready || (q.skip[e.AggregateType] && !e.orphan) {
				blocked[k] = true
				continue
			}
			e.state = evClaimed
			out = append(out, e)
			if len(out) == limit {
				return out
			}
		}
	}
	return out
}

// done marks e published or dead-lettered.
func (q *queue) done(e *event) {
	if e.state == evDone {
		return
	}
	e.state = evDone
	e.tx.left--
	if e.tx.front {
		k := e.key()
		q.frontLeft--
		if q.unparking[k]--; q.unparking[k] <= 0 {
			delete(q.unparking, k)
		}
		if q.parked[k]--; q.parked[k] <= 0 {
			delete(q.parked, k)
			delete(q.parkedUntil, k)
		}
		return
	}
	q.pending--
	if e.tx.drain {
		q.drainLeft--
	}
	if e.walOnly {
		q.wal--
	}
}

// oldestWAL returns the commit time of the oldest transaction with an
// event counted in wal that is not done (zero: none).
func (q *queue) oldestWAL() time.Time {
	if q.wal == 0 {
		return time.Time{}
	}
	for _, t := range q.txns {
		if t.left == 0 {
			continue
		}
		for _, e := range t.events {
			if e.walOnly && e.state != evDone {
				return t.commit
			}
		}
	}
	return time.Time{}
}

// release makes e claimable again, untouched.
func (q *queue) release(e *event) {
	if e.state == evClaimed {
		e.state = evReady
	}
}

// retry makes e claimable again at at, one attempt more.
func (q *queue) retry(e *event, at time.Time) {
	if e.state == evDone {
		return
	}
	e.attempts++
	e.state, e.notBefore = evRetry, at
}

// advance drops the transactions done at the front and moves mark past
// them. It reports whether mark moved.
func (q *queue) advance() bool {
	moved := false
	i := 0
	for ; i < len(q.txns) && q.txns[i].left == 0; i++ {
		if end := q.txns[i].end; end > q.mark {
			q.mark, moved = end, true
		}
		if q.txns[i].delayed {
			q.delayedTxns--
		}
	}
	if i > 0 {
		clear(q.txns[:i])
		q.txns = q.txns[i:]
	}
	q.front = slices.DeleteFunc(q.front, func(t *txn) bool { return t.left == 0 })
	return moved
}

// markIf returns the mark the queue would reach once the events of done
// are done, without changing anything.
func (q *queue) markIf(done []*event) pglogrepl.LSN {
	left := map[*txn]int{}
	for _, e := range done {
		if e.state != evDone {
			left[e.tx]++
		}
	}
	mark := q.mark
	for _, t := range q.txns {
		if t.left-left[t] > 0 {
			break
		}
		mark = max(mark, t.end)
	}
	return mark
}

// nextRetry returns when the earliest waiting retry is due (zero: none).
func (q *queue) nextRetry() time.Time {
	var at time.Time
	for _, t := range slices.Concat(q.front, q.txns) {
		for _, e := range t.events {
			if e.state == evRetry && (at.IsZero() || e.notBefore.Before(at)) {
				at = e.notBefore
			}
		}
	}
	return at
}

// reset forgets every event: the stream they came from ended, and the
// next one replays them from the slot's confirmed LSN (and releases the
// parked ones again). What is held and parked stays: it is the database's.
// It returns how many of them were done (published or dead-lettered) past
// the confirmed LSN: the replay delivers those again.
func (q *queue) reset() (doneAhead int) {
	for _, t := range q.txns {
		doneAhead += len(t.events) - t.left
	}
	clear(q.txns)
	clear(q.front)
	q.txns, q.pending, q.drainLeft, q.wal, q.mark, q.delayedTxns = nil, 0, 0, 0, 0, 0
	q.front, q.frontLeft, q.unparking = nil, 0, map[aggKey]int{}
	return doneAhead
}
