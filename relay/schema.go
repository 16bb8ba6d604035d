package relay

import (
	"context"
	"sync"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// SchemaMetrics is implemented by a Metrics that also reports what the
// relay found about its table's schema (package outboxprom does:
// outbox_schema_incompatible and the two versions). The relay calls it
// after every check.
type SchemaMetrics interface {
	SchemaChecked(c outboxdriver.SchemaCheck)
}

// schemaState is what the last schema check found, for the batch loop,
// Ready and the logs: a relay whose table needs a newer relay stops
// claiming, says so once, and starts again once the table works with it.
type schemaState struct {
	mu       sync.Mutex
	last     outboxdriver.SchemaCheck
	checked  bool
	blocked  bool
	newerLog bool // said once that the table is newer, but compatible
}

// isBlocked reports whether the last check found the table too new.
func (s *schemaState) isBlocked() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.blocked
}

// SchemaCheck returns what the relay last found about its table's schema
// and whether it checked at all (its Source implements
// outboxdriver.SchemaChecker and one upkeep reached the database). While
// the check is not Compatible the relay claims nothing and is not Ready.
func (r *Relay) SchemaCheck() (outboxdriver.SchemaCheck, bool) {
	r.schema.mu.Lock()
	defer r.schema.mu.Unlock()
	return r.schema.last, r.schema.checked
}

// checkSchema asks the source, when it can tell, whether this relay's
// code works with the table as it is now; it reports false, having given
// up the leases held, when it does not. An error leaves the state as it
// was.
func (r *Relay) checkSchema(ctx context.Context) (ok bool, err error) {
	sc, can := r.src.(outboxdriver.SchemaChecker)
	if !can {
		return true, nil
	}
	c, err := sc.CheckSchema(ctx)
	if err != nil {
		return !r.schema.isBlocked(), err
	}
	if m, ok := r.metrics.(SchemaMetrics); ok {
		m.SchemaChecked(c)
	}
	r.schema.mu.Lock()
	was := r.schema.blocked
	r.schema.last, r.schema.checked, r.schema.blocked = c, true, !c.Compatible()
	sayNewer := c.Compatible() && c.TableVersion > c.RelayVersion && !r.schema.newerLog
	if sayNewer {
		r.schema.newerLog = true
	}
	r.schema.mu.Unlock()
	switch {
	case !c.Compatible() && !was:
		r.log.Error("relay: the outbox table needs a newer relay: this relay stops claiming until it is replaced with a newer release (or the table is migrated back)",
			"table_schema_version", c.TableVersion, "relays_from", c.RelaysFrom, "relay_schema_version", c.RelayVersion)
	case c.Compatible() && was:
		r.log.Info("relay: the outbox table works with this relay again: claiming", "table_schema_version", c.TableVersion, "relay_schema_version", c.RelayVersion)
	case sayNewer:
		r.log.Info("relay: the outbox table's schema is newer than this relay's, and works with it: relaying on",
			"table_schema_version", c.TableVersion, "relays_from", c.RelaysFrom, "relay_schema_version", c.RelayVersion)
	}
	if c.Compatible() {
		return true, nil
	}
	r.giveUpLeases(ctx)
	return false, nil
}

// giveUpLeases releases every lease held, after the batch in flight, so
// that relays that work with the table take the partitions over.
func (r *Relay) giveUpLeases(ctx context.Context) {
	owned := r.leases.owns()
	r.leases.set(nil, time.Time{}, 0, true)
	r.metrics.PartitionsOwned(0)
	if len(owned) == 0 {
		return
	}
	r.leases.inFlight.Lock()
	err := r.src.Release(ctx, owned, false)
	r.leases.inFlight.Unlock()
	if err != nil && ctx.Err() == nil {
		r.db.Fail("lease release", err) // they expire by themselves
	}
}
