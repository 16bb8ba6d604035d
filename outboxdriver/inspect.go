package outboxdriver

import (
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

// AuditRecord is one row of the audit table: who did what, when, to which
// event, under which role and why.
type AuditRecord struct {
	// ID orders the rows: newer rows have larger ids.
	ID int64 `json:"id"`
	// At is when the row was written (database clock).
	At time.Time `json:"at"`
	// Actor is who acted; Action what was done (retry, discard, pause,
	// request, login, denied, ...); EventID the event it is about, if any;
	// Detail what the action changed, in words.
	Actor   string `json:"actor"`
	Action  string `json:"action"`
	EventID string `json:"event_id"`
	Detail  string `json:"detail"`
	// Role is the role the action was allowed (or refused) under; Reason
	// the reason given (may be empty).
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
	// routed column (Store.DeadLetterValues, FindRoutedDeadLetters) and
	// clears it; a Store ignores it.
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
	// Headers are the event's own headers.
	Headers map[string]string
	// TraceContext is the stored tracingspancontext, or "".
	TraceContext string
	// Payload is the payload as stored when it is JSON (nil for none);
	// PayloadRaw the payload when it is not.
	Payload    []byte
	PayloadRaw []byte
}
