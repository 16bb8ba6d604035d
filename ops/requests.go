package ops

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox/internal/confval"
	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Request is a replay or a repair, proposed by one user and carried out
// only once another approved it.
type Request = outboxdriver.Request

// Defaults of the requests' settings in Config.
const (
	DefaultRequestTTL      = time.Hour
	DefaultRepairMaxBytes  = 48 << 10
	DefaultReplayBatchSize = 500
	// DefaultExecutorStale is ExecutorConfig.Stale's default.
	DefaultExecutorStale = 30 * time.Second
	// maxRoutedValues bounds the distinct routed values a destination
	// filter may stand for.
	maxRoutedValues = 10000
	// PreviewEvents is how many events a replay's preview lists.
	PreviewEvents = 20
)

// Errors of requests, for branching.
var (
	// ErrNoKeptRows: a replay needs published events kept in the table
	// (the relay's --retention keep), and there are none.
	ErrNoKeptRows = errors.New("the table keeps no published events: a replay needs the relay to run with --retention keep (published rows are then kept until the cleanup removes them)")
	// ErrNoRequest: no request has the id asked for. It wraps ErrNotFound.
	ErrNoRequest = fmt.Errorf("no such request: %w", ErrNotFound)
	// ErrRequestState: the request is not in a state that allows this
	// (approving an expired or decided one, cancelling a finished one).
	ErrRequestState = outboxdriver.ErrRequestState
)

// SelfApprovalError refuses a decision on one's own request.
type SelfApprovalError struct {
	Actor   Actor
	Request string
}

func (e *SelfApprovalError) Error() string {
	return fmt.Sprintf("%s requested %s and may not approve or reject it: another approver must (two-person rule)", e.Actor.Name, e.Request)
}

// Unwrap returns ErrDenied.
func (e *SelfApprovalError) Unwrap() error { return ErrDenied }

// ReplayParams select the published events a replay re-enqueues: those
// published at or after Since and before Until (at most the time of the
// request), of the aggregate type, aggregate id, event type and
// destination given (empty matches all). NewIDs gives each copy a new id
// and the header outbox-replay-of with the original's; otherwise copies
// keep their ids.
type ReplayParams struct {
	Since         time.Time `json:"since"`
	Until         time.Time `json:"until"`
	AggregateType string    `json:"aggregatetype,omitempty"`
	AggregateID   string    `json:"aggregateid,omitempty"`
	Type          string    `json:"type,omitempty"`
	Destination   string    `json:"destination,omitempty"`
	NewIDs        bool      `json:"new_ids"`
}

