package relay

import "github.com/outboxkit/outbox/outboxdriver"

// aggregate tracks one aggregate's events within a batch.
type aggregate struct {
	idx     []int // positions in the batch, in seq order
	next    int   // the next position to publish
	blocked bool  // a failure stops the rest of the aggregate in this batch
}

// at returns the batch position of the aggregate's next event.
func (a *aggregate) at() int { return a.idx[a.next] }

// advance moves on to the aggregate's next event: this one was published,
// or dead-lettered and let go.
func (a *aggregate) advance() { a.next++ }

// block stops the rest of the aggregate in this batch.
func (a *aggregate) block() { a.blocked = true }

// waves splits a batch's records into waves so that the events of one
// aggregate go out one wave after another: wave k holds the next event of
// every aggregate still flowing, and the caller starts it only once wave
// k-1 was answered, having advanced or blocked each of its aggregates.
// Aggregates keep the order of their first events in the batch.
type waves struct {
	order []*aggregate
	cur   []*aggregate
}

func newWaves(recs []outboxdriver.Record) waves {
	aggs := map[[2]string]*aggregate{}
	order := make([]*aggregate, 0, len(recs))
	for i := range recs {
		k := [2]string{recs[i].AggregateType, recs[i].AggregateID}
		a := aggs[k]
		if a == nil {
			a = &aggregate{}
			aggs[k] = a
			order = append(order, a)
		}
		a.idx = append(a.idx, i)
	}
	return waves{order: order, cur: make([]*aggregate, 0, len(order))}
}

// aggregates returns the number of aggregates in the batch.
func (w *waves) aggregates() int { return len(w.order) }

// next returns the aggregates of the next wave, each to publish its event
// at a.at(): every aggregate neither blocked nor done. It is empty once
// none is left. The slice is reused by the following call.
func (w *waves) next() []*aggregate {
	w.cur = w.cur[:0]
	for _, a := range w.order {
		if !a.blocked && a.next < len(a.idx) {
			w.cur = append(w.cur, a)
		}
	}
	return w.cur
}
