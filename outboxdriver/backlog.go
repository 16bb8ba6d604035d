package outboxdriver

import (
	"context"
	"time"
)

// BacklogGroup is the unpublished events that share one value of a
// column (the column the relay routes by), or, with Rest set, every
// group past the limit BacklogBy was given.
type BacklogGroup struct {
	Value string
	Rest  bool
	// Events counts the group's unpublished events.
	Events int64
	// OldestAge is the age of the group's oldest unpublished event.
	OldestAge time.Duration
}

// BacklogGrouper is implemented by a Store that can split the backlog by
// the value of a column, so that the backlog and the age of its oldest
// event can be reported per destination (package outboxprom).
type BacklogGrouper interface {
	// BacklogBy groups t's unpublished events by column (one of
	// route.ColumnNames: aggregatetype, aggregateid, type, id,
	// created_at, the latter as RFC 3339 with microseconds in UTC). It
	// returns at most limit groups, the largest first, and one more with
	// Rest set holding the others when there are more.
	BacklogBy(ctx context.Context, t Table, column string, limit int) ([]BacklogGroup, error)
}
