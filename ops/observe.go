package ops

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// Insight is what the overview shows beyond the Status: the backlog by
// aggregate type and event type and by destination, the registered
// relays, and the samples of the last hour (for the chart).
type Insight struct {
	Backlog []outboxdriver.KindBacklog
	// Destinations is the backlog by destination as the relays route it
	// (Config.Route), largest first; nil when it was not counted, and
	// DestinationsNote then says why (else what it leaves out, if
	// anything).
	Destinations     []DestinationBacklog
	DestinationsNote string
	Relays           []outboxdriver.RelayStatus
	Samples          []outboxdriver.Sample
}

// DestinationBacklog is the unpublished events routed to one destination.
type DestinationBacklog struct {
	Destination string `json:"destination"`
	// Unroutable: events whose routed value the routing does not match
	// (the relay dead-letters them); Destination is empty.
	Unroutable bool `json:"unroutable,omitempty"`
	// Rest: the events of the routed values past the ones counted one by
	// one, whose destinations are not known; Destination is empty.
	Rest      bool          `json:"rest,omitempty"`
	Events    int64         `json:"events"`
	OldestAge time.Duration `json:"-"`
	// Estimated: Events is an estimate (from a sample of a large table).
	Estimated bool `json:"estimated"`
}

// insightGroups is how many backlog groups by kind Insight lists;
// destinationValues how many routed values it counts one by one for the
// backlog by destination.
const (
	insightGroups     = 20
	destinationValues = 1000
)

// Insight returns the overview's details, with the samples of the last
// window (none for 0).
//
// The backlog by destination follows the routing: routed by aggregate
// type or event type, it adds up the backlog by kind (estimated where
// that is); routed by another column, it counts the backlog by that
// column's values, which reads every unpublished event, so only while the
// backlog by kind is exact (not above OverviewExactUpTo events on
// PostgreSQL).
func (o *Ops) Insight(ctx context.Context, a Actor, window time.Duration) (Insight, error) {
	var in Insight
	if err := o.allow(ctx, a, "view the overview", Read); err != nil {
		return in, err
	}
	kinds, err := o.st.Backlog(ctx, o.t, destinationValues)
	if err != nil {
		return in, err
	}
	in.Backlog = kinds[:min(len(kinds), insightGroups)]
	if in.Destinations, in.DestinationsNote, err = o.destinations(ctx, kinds); err != nil {
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

// destinations routes the backlog (kinds: by kind, the largest first, at
// most destinationValues of them) to destinations.
func (o *Ops) destinations(ctx context.Context, kinds []outboxdriver.KindBacklog) ([]DestinationBacklog, string, error) {
	col := o.router.RouteBy()
	byDest := map[DestinationBacklog]*DestinationBacklog{} // keyed by destination, unroutable and rest only
	add := func(value string, rest bool, events int64, age time.Duration, estimated bool) {
		k := DestinationBacklog{Rest: rest}
		if !rest {
			if d, err := o.router.DestinationOf(value); err == nil {
				k.Destination = d
			} else {
				k.Unroutable = true
			}
		}
		g := byDest[k]
		if g == nil {
			g = &DestinationBacklog{Destination: k.Destination, Unroutable: k.Unroutable, Rest: k.Rest}
			byDest[k] = g
		}
		g.Events += events
		g.OldestAge = max(g.OldestAge, age)
		g.Estimated = g.Estimated || estimated
	}
	var note string
	switch col {
	case "aggregatetype", "type":
		for _, k := range kinds {
			v := k.AggregateType
			if col == "type" {
				v = k.Type
			}
			add(v, false, k.Backlog, k.OldestAge, k.Estimated)
		}
		if len(kinds) == destinationValues {
			note = fmt.Sprintf("counted over the %d largest kinds of events (aggregate type and event type) only", destinationValues)
		}
	default:
		for _, k := range kinds {
			if k.Estimated {
				return nil, fmt.Sprintf("not counted: the relays route by %s, and counting the backlog by its values would read every one of the events waiting (more than %d)", col, OverviewExactUpTo), nil
			}
		}
		groups, err := o.st.BacklogBy(ctx, o.t, col, destinationValues)
		if err != nil {
			return nil, "", err
		}
		for _, g := range groups {
			add(g.Value, g.Rest, g.Events, g.OldestAge, false)
		}
	}
	out := make([]DestinationBacklog, 0, len(byDest))
	for _, g := range byDest {
		out = append(out, *g)
	}
	slices.SortFunc(out, func(a, b DestinationBacklog) int {
		return cmp.Or(cmp.Compare(b.Events, a.Events), cmp.Compare(a.Destination, b.Destination))
	})
	return out, note, nil
}

// SampleKeep is how long samples are kept.
const SampleKeep = 24 * time.Hour

// Sample records a sample of the table for the overview's chart (the
// console does, every SampleEvery), and deletes samples older than
// SampleKeep.
func (o *Ops) Sample(ctx context.Context) error {
	return o.st.RecordSample(ctx, o.t, SampleKeep)
}
