package outboxdriver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ErrNotFound is wrapped by a Store's lookup of one thing (a dead letter)
// that does not exist.
var ErrNotFound = errors.New("not found")

// Acting is who performs an action and why, as the audit table records
// it: the name, the role the action was allowed under, and the reason
// given (may be empty).
type Acting struct {
	Name   string
	Role   string
	Reason string
}

// AuditRecord is one row of the audit table in full: an AuditEntry with
// its id (newer rows have larger ids), the actor's role and the reason
// given.
type AuditRecord struct {
	ID int64 `json:"id"`
	AuditEntry
	Role   string `json:"role"`
	Reason string `json:"reason,omitempty"`
	// RequestID is the request (replay, repair) the row is about, if any;
	// Before and After what the action changed, as JSON, if recorded.
	RequestID string          `json:"request_id,omitempty"`
	Before    json.RawMessage `json:"before,omitempty"`
	After     json.RawMessage `json:"after,omitempty"`
}

// AuditQuery selects audit rows, newest first. Empty fields match
// everything.
type AuditQuery struct {
	// Actor and Action match exactly; EventID is an event id, RequestID a
	// request's id.
	Actor, Action, EventID, RequestID string
	// Since and Until bound the time of the row: Since <= at < Until.
	Since, Until time.Time
	// Before, when positive, lists only rows with a smaller id: the ID of
	// the last row of a page fetches the next one.
	Before int64
	// Limit is the most rows returned; it must be positive.
	Limit int
}

// DeadLetterQuery selects dead letters, oldest first (by the time they
// were dead-lettered, then by position). Empty fields match everything.
type DeadLetterQuery struct {
	// AggregateType, AggregateID and Type match exactly.
	AggregateType, AggregateID, Type string
	// ErrorContains matches last errors that contain it, ignoring case.
	ErrorContains string
	// Destination matches the dead letters the relays' routing sends to
	// this destination. The dead-letter table stores no destination:
	// package ops resolves it through the routing into values of the
	// routed column (DeadLetterRouter) and clears it; a Store ignores it.
	Destination string
	// Since and Until bound the time of dead-lettering: Since <= t < Until.
	Since, Until time.Time
	// After, when set, lists only dead letters after it: the Next of a
	// page fetches the next one.
	After *DeadLetterCursor
	// Limit is the most dead letters returned; it must be positive.
	Limit int
}

// DeadLetterCursor is a place in the order of dead letters.
type DeadLetterCursor struct {
	At  time.Time
	Seq int64
}

// String is the cursor's text form, which ParseDeadLetterCursor reads.
func (c DeadLetterCursor) String() string {
	return strconv.FormatInt(c.At.UnixMicro(), 10) + "." + strconv.FormatInt(c.Seq, 10)
}

// ParseDeadLetterCursor reads the text form of a cursor.
func ParseDeadLetterCursor(s string) (DeadLetterCursor, error) {
	at, seq, ok := strings.Cut(s, ".")
	micros, err1 := strconv.ParseInt(at, 10, 64)
	n, err2 := strconv.ParseInt(seq, 10, 64)
	if !ok || err1 != nil || err2 != nil || n < 0 {
		return DeadLetterCursor{}, fmt.Errorf("cursor %q: want the next value of a previous page", s)
	}
	return DeadLetterCursor{At: time.UnixMicro(micros).UTC(), Seq: n}, nil
}

// DeadLetterPage is one page of dead letters.
type DeadLetterPage struct {
	DeadLetters []DeadLetter
	// Next is where the next page starts, nil when this one is the last.
	Next *DeadLetterCursor
}

// DeadLetterDetail is one dead letter with everything stored about it.
type DeadLetterDetail struct {
	DeadLetter
	// Seq is its position in the outbox; CreatedAt when it was written.
	Seq       int64
	CreatedAt time.Time
	// Headers are the event's own headers (as DecodeHeaders reads them).
	Headers map[string]string
	// TraceContext is the stored tracingspancontext, or "".
	TraceContext string
	// Payload is the payload as stored when it is JSON (nil for none);
	// PayloadRaw the payload when it is not.
	Payload    []byte
	PayloadRaw []byte
}

// Inspector is a Store that answers the operations console's queries over
// dead letters.
type Inspector interface {
	// FindDeadLetters lists the dead letters of t that q selects.
	FindDeadLetters(ctx context.Context, t Table, q DeadLetterQuery) (DeadLetterPage, error)
	// DeadLetter returns one dead letter of t; it wraps ErrNotFound when
	// there is none with that id.
	DeadLetter(ctx context.Context, t Table, id string) (DeadLetterDetail, error)
}

// DeadLetterRouter is an Inspector that can select dead letters by the
// values of the column the routing reads (aggregatetype, aggregateid, type
// or id), which is how a destination filter is answered.
type DeadLetterRouter interface {
	// DeadLetterValues lists up to limit distinct values of column among
	// the dead letters of t that q selects (q's After and Limit aside).
	DeadLetterValues(ctx context.Context, t Table, q DeadLetterQuery, column string, limit int) ([]string, error)
	// FindRoutedDeadLetters is FindDeadLetters keeping only dead letters
	// whose column holds one of values (none: no dead letter).
	FindRoutedDeadLetters(ctx context.Context, t Table, q DeadLetterQuery, column string, values []string) (DeadLetterPage, error)
}

// Auditor is a Store that keeps the full audit trail: rows with the
// actor's role and reason, rows for things that are not dead-letter
// actions (a login, a refused request), and queries over them.
type Auditor interface {
	// AppendAudit adds r to the audit table of t; its ID and At are set by
	// the database.
	AppendAudit(ctx context.Context, t Table, r AuditRecord) error
	// FindAudit lists the audit rows of t that q selects, newest first.
	FindAudit(ctx context.Context, t Table, q AuditQuery) ([]AuditRecord, error)
}

// DeadLetterActions is a Store whose dead-letter actions record the
// actor's role and reason in the same transaction as the change.
type DeadLetterActions interface {
	// RetryDeadLettersAs is RetryDeadLetters, audited as by.
	RetryDeadLettersAs(ctx context.Context, t Table, ids []string, by Acting) ([]string, error)
	// DiscardDeadLettersAs is DiscardDeadLetters, audited as by.
	DiscardDeadLettersAs(ctx context.Context, t Table, ids []string, by Acting) ([]string, error)
}