// RepairParams propose a dead letter's new payload and headers. Payload
// nil keeps the payload, Headers nil the headers. In a proposed payload,
// a value "***" at a sensitive path keeps the stored value (the console
// shows payloads masked, and a proposal starts from what it shows).
type RepairParams struct {
	EventID string            `json:"event_id"`
	Payload json.RawMessage   `json:"payload,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
}

// ReplayPreview is what a replay would re-enqueue: how many events and the
// first of them.
type ReplayPreview struct {
	Count  int64                      `json:"count"`
	First  []outboxdriver.ReplayEvent `json:"first"`
	Params ReplayParams               `json:"params"`
}

// The actor the console's own housekeeping is audited under.
var system = outboxdriver.Acting{Name: driverkit.SystemActor, Role: driverkit.SystemRole}

// expire marks the requests past their expiry expired.
func (o *Ops) expire(ctx context.Context) error {
	_, err := o.st.ExpireRequests(ctx, o.t, system)
	return err
}

func checkText(field, v string) error {
	if len(v) > maxFilterLen || !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
		return &InputError{field, fmt.Sprintf("at most %d bytes of text", maxFilterLen)}
	}
	return nil
}

// replayFilter checks p (Until defaults to, and is at most, now) and
// resolves its destination into routed values.
func (o *Ops) replayFilter(ctx context.Context, p *ReplayParams) (outboxdriver.ReplayFilter, error) {
	var f outboxdriver.ReplayFilter
	for _, x := range []struct{ name, v string }{{"aggregatetype", p.AggregateType}, {"aggregateid", p.AggregateID}, {"type", p.Type}, {"destination", p.Destination}} {
		if err := checkText(x.name, x.v); err != nil {
			return f, err
		}
	}
	now := o.now().UTC()
	if p.Since.IsZero() {
		return f, &InputError{"since", "a replay needs the start of its time range (events published at or after it)"}
	}
	if p.Until.IsZero() || p.Until.After(now) {
		p.Until = now
	}
	p.Since, p.Until = p.Since.UTC(), p.Until.UTC()
	if !p.Since.Before(p.Until) {
		return f, &InputError{"since", "must be before until (and until is at most now)"}
	}
	f = outboxdriver.ReplayFilter{Since: p.Since, Until: p.Until, AggregateType: p.AggregateType, AggregateID: p.AggregateID, Type: p.Type}
	if p.Destination == "" {
		return f, nil
	}
	col, values, err := o.destinationValues(p.Destination, "the time range", func(col string, limit int) ([]string, error) {
		return o.st.RoutedValues(ctx, o.t, f, col, limit)
	})
	if err != nil {
		return f, err
	}
	f.RoutedColumn, f.RoutedValues = col, values
	return f, nil
}

// destinationValues resolves a destination filter through the relays'
// routing: the values of the routed column whose events go to dest, out of
// the candidates list returns (at most limit of them; where says among
// what, for the error when there are more than maxRoutedValues).
func (o *Ops) destinationValues(dest, where string, list func(col string, limit int) ([]string, error)) (string, []string, error) {
	col := o.router.RouteBy()
	if col != "aggregatetype" && col != "type" && col != "aggregateid" && col != "id" {
		return "", nil, &InputError{"destination", "the routing (by " + col + ") cannot be filtered by destination: filter by aggregate type or event type instead"}
	}
	values, err := list(col, maxRoutedValues+1)
	if err != nil {
		return "", nil, err
	}
	if len(values) > maxRoutedValues {
		return "", nil, &InputError{"destination", fmt.Sprintf("%s holds more than %d distinct values of %s: narrow it, or filter by aggregate type", where, maxRoutedValues, col)}
	}
	out := []string{}
	for _, v := range values {
		if d, err := o.router.DestinationOf(v); err == nil && d == dest {
			out = append(out, v)
		}
	}
	return col, out, nil
}

// PreviewReplay says what a replay with p would re-enqueue: the count and
// the first events, in their original order.
func (o *Ops) PreviewReplay(ctx context.Context, a Actor, p ReplayParams) (ReplayPreview, error) {
	if err := o.allow(ctx, a, "preview a replay", Read); err != nil {
		return ReplayPreview{}, err
	}
	return o.previewReplay(ctx, p)
}

func (o *Ops) previewReplay(ctx context.Context, p ReplayParams) (ReplayPreview, error) {
	f, err := o.replayFilter(ctx, &p)
	if err != nil {
		return ReplayPreview{}, err
	}
	kept, err := o.st.HasPublished(ctx, o.t)
	if err != nil {
		return ReplayPreview{}, err
	}
	if !kept {
		return ReplayPreview{}, ErrNoKeptRows
	}
	n, first, err := o.st.PreviewReplay(ctx, o.t, f, PreviewEvents)
	if first == nil {
		first = []outboxdriver.ReplayEvent{}
	}
	return ReplayPreview{Count: n, First: first, Params: p}, err
}

// RequestReplay proposes a replay of the published events p selects; it
// is carried out once an approver other than a approves it, before it
// expires.
func (o *Ops) RequestReplay(ctx context.Context, a Actor, p ReplayParams, reason string) (Request, error) {
	if err := o.allow(ctx, a, "request a replay", Act); err != nil {
		return Request{}, err
	}
	if err := checkReason(reason, true); err != nil {
		return Request{}, err
	}
	pv, err := o.previewReplay(ctx, p)
	if err != nil {
		return Request{}, err
	}
	if pv.Count == 0 {
		return Request{}, &InputError{"since", "no published event kept in the table matches: nothing to replay"}
	}
	params, err := json.Marshal(pv.Params)
	if err != nil {
		return Request{}, err
	}
	return o.createRequest(ctx, a, outboxdriver.RequestReplay, params, reason)
}

func (o *Ops) createRequest(ctx context.Context, a Actor, kind string, params []byte, reason string) (Request, error) {
	r := Request{ID: uuid.Must(uuid.NewV7()).String(), Kind: kind, Requester: a.Name, RequesterRole: string(a.Role), Reason: reason,
		Params: params, ExpiresAt: o.now().Add(o.cfg.RequestTTL)}
	if err := o.st.CreateRequest(ctx, o.t, r, outboxdriver.Acting{Name: a.Name, Role: string(a.Role), Reason: reason}); err != nil {
		return Request{}, err
	}
	return o.st.GetRequest(ctx, o.t, r.ID)
}

// RequestRepair proposes new payload and headers for a dead letter; once
// an approver other than a approves, the dead letter gets them and is
// retried with its id. The audit keeps the before and after.
func (o *Ops) RequestRepair(ctx context.Context, a Actor, p RepairParams, reason string) (Request, error) {
	if err := o.Allow(ctx, a, "propose a repair", Act, Subject{Event: p.EventID}); err != nil {
		return Request{}, err
	}
	if err := checkReason(reason, true); err != nil {
		return Request{}, err
	}
	id, err := ParseID(p.EventID)
	if err != nil {
		return Request{}, err
	}
	p.EventID = id
	if p.Payload == nil && p.Headers == nil {
		return Request{}, &InputError{"payload", "propose a new payload, new headers or both"}
	}
	d, err := o.st.DeadLetter(ctx, o.t, id)
	if err != nil {
		return Request{}, err
	}
	size := len(p.Payload)
	for k, v := range p.Headers {
		size += len(k) + len(v)
		if k == "" || len(k) > maxFilterLen || !utf8.ValidString(k) || !utf8.ValidString(v) {
			return Request{}, &InputError{"headers", fmt.Sprintf("header names of 1 to %d bytes of text, values of text", maxFilterLen)}
		}
		if strings.EqualFold(k, "id") {
			return Request{}, &InputError{"headers", `the header "id" always carries the event id`}
		}
	}
	if size > o.cfg.RepairMaxBytes {
		return Request{}, &InputError{"payload", fmt.Sprintf("%d bytes of payload and headers: at most %d", size, o.cfg.RepairMaxBytes)}
	}
	if p.Payload != nil {
		if !json.Valid(p.Payload) {
			return Request{}, &InputError{"payload", "not valid JSON"}
		}
		if d.Payload != nil && bytes.HasPrefix(bytes.TrimSpace(d.Payload), []byte("{")) && !bytes.HasPrefix(bytes.TrimSpace(p.Payload), []byte("{")) {
			return Request{}, &InputError{"payload", "the stored payload is a JSON object: propose an object"}
		}
		_, masks, err := o.sensitiveFor(ctx, d.AggregateType, d.Type)
		if err != nil {
			return Request{}, err
		}
		if p.Payload, err = unmask(p.Payload, d.Payload, masks); err != nil {
			return Request{}, &InputError{"payload", err.Error()}
		}
	}
	params, err := json.Marshal(p)
	if err != nil {
		return Request{}, err
	}
	return o.createRequest(ctx, a, outboxdriver.RequestRepair, params, reason)
}

// unmask puts the stored values back where a proposal kept the mask at a
// sensitive path (masks: the event's, parsed).
func unmask(proposed, stored []byte, masks [][]string) ([]byte, error) {
	if len(masks) == 0 || stored == nil {
		return proposed, nil
	}
	p, err := decodeTree(json.NewDecoder(bytes.NewReader(proposed)), 0)
	if err != nil {
		return nil, errors.New("not valid JSON")
	}
	s, err := decodeTree(json.NewDecoder(bytes.NewReader(stored)), 0)
	if err != nil {
		return proposed, nil
	}
	restored := 0
	for _, m := range masks {
		restored += p.restore(s, m)
	}
	if restored == 0 {
		return proposed, nil // kept as written
	}
	var b strings.Builder
	p.write(&b, "")
	var compact bytes.Buffer
	if err := json.Compact(&compact, []byte(b.String())); err != nil {
		return nil, err
	}
	return compact.Bytes(), nil
}

// restore replaces values Mask at path in n with those of orig and
// returns how many.
func (n *jnode) restore(orig *jnode, path []string) int {
	if len(path) == 0 {
		if s, ok := n.leaf.(string); ok && n.kind == 0 && s == Mask {
			*n = *orig
			return 1
		}
		return 0
	}
	if n.kind != orig.kind {
		return 0
	}
	count := 0
	for i, v := range n.vals {
		key := strconv.Itoa(i)
		if n.kind == '{' {
			key = n.keys[i]
		}
		if path[0] != "*" && path[0] != key {
			continue
		}
		for j, ov := range orig.vals {
			okey := strconv.Itoa(j)
			if orig.kind == '{' {
				okey = orig.keys[j]
			}
			if okey == key {
				count += v.restore(ov, path[1:])
				break
			}
		}
	}
	return count
}

// MaskJSON returns JSON as shown to users: indented, with the sensitive
// paths masked (text that is not JSON is hidden when any path is set).
// It names no event type, so it masks every path sensitive in any event:
// the configured ones, those stored with the table and every contract's.
func (o *Ops) MaskJSON(ctx context.Context, b []byte) string {
	if len(b) == 0 {
		return ""
	}
	paths, masks := o.sensitiveForAny(ctx)
	return o.viewMasked(outboxdriver.DeadLetterDetail{Payload: b}, -1, paths, masks).Payload
}

// Requests lists requests, newest first (state "" lists all).
func (o *Ops) Requests(ctx context.Context, a Actor, state string, limit int) ([]Request, error) {
	if err := o.allow(ctx, a, "list requests", Read); err != nil {
		return nil, err
	}
	if err := o.checkLimit(limit); err != nil {
		return nil, err
	}
	if state != "" && !knownState(state) {
		return nil, &InputError{"state", "one of pending, approved, executing, done, failed, cancelled, rejected, expired"}
	}
	if err := o.expire(ctx); err != nil {
		return nil, err
	}
	return o.st.ListRequests(ctx, o.t, state, limit)
}

func knownState(s string) bool {
	switch s {
	case outboxdriver.StatePending, outboxdriver.StateApproved, outboxdriver.StateExecuting, outboxdriver.StateDone,
		outboxdriver.StateFailed, outboxdriver.StateCancelled, outboxdriver.StateRejected, outboxdriver.StateExpired:
		return true
	}
	return false
}

// Request returns one request.
func (o *Ops) Request(ctx context.Context, a Actor, id string) (Request, error) {
	if err := o.Allow(ctx, a, "view a request", Read, Subject{Request: id}); err != nil {
		return Request{}, err
	}
	return o.request(ctx, id)
}

func (o *Ops) request(ctx context.Context, id string) (Request, error) {
	u, err := parseRequestID(id)
	if err != nil {
		return Request{}, err
	}
	if err := o.expire(ctx); err != nil {
		return Request{}, err
	}
	r, err := o.st.GetRequest(ctx, o.t, u)
	if errors.Is(err, ErrNotFound) {
		return r, fmt.Errorf("request %s: %w", u, ErrNoRequest)
	}
	return r, err
}

func parseRequestID(id string) (string, error) {
	u, err := uuid.Parse(id)
	if err != nil {
		return "", &InputError{"id", fmt.Sprintf("%q is not a request id (a UUID)", clip(id, 64))}
	}
	return u.String(), nil
}

// Approve approves another user's pending request; the console's executor
// then carries it out.
func (o *Ops) Approve(ctx context.Context, a Actor, id, note string) (Request, error) {
	r, err := o.decide(ctx, a, id, outboxdriver.StateApproved, note)
	if err == nil {
		o.Kick()
	}
	return r, err
}

// Reject rejects another user's pending request.
func (o *Ops) Reject(ctx context.Context, a Actor, id, note string) (Request, error) {
	return o.decide(ctx, a, id, outboxdriver.StateRejected, note)
}

func (o *Ops) decide(ctx context.Context, a Actor, id, to, note string) (Request, error) {
	verb := map[string]string{outboxdriver.StateApproved: "approve", outboxdriver.StateRejected: "reject"}[to]
	if err := o.Allow(ctx, a, verb+" a request", Approve, Subject{Request: id}); err != nil {
		return Request{}, err
	}
	if err := checkReason(note, false); err != nil {
		return Request{}, err
	}
	r, err := o.request(ctx, id)
	if err != nil {
		return Request{}, err
	}
	if r.Requester == a.Name {
		err := &SelfApprovalError{Actor: a, Request: r.Kind + " request " + r.ID}
		o.record(ctx, outboxdriver.AuditRecord{
			Actor: a.Name, Action: ActionDenied, Detail: verb + " a request: " + err.Error(),
			Role: string(a.Role), RequestID: r.ID,
		})
		return Request{}, err
	}
	return o.st.DecideRequest(ctx, o.t, r.ID, to, outboxdriver.Acting{Name: a.Name, Role: string(a.Role), Reason: note})
}

// Cancel cancels a request that has not finished; an executing replay
// stops after its current batch (what it re-enqueued stays).
func (o *Ops) Cancel(ctx context.Context, a Actor, id, reason string) (Request, error) {
	if err := o.Allow(ctx, a, "cancel a request", Act, Subject{Request: id}); err != nil {
		return Request{}, err
	}
	if err := checkReason(reason, false); err != nil {
		return Request{}, err
	}
	r, err := o.request(ctx, id)
	if err != nil {
		return Request{}, err
	}
	return o.st.DecideRequest(ctx, o.t, r.ID, outboxdriver.StateCancelled, outboxdriver.Acting{Name: a.Name, Role: string(a.Role), Reason: reason})
}

// Kick wakes the executor: a request was approved.
func (o *Ops) Kick() {
	select {
	case o.kick <- struct{}{}:
	default:
	}
}

// ExecutorConfig configures an Executor. The zero value is usable.
type ExecutorConfig struct {
	// Name identifies the executor in the requests it holds; defaults to
	// host-pid.
	Name string
	// BatchSize is how many events a replay re-enqueues per transaction
	// (default 500).
	BatchSize int
	// Poll is how often it looks for approved requests when not woken
	// (default 2 seconds).
	Poll time.Duration
	// Stale is how long an executing request's executor may go without a
	// heartbeat before another takes it over (default 30 seconds).
	Stale time.Duration
	// AfterBatch, when set, is called after each batch of a replay with
	// the events done so far (tests stop an execution midway with it).
	AfterBatch func(ctx context.Context, r Request, done int64)
	// Logger defaults to the Ops' logger.
	Logger *slog.Logger
}

// Executor carries out approved requests in the background: it takes
// approved requests and executing ones whose executor went quiet (a
// console that crashed mid-replay), and runs them batch by batch from
// their persisted cursor.
type Executor struct {
	o      *Ops
	cfg    ExecutorConfig
	log    *slog.Logger
	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// NewExecutor returns an Executor over o; it does nothing until Start.
func (o *Ops) NewExecutor(cfg *ExecutorConfig) (*Executor, error) {
	c := ExecutorConfig{}
	if cfg != nil {
		c = *cfg
	}
	if c.Name == "" {
		host, _ := os.Hostname()
		c.Name = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), uuid.NewString()[:8])
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultReplayBatchSize
	}
	if c.Poll == 0 {
		c.Poll = 2 * time.Second
	}
	if c.Stale == 0 {
		c.Stale = DefaultExecutorStale
	}
	if c.BatchSize < 1 || c.Poll < 0 || c.Stale < 0 {
		return nil, errors.New("ops: executor: BatchSize, Poll and Stale must be positive")
	}
	log := o.log
	if c.Logger != nil {
		log = confval.Logger(c.Logger)
	}
	return &Executor{o: o, cfg: c, log: log}, nil
}

// Start runs the executor in the background until Stop.
func (e *Executor) Start(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.done != nil {
		return errors.New("ops: executor already started")
	}
	ctx, e.cancel = context.WithCancel(context.WithoutCancel(ctx))
	e.done = make(chan struct{})
	go func() {
		defer close(e.done)
		t := time.NewTicker(e.cfg.Poll)
		defer t.Stop()
		for {
			if err := e.RunOnce(ctx); err != nil && ctx.Err() == nil {
				e.log.Error("ops: executor", "err", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-e.o.kick:
			}
		}
	}()
	return nil
}

// Stop stops the executor and waits for it; a replay it was running stays
// executing and is resumed by the next executor. Stop is idempotent.
func (e *Executor) Stop(ctx context.Context) error {
	e.mu.Lock()
	cancel, done := e.cancel, e.done
	e.mu.Unlock()
	if done == nil {
		return nil
	}
	cancel()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// RunOnce carries out every request that is approved, or executing with
// a quiet executor, one after the other, and returns the first error.
func (e *Executor) RunOnce(ctx context.Context) error {
	o := e.o
	if err := o.expire(ctx); err != nil {
		return err
	}
	var first error
	for _, state := range []string{outboxdriver.StateApproved, outboxdriver.StateExecuting} {
		rs, err := o.st.ListRequests(ctx, o.t, state, o.cfg.MaxPage)
		if err != nil {
			return err
		}
		for i := len(rs) - 1; i >= 0; i-- { // oldest first
			if err := e.Execute(ctx, rs[i].ID); err != nil && !errors.Is(err, ErrRequestState) && first == nil {
				first = err
			}
		}
	}
	return first
}

// Execute takes request id (approved, or executing with a quiet executor)
// and carries it out. It wraps ErrRequestState when the request cannot be
// taken (another executor holds it, it was cancelled). A replay that
// fails is marked failed with the reason; one whose context ends stays
// executing, to be resumed.
func (e *Executor) Execute(ctx context.Context, id string) error {
	o := e.o
	r, err := o.st.ClaimRequest(ctx, o.t, id, e.cfg.Name, e.cfg.Stale)
	if err != nil {
		return err
	}
	e.log.Info("ops: executing request", "request", r.ID, "kind", r.Kind, "epoch", r.Epoch, "done", r.Done)
	var runErr error
	switch r.Kind {
	case outboxdriver.RequestReplay:
		runErr = e.replay(ctx, r)
	case outboxdriver.RequestRepair:
		runErr = e.repair(ctx, r)
	default:
		runErr = fmt.Errorf("unknown kind %q", r.Kind)
	}
	switch {
	case runErr == nil:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("request %s stopped after %s; it resumes from its cursor: %w", r.ID, "its last batch", ctx.Err())
	case errors.Is(runErr, ErrRequestState):
		return runErr // cancelled, or taken over
	}
	// Failed for good: say why, where everyone sees it.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := o.st.FinishRequest(fctx, o.t, r.ID, e.cfg.Name, r.Epoch, outboxdriver.StateFailed, clip(runErr.Error(), 1000)); err != nil {
		e.log.Error("ops: mark request failed", "request", r.ID, "err", err)
	}
	return runErr
}

func (e *Executor) replay(ctx context.Context, r Request) error {
	o := e.o
	var p ReplayParams
	if err := json.Unmarshal(r.Params, &p); err != nil {
		return fmt.Errorf("request %s: parameters: %w", r.ID, err)
	}
	f, err := o.replayFilter(ctx, &p) // Until was pinned when requested
	if err != nil {
		return err
	}
	if r.Total == nil {
		n, _, err := o.st.PreviewReplay(ctx, o.t, f, 0)
		if err != nil {
			return err
		}
		if err := o.st.SetRequestTotal(ctx, o.t, r.ID, n); err != nil {
			return err
		}
	}
	done := r.Done
	for {
		n, more, err := o.st.ReplayBatch(ctx, o.t, outboxdriver.ReplayBatch{Request: r.ID, Executor: e.cfg.Name, Epoch: r.Epoch,
			Filter: f, Limit: e.cfg.BatchSize, NewIDs: p.NewIDs})
		if err != nil {
			return err
		}
		done += int64(n)
		if e.cfg.AfterBatch != nil {
			e.cfg.AfterBatch(ctx, r, done)
		}
		if !more {
			break
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return o.st.FinishRequest(ctx, o.t, r.ID, e.cfg.Name, r.Epoch, outboxdriver.StateDone, "")
}

func (e *Executor) repair(ctx context.Context, r Request) error {
	o := e.o
	var p RepairParams
	if err := json.Unmarshal(r.Params, &p); err != nil {
		return fmt.Errorf("request %s: parameters: %w", r.ID, err)
	}
	var headers json.RawMessage
	if p.Headers != nil {
		b, err := json.Marshal(p.Headers)
		if err != nil {
			return err
		}
		headers = b
	}
	return o.st.RepairDeadLetter(ctx, o.t, r.ID, e.cfg.Name, r.Epoch, p.EventID, p.Payload, headers, driverkit.RepairRetry(r))
}

// PruneAudit deletes the audit rows older than before: the audit's one
// retention command (`outbox audit prune`), itself audited. Only the
// command line offers it, never the console.
func (o *Ops) PruneAudit(ctx context.Context, a Actor, before time.Time, reason string) (int64, error) {
	if err := o.allow(ctx, a, "prune the audit", Act); err != nil {
		return 0, err
	}
	if err := checkReason(reason, false); err != nil {
		return 0, err
	}
	if before.IsZero() || before.After(o.now()) {
		return 0, &InputError{"before", "a time in the past: rows older than it are deleted"}
	}
	return o.st.PruneAudit(ctx, o.t, before, outboxdriver.Acting{Name: a.Name, Role: string(a.Role), Reason: reason})
}

// ParseTime reads RFC 3339, or a date and time (or a date) taken as UTC:
// the times the console's filters and the command line take.
func ParseTime(field, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, &InputError{Field: field, Reason: "want a time such as 2006-01-02T15:04:05Z or 2006-01-02"}
}

// maskDiff masks the payload of an audit row's before or after
// ({"payload": ..., "headers": ...}), as every payload shown is masked.
func (o *Ops) maskDiff(ctx context.Context, b json.RawMessage) json.RawMessage {
	paths, masks := o.sensitiveForAny(ctx)
	if len(b) == 0 || len(masks) == 0 {
		return b
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(b, &m) != nil {
		return nil
	}
	if p, ok := m["payload"]; ok && string(p) != "null" {
		v := o.viewMasked(outboxdriver.DeadLetterDetail{Payload: p}, -1, paths, masks)
		shown := json.RawMessage(v.Payload)
		if v.Payload == "" || !json.Valid(shown) {
			shown, _ = json.Marshal(v.PayloadNote)
		}
		m["payload"] = shown
	}
	if raw, ok := m["payload_raw"]; ok {
		m["payload_raw"], _ = json.Marshal(fmt.Sprintf("%d bytes that are not JSON: hidden", len(raw)))
	}
	out, err := json.Marshal(m)
	if err != nil {
		return nil
	}
	return out
}
