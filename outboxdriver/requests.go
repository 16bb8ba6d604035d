package outboxdriver

import (
	"encoding/json"
	"errors"
	"time"
)

// Request kinds: what a request asks to do once approved.
const (
	RequestReplay = "replay"
	RequestRepair = "repair"
)

// Request states. A request starts pending; an approver other than the
// requester approves (then it is carried out: executing, then done or
// failed) or rejects it; pending and approved requests expire at their
// expiry; the requester or another operator can cancel one that has not
// finished.
const (
	StatePending   = "pending"
	StateApproved  = "approved"
	StateExecuting = "executing"
	StateDone      = "done"
	StateFailed    = "failed"
	StateCancelled = "cancelled"
	StateRejected  = "rejected"
	StateExpired   = "expired"
)

// ErrRequestState is wrapped when a request is not in a state that allows
// what was asked (approving one that expired, cancelling one that is
// done).
var ErrRequestState = errors.New("the request is not in a state that allows this")

// Request is one request for an action that needs a second person.
type Request struct {
	ID            string          `json:"id"`
	Kind          string          `json:"kind"`
	State         string          `json:"state"`
	Requester     string          `json:"requester"`
	RequesterRole string          `json:"requester_role"`
	Reason        string          `json:"reason"`
	Params        json.RawMessage `json:"params"`
	CreatedAt     time.Time       `json:"created_at"`
	ExpiresAt     time.Time       `json:"expires_at"`
	DecidedBy     string          `json:"decided_by,omitempty"`
	DecidedRole   string          `json:"decided_role,omitempty"`
	DecidedAt     *time.Time      `json:"decided_at,omitempty"`
	DecisionNote  string          `json:"decision_note,omitempty"`
	Executor      string          `json:"executor,omitempty"`
	Epoch         int64           `json:"epoch"`
	HeartbeatAt   *time.Time      `json:"heartbeat_at,omitempty"`
	StartedAt     *time.Time      `json:"started_at,omitempty"`
	FinishedAt    *time.Time      `json:"finished_at,omitempty"`
	// Total is how many events the execution found to replay (set when it
	// starts); Done how many it has re-enqueued; Cursor the original
	// position up to which it has.
	Total  *int64 `json:"total,omitempty"`
	Done   int64  `json:"done"`
	Cursor int64  `json:"cursor"`
	Error  string `json:"error,omitempty"`
}

// ReplayFilter selects published events kept in the table (retention
// keep): published at or after Since and before Until, and of the given
// aggregate type, aggregate id and event type when set. RoutedColumn and
// RoutedValues, when set, keep events whose column (aggregatetype, type,
// ...) holds one of the values: a destination filter resolved through the
// routing.
type ReplayFilter struct {
	Since, Until                     time.Time
	AggregateType, AggregateID, Type string
	RoutedColumn                     string
	RoutedValues                     []string
}

// ReplayEvent is one published event a replay would re-enqueue.
type ReplayEvent struct {
	ID            string    `json:"id"`
	Seq           int64     `json:"seq"`
	AggregateType string    `json:"aggregatetype"`
	AggregateID   string    `json:"aggregateid"`
	Type          string    `json:"type"`
	CreatedAt     time.Time `json:"created_at"`
	PublishedAt   time.Time `json:"published_at"`
}

// ReplayBatch is one step of a replay's execution.
type ReplayBatch struct {
	// Request, Executor and Epoch name the execution; a batch of an
	// executor that no longer holds the request at that epoch is refused
	// with ErrRequestState and changes nothing.
	Request, Executor string
	Epoch             int64
	Filter            ReplayFilter
	// After is the cursor: events after this original position.
	After int64
	// Limit bounds the events of the batch.
	Limit int
	// NewIDs gives each copy a new id (UUIDv7) and the header
	// outbox-replay-of with the original's; otherwise the copy keeps the
	// original's id (the kept original row is replaced by it).
	NewIDs bool
}
