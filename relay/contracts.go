package relay

import (
	"fmt"

	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/sink"
)

// Checker checks a claimed event against its payload contract before it
// is routed, and may set the record's eventVersion header.
// *contract.Registry implements it.
type Checker interface {
	CheckRecord(rec *outboxdriver.Record) error
}

// CauseContract starts the last error of an event dead-lettered because it
// broke its contract (outbox dlq list shows it; filter on it with
// DeadLetterQuery.ErrorContains).
const CauseContract = "contract"

// message checks rec against its contract, when the relay has contracts,
// and routes it. An error dead-letters the event at once.
func (r *Relay) message(rec *outboxdriver.Record) (sink.Message, error) {
	if r.cfg.Contracts != nil {
		if err := r.cfg.Contracts.CheckRecord(rec); err != nil {
			return sink.Message{}, fmt.Errorf("%s: event %s: %w", CauseContract, rec.ID, err)
		}
	}
	return r.cfg.Router.Message(rec)
}
