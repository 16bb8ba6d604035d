package outboxdriver

import (
	"context"
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

// CreatedAudit is the audit row of request r created by by, as every
// Requests implementation writes it with the request: a repair names the
// dead letter it is about.
func CreatedAudit(r Request, by Acting) AuditRecord {
	var event string
	if r.Kind == RequestRepair {
		var p struct {
			EventID string `json:"event_id"`
		}
		_ = json.Unmarshal(r.Params, &p) // Params were checked when the request was made
		event = p.EventID
	}
	return AuditRecord{
		AuditEntry: AuditEntry{Actor: by.Name, Action: "request", EventID: event,
			Detail: r.Kind + " requested, expires " + r.ExpiresAt.UTC().Format(time.RFC3339) + " (the request holds what)"},
		Role: by.Role, Reason: by.Reason, RequestID: r.ID,
	}
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

// Requests is a Store that keeps requests for actions that need a second
// person, replays published events and repairs dead letters. Each
// state change writes its audit row in the same transaction.
type Requests interface {
	// CreateRequest stores r (pending) and audits it as by.
	CreateRequest(ctx context.Context, t Table, r Request, by Acting) error
	// GetRequest returns one request; it wraps ErrNotFound.
	GetRequest(ctx context.Context, t Table, id string) (Request, error)
	// ListRequests lists requests, newest first; state "" lists all.
	ListRequests(ctx context.Context, t Table, state string, limit int) ([]Request, error)
	// DecideRequest moves a pending, unexpired request to approved or
	// rejected (to = StateApproved or StateRejected), or a pending,
	// approved or executing one to cancelled (to = StateCancelled); it
	// wraps ErrRequestState when the request is not in such a state and
	// ErrNotFound when there is none.
	DecideRequest(ctx context.Context, t Table, id, to string, by Acting) (Request, error)
	// ExpireRequests marks pending and approved requests past their expiry
	// expired, audited as by, and returns them.
	ExpireRequests(ctx context.Context, t Table, by Acting) ([]string, error)
	// ClaimRequest makes executor the executor of an approved, unexpired
	// request, or of an executing one whose executor has not renewed its
	// heartbeat for stale, with a new epoch; it wraps ErrRequestState when
	// it cannot.
	ClaimRequest(ctx context.Context, t Table, id, executor string, stale time.Duration) (Request, error)
	// SetRequestTotal records how many events an execution found, once.
	SetRequestTotal(ctx context.Context, t Table, id string, total int64) error
	// FinishRequest ends an execution held at epoch: done, or failed with
	// msg.
	FinishRequest(ctx context.Context, t Table, id, executor string, epoch int64, state, msg string) error

	// HasPublished reports whether t keeps any published row.
	HasPublished(ctx context.Context, t Table) (bool, error)
	// PreviewReplay counts the events f selects and returns the first
	// limit of them in their original order.
	PreviewReplay(ctx context.Context, t Table, f ReplayFilter, limit int) (int64, []ReplayEvent, error)
	// RoutedValues lists up to limit distinct values of column among the
	// events f selects.
	RoutedValues(ctx context.Context, t Table, f ReplayFilter, column string, limit int) ([]string, error)
	// ReplayBatch re-enqueues the next events of b in their original
	// order, advances the request's cursor and progress and renews its
	// heartbeat, all in one transaction, and returns how many it
	// re-enqueued and whether any remain.
	ReplayBatch(ctx context.Context, t Table, b ReplayBatch) (n int, more bool, err error)
	// RepairDeadLetter replaces the payload and headers of a dead letter
	// (payload nil keeps it; headers nil keeps them) and moves it back
	// into the outbox with its id, auditing the change with the before and
	// after, in one transaction held at the request's epoch.
	RepairDeadLetter(ctx context.Context, t Table, req, executor string, epoch int64, id string, payload, headers json.RawMessage, by Acting) error
}

// AuditPruner is a Store whose audit table is append-only but for one
// documented retention command: PruneAudit deletes the rows older than
// before and records that it did, as by.
type AuditPruner interface {
	PruneAudit(ctx context.Context, t Table, before time.Time, by Acting) (int64, error)
}
