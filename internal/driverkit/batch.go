package driverkit

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// BatchState is what every driver's batch keeps whatever its dialect: the
// leases it was claimed under, its records, and whether it has ended. A
// driver's batch embeds it.
type BatchState struct {
	Leases []outboxdriver.Lease
	Recs   []outboxdriver.Record
	Done   bool
	driver string
}

// NewBatchState returns the state of a batch claimed by driver (which
// names it in errors) under leases; the batch counts as ended until the
// driver calls Open.
func NewBatchState(driver string, leases []outboxdriver.Lease) BatchState {
	return BatchState{driver: driver, Leases: leases, Done: true}
}

// Open marks the batch as holding a claim.
func (b *BatchState) Open() { b.Done = false }

// Records returns the claimed records.
func (b *BatchState) Records() []outboxdriver.Record { return b.Recs }

// StartFinish is the preamble of Batch.Finish: it reports whether there
// is a claim to record (false for an empty batch, which has nothing to
// record), fails for a batch that ended already, and marks the batch ended.
func (b *BatchState) StartFinish() (bool, error) {
	if b.Done {
		if len(b.Recs) == 0 {
			return false, nil
		}
		return false, fmt.Errorf("%s: batch already finished", b.driver)
	}
	b.Done = true
	return true, nil
}

// StartRelease is the preamble of Batch.Release: it reports whether there
// is a claim to give up, and marks the batch ended.
func (b *BatchState) StartRelease() bool {
	if b.Done {
		return false
	}
	b.Done = true
	return true
}

// Fenced lists the leases of the partitions the batch holds records of:
// those its Finish must still hold.
func (b *BatchState) Fenced() []outboxdriver.Lease {
	in := map[int]bool{}
	for _, r := range b.Recs {
		in[r.Partition] = true
	}
	out := make([]outboxdriver.Lease, 0, len(in))
	for _, l := range b.Leases {
		if in[l.Partition] {
			out = append(out, l)
			in[l.Partition] = false
		}
	}
	return out
}

// LeaseLost returns the error a batch's Finish returns when the relay no
// longer holds the leases it was claimed under.
func LeaseLost(relay string) error {
	return fmt.Errorf("%w: relay %s no longer holds the leases this batch was claimed under", outboxdriver.ErrLeaseLost, relay)
}

// Plan is an Outcome split into what each statement of a Finish needs.
type Plan struct {
	// Published are the ids the broker acknowledged.
	Published []string
	// Retries are the failures to try again.
	Retries []outboxdriver.Failure
	// DeadLetters are the failures to move to the dead-letter table.
	DeadLetters []outboxdriver.Failure
	// Hold lists the dead-lettered ids whose aggregates wait behind them;
	// Flow those whose aggregates flow on.
	Hold, Flow []string
}

// PlanOf splits the outcome for the statements that record it.
func PlanOf(o outboxdriver.Outcome) Plan {
	p := Plan{Published: o.Published}
	for _, f := range o.Failed {
		if !f.DeadLetter {
			p.Retries = append(p.Retries, f)
			continue
		}
		p.DeadLetters = append(p.DeadLetters, f)
		if f.Hold {
			p.Hold = append(p.Hold, f.ID)
		} else {
			p.Flow = append(p.Flow, f.ID)
		}
	}
	return p
}

// FailureIDs returns the ids of fs.
func FailureIDs(fs []outboxdriver.Failure) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.ID
	}
	return out
}

// MaxErrorText bounds the error text stored as last_error, in bytes.
const MaxErrorText = 2000

// ErrorText is the text stored as an event's last_error: valid UTF-8
// without NUL bytes, at most MaxErrorText bytes and an ellipsis.
func ErrorText(err error) string {
	if err == nil {
		return "unknown error"
	}
	s := strings.ToValidUTF8(strings.ReplaceAll(err.Error(), "\x00", ""), "?")
	if len(s) > MaxErrorText {
		s = strings.ToValidUTF8(s[:MaxErrorText], "") + "..."
	}
	return s
}

// Partitions returns the partitions of leases.
func Partitions(leases []outboxdriver.Lease) []int {
	out := make([]int, len(leases))
	for i, l := range leases {
		out[i] = l.Partition
	}
	return out
}

// SortLeases orders leases by partition.
func SortLeases(leases []outboxdriver.Lease) {
	slices.SortFunc(leases, func(a, b outboxdriver.Lease) int { return a.Partition - b.Partition })
}

