package ops

import (
	"context"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// Insight is what the overview shows beyond the Status: the backlog by
// aggregate type and event type, the registered relays, and the samples
// of the last hour (for the chart).
type Insight struct {
	Backlog []outboxdriver.KindBacklog
	Relays  []outboxdriver.RelayStatus
	Samples []outboxdriver.Sample
}

// insightGroups is how many backlog groups Insight lists.
const insightGroups = 20

// Insight returns the overview's details, with the samples of the last
// window (none for 0).
func (o *Ops) Insight(ctx context.Context, a Actor, window time.Duration) (Insight, error) {
	var in Insight
	if err := o.allow(ctx, a, "view the overview", Read); err != nil {
		return in, err
	}
	var err error
	if in.Backlog, err = o.st.Backlog(ctx, o.t, insightGroups); err != nil {
		return in, err
	}
	if in.Relays, err = o.st.Relays(ctx, o.t); err != nil {
		return in, err
	}
	if window > 0 {
		in.Samples, err = o.st.Samples(ctx, o.t, time.Now().Add(-window))
	}
	return in, err
}

// SampleKeep is how long samples are kept.
const SampleKeep = 24 * time.Hour

// Sample records a sample of the table for the overview's chart (the
// console does, every SampleEvery), and deletes samples older than
// SampleKeep.
func (o *Ops) Sample(ctx context.Context) error {
	return o.st.RecordSample(ctx, o.t, SampleKeep)
}
