// Package backoff computes the delays between attempts that the relay and
// the inbox consumer wait: exponential, capped, with jitter; and tracks the
// outages of a dependency for every path that calls it (Outage), so that
// they log an outage once and back off alike.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Delay returns the delay after attempt n (1 for the first): base doubled
// n-1 times, capped at limit, then drawn at random from its upper half so
// that many callers failing together do not retry together. Attempts
// below 1 count as 1. base must be positive and at most limit.
func Delay(n int, base, limit time.Duration) time.Duration {
	d := base
	for i := 1; i < n && d < limit; i++ {
		d *= 2
	}
	d = min(d, limit)
	return d/2 + rand.N(d/2+1)
}