// ScanLeases reads (partition, epoch) rows, ordered by partition, for the
// drivers on database/sql.
func ScanLeases(rows *sql.Rows) ([]outboxdriver.Lease, error) {
	defer rows.Close()
	var out []outboxdriver.Lease
	for rows.Next() {
		var l outboxdriver.Lease
		if err := rows.Scan(&l.Partition, &l.Epoch); err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	SortLeases(out)
	return out, nil
}

// NewRecords returns an empty slice to scan a claim of up to limit records
// into. It starts small and grows as rows come: a relay keeping up with
// light traffic claims a handful of events at a time, and a slice sized
// for the whole limit at every claim costs such a relay a measurable
// share of its CPU in allocation and GC.
func NewRecords(limit int) []outboxdriver.Record {
	return make([]outboxdriver.Record, 0, max(0, min(limit, 16)))
}

// SetPayload fills r.Payload from the payload column (JSON text; ok false
// for SQL NULL) or, when that is NULL, the payload_raw column.
func SetPayload(r *outboxdriver.Record, payload []byte, ok bool, raw []byte) {
	switch {
	case ok:
		r.Payload = payload
	case raw != nil:
		r.Payload = raw
	}
}

// DeadLetterClashDelay is how long an event waits before it is tried again
// when the dead letters hold another event with its id (KeepClashes).
const DeadLetterClashDelay = time.Minute

// DeadLetterClash is the error recorded for an event that was not
// dead-lettered because the dead letters hold another event with its id.
func DeadLetterClash(id string, cause error) error {
	return fmt.Errorf("not dead-lettered: the dead letters hold an event with this id (%s) already; it stays here and is tried again. Cause: %v", id, cause)
}

// KeepClashes moves the dead letters of p whose ids the dead-letter table
// holds already (clash) to the retries, with DeadLetterClash as their
// error, a retry after DeadLetterClashDelay and their aggregates held: a
// dead letter is kept under its event's id, and an event is never dropped
// for another's. It returns the ids it moved, for the relay's log.
func (p *Plan) KeepClashes(clash func(id string) bool) []string {
	var kept []string
	dls := p.DeadLetters[:0:0]
	for _, f := range p.DeadLetters {
		if !clash(f.ID) {
			dls = append(dls, f)
			continue
		}
		kept = append(kept, f.ID)
		p.Retries = append(p.Retries, outboxdriver.Failure{ID: f.ID, Err: DeadLetterClash(f.ID, f.Err), RetryAfter: DeadLetterClashDelay})
	}
	p.DeadLetters = dls
	p.DropHoldAndFlow(kept)
	return kept
}

// DropHoldAndFlow removes ids from p's Hold and Flow: none of their events
// goes to the dead letters, and holding or releasing an aggregate by one
// of these ids would act on the dead letter that holds the id already.
func (p *Plan) DropHoldAndFlow(ids []string) {
	if len(ids) == 0 {
		return
	}
	p.Hold = slices.DeleteFunc(p.Hold, func(id string) bool { return slices.Contains(ids, id) })
	p.Flow = slices.DeleteFunc(p.Flow, func(id string) bool { return slices.Contains(ids, id) })
}

// KeepClashesTx is KeepClashes for the drivers on database/sql: it asks
// the dead-letter table deadLetter (quoted), in tx, for each dead letter of
// p (few: poison events), and logs the events it keeps.
func KeepClashesTx(ctx context.Context, tx *sql.Tx, deadLetter string, p *Plan, log *slog.Logger, table outboxdriver.Table) error {
	held := map[string]bool{}
	for _, f := range p.DeadLetters {
		var one int
		switch err := tx.QueryRowContext(ctx, `SELECT 1 FROM `+deadLetter+` WHERE id = ?`, f.ID).Scan(&one); {
		case err == nil:
			held[f.ID] = true
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
	}
	if len(held) == 0 {
		return nil
	}
	LogClashes(log, table, p.KeepClashes(func(id string) bool { return held[id] }))
	return nil
}

// LogClashes logs the events KeepClashes kept in the table.
func LogClashes(log *slog.Logger, table outboxdriver.Table, ids []string) {
	if len(ids) > 0 && log != nil {
		log.Error("outbox: events not dead-lettered: the dead letters hold other events with their ids; they are kept and tried again in a minute",
			"table", table.String(), "ids", ids)
	}
}

// ClashingEvents picks, among the events of dead letters ids (byID, each
// with its seq), those that must not go to the dead-letter table, which
// holds one event an id: the ones whose id it holds (held: the seqs under
// each id) for an event with another seq, and all but the first (by seq)
// of the events with one id. An event read again after a crash and
// dead-lettered already under its own seq is none of them. It returns them,
// their ids once each (for LogClashes), and the ids all of whose events it
// picked (for DropHoldAndFlow). The log-tailing sources, which keep no row
// that would refuse a reused id, keep these events in memory.
func ClashingEvents[E comparable](ids []string, held map[string][]int64, byID map[string][]E, seq func(E) int64) (kept map[E]bool, keptIDs, whole []string) {
	kept = map[E]bool{}
	for _, id := range ids {
		evs := slices.SortedFunc(slices.Values(byID[id]), func(a, b E) int { return cmp.Compare(seq(a), seq(b)) })
		n := 0
		for i, e := range evs {
			seqs, ok := held[id]
			if (ok && !slices.Contains(seqs, seq(e))) || (i > 0 && seq(e) != seq(evs[0])) {
				kept[e] = true
				n++
			}
		}
		if n > 0 {
			keptIDs = append(keptIDs, id)
		}
		if n > 0 && n == len(evs) {
			whole = append(whole, id)
		}
	}
	return kept, keptIDs, whole
}
