package outboxdriver

import (
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
