package cdc

import (
	"hash/fnv"
	"time"

	"github.com/outboxkit/outbox/internal/mysqlbinlog"
	"github.com/outboxkit/outbox/outboxdriver"
)

// aggKey identifies an aggregate.
type aggKey struct{ typ, id string }

// event is one event read from the log (or, in a drain, from the table).
type event struct {
	rec outboxdriver.Record
	// The columns a dead letter needs, as read.
	payload, raw, headers []byte
	tx                    *txn
	state                 eventState
	due                   time.Time // a retry's or a delayed event's time
}

type eventState int

const (
	statePending eventState = iota
	stateClaimed
	stateDone
)

func (e *event) key() aggKey { return aggKey{e.rec.AggregateType, e.rec.AggregateID} }

// txn is a committed transaction's events, and the log position after it.
type txn struct {
	events []*event
	left   int // events not done
	end    mysqlbinlog.Position
	gtid   string
}

// queue holds the committed transactions whose events are not all done,
// in commit order. Not safe for concurrent use: the Source's mutex guards
// it.
type queue struct {
	txns    []*txn
	pending int // events not done
	// mark is the position after the last transaction whose every event
	// is done, and gtid the GTID position there.
	mark mysqlbinlog.Position
	gtid string
	// held are the aggregates held behind a dead letter (its event id).
	held map[aggKey]string
	skip map[string]bool // aggregate types the claims leave out
}

// push appends a committed transaction.
func (q *queue) push(t *txn) {
	t.left = len(t.events)
	for _, e := range t.events {
		e.tx = t
	}
	q.pending += len(t.events)
	q.txns = append(q.txns, t)
}

// advance moves the mark past the transactions at the front whose events
// are all done and reports whether it moved.
func (q *queue) advance() bool {
	moved := false
	for len(q.txns) > 0 && q.txns[0].left == 0 {
		t := q.txns[0]
		q.txns[0] = nil
		q.txns = q.txns[1:]
		q.mark = t.end
		if t.gtid != "" {
			q.gtid = t.gtid
		}
		moved = true
	}
	return moved
}

// markIf is where the mark would be if the events of done were done too.
func (q *queue) markIf(done []*event) (mysqlbinlog.Position, string) {
	extra := map[*txn]int{}
	for _, e := range done {
		if e.state != stateDone {
			extra[e.tx]++
		}
	}
	mark, gtid := q.mark, q.gtid
	for _, t := range q.txns {
		if t.left-extra[t] > 0 {
			break
		}
		mark = t.end
		if t.gtid != "" {
			gtid = t.gtid
		}
	}
	return mark, gtid
}

// numPartitions is how many partitions a binlog source presents the log
// as (the most lanes a relay may have). One lease covers them all, with
// one epoch; each aggregate hashes into one of them, so that the relay's
// lanes keep batches of different aggregates in flight at once.
const numPartitions = 64

// partitionOf is the partition of aggregate k.
func partitionOf(k aggKey) int {
	h := fnv.New32a()
	h.Write([]byte(k.typ))
	h.Write([]byte{0})
	h.Write([]byte(k.id))
	return int(h.Sum32() % numPartitions)
}

// claim hands out up to limit pending, due events of the partitions in
// parts (nil: all) in commit order, none of an aggregate that has an
// earlier event not done, is held behind a dead letter or is of a type
// left out.
func (q *queue) claim(limit int, now time.Time, parts *[numPartitions]bool) []*event {
	var out []*event
	blocked := map[aggKey]bool{}
	for _, t := range q.txns {
		for _, e := range t.events {
			if e.state == stateDone {
				continue
			}
			k := e.key()
			ok := e.state == statePending && !blocked[k] && !e.due.After(now) && !q.skip[k.typ] &&
				(parts == nil || parts[e.rec.Partition])
			if _, held := q.held[k]; held {
				ok = false
			}
			blocked[k] = true
			if ok {
				e.state = stateClaimed
				out = append(out, e)
				if len(out) == limit {
					return out
				}
			}
		}
	}
	return out
}

// done marks e done.
func (q *queue) done(e *event) {
	if e.state == stateDone {
		return
	}
	e.state = stateDone
	e.tx.left--
	q.pending--
}

// release makes a claimed e claimable again.
func (q *queue) release(e *event) {
	if e.state == stateClaimed {
		e.state = statePending
	}
}

// nextDue is the earliest time a pending event that waits becomes due.
func (q *queue) nextDue() time.Time {
	var at time.Time
	for _, t := range q.txns {
		for _, e := range t.events {
			if e.state == statePending && !e.due.IsZero() && (at.IsZero() || e.due.Before(at)) {
				at = e.due
			}
		}
	}
	return at
}
