package ops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox/contract"
	"github.com/outboxkit/outbox/internal/confval"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/route"
)

// Role is what a user may do.
type Role string

// The roles, from the least to the most trusted in what they change.
const (
	Viewer   Role = "viewer"
	Operator Role = "operator"
	Approver Role = "approver"
)

// Roles lists every role.
func Roles() []Role { return []Role{Viewer, Operator, Approver} }

// ParseRole reads a role's name.
func ParseRole(s string) (Role, error) {
	for _, r := range Roles() {
		if string(r) == s {
			return r, nil
		}
	}
	return "", fmt.Errorf("unknown role %q: use viewer, operator or approver", s)
}

// Permission is something a role may be allowed to do.
type Permission string

// The permissions.
const (
	// Read: the overview, dead letters and the audit.
	Read Permission = "read"
	// Act: retry and discard dead letters.
	Act Permission = "act"
	// Approve: approve or reject another user's request.
	Approve Permission = "approve"
)

// May reports whether r has permission p. An unknown role has none.
func (r Role) May(p Permission) bool {
	switch r {
	case Viewer:
		return p == Read
	case Operator:
		return p == Read || p == Act
	case Approver:
		return p == Read || p == Approve
	}
	return false
}

// Actor is who asks for an operation.
type Actor struct {
	Name string
	Role Role
}

func (a Actor) String() string { return a.Name + " (" + string(a.Role) + ")" }

// Audit actions ops records besides the Store's own retry and discard.
const (
	ActionDenied      = "denied"
	ActionLogin       = "login"
	ActionLoginFailed = "login-failed"
	ActionLogout      = "logout"
)

// Errors for branching. Every error ops returns for bad input is an
// *InputError; a refusal is a *DeniedError.
var (
	// ErrDenied is wrapped by a *DeniedError.
	ErrDenied = errors.New("permission denied")
	// ErrNotFound: the dead letter asked for does not exist.
	ErrNotFound = outboxdriver.ErrNotFound
)

// DeniedError says that an actor's role does not allow an operation.
type DeniedError struct {
	Actor     Actor
	Operation string
	Need      Permission
}

func (e *DeniedError) Error() string {
	return fmt.Sprintf("%s may not %s: the %s role does not allow it", e.Actor, e.Operation, e.Actor.Role)
}

// Unwrap returns ErrDenied.
func (e *DeniedError) Unwrap() error { return ErrDenied }

// InputError is a request ops refuses as malformed before it reaches the
// database.
type InputError struct {
	Field  string
	Reason string
}

func (e *InputError) Error() string { return e.Field + ": " + e.Reason }

// Config configures Ops. The zero value is usable.
type Config struct {
	// MaxPage is the largest page of dead letters or audit rows one call
	// returns; a larger limit is refused. Defaults to 500.
	MaxPage int
	// SensitivePaths are the payload fields masked wherever a payload is
	// shown: dot-separated JSON paths ("customer.email", "cards.*.number";
	// * matches any key or array index). A payload that is not JSON is
	// hidden whole when any path is set.
	SensitivePaths []string
	// Contracts, when set, adds the sensitive and forbidden paths of each
	// event's contract to SensitivePaths for that event's payload (a
	// *contract.Registry).
	Contracts SensitiveSource
	// MaskRefresh is how long the paths stored with the table as
	// sensitive (its masking: Store.MaskPaths, `outbox mask`) are kept
	// before they are read again; they are masked besides SensitivePaths
	// and Contracts' paths. A path added by another process is masked
	// here within it. Defaults to DefaultMaskRefresh (2 seconds).
	MaskRefresh time.Duration
	// Logger defaults to warnings and errors as text on standard error.
	Logger *slog.Logger

	// RequestTTL is how long a request (replay, repair) may wait to be
	// approved and carried out before it expires. Defaults to
	// DefaultRequestTTL (1 hour).
	RequestTTL time.Duration
	// RepairMaxBytes caps a proposed repair's payload and headers.
	// Defaults to DefaultRepairMaxBytes (48 KiB).
	RepairMaxBytes int
	// Route is the relay's routing, which a replay's destination filter
	// follows. Defaults to Debezium's (outbox.event.<aggregatetype>).
	Route *route.Config
}

// SensitiveSource names the sensitive payload paths of one event type,
// and of all of them together (for what names no event type, such as an
// audit row's before and after). *contract.Registry implements it.
type SensitiveSource interface {
	SensitivePaths(aggregateType, eventType string) []string
	AllSensitivePaths() []string
}

// DefaultMaxPage is Config.MaxPage's default.
const DefaultMaxPage = 500

// Limits on filter text, so a request cannot make the database compare
// megabytes.
const (
	maxFilterLen = 256
	maxReasonLen = 1000
)

// Ops runs the operations on one outbox table.
type Ops struct {
	st    outboxdriver.Store
	t     outboxdriver.Table
	cfg   Config
	masks [][]string
	log   *slog.Logger

	stored maskCache

	router *route.Router
	kick   chan struct{}
	now    func() time.Time
}

// New returns the operations on table t of st. t must name its schema.
func New(st outboxdriver.Store, t outboxdriver.Table, cfg *Config) (*Ops, error) {
	if st == nil {
		return nil, errors.New("ops: no Store")
	}
	if err := t.WithDefaults().Validate(); err != nil {
		return nil, fmt.Errorf("ops: %w", err)
	}
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.MaxPage == 0 {
		c.MaxPage = DefaultMaxPage
	}
	if c.MaxPage < 0 {
		return nil, fmt.Errorf("ops: MaxPage %d: want a positive number", c.MaxPage)
	}
	if c.RequestTTL == 0 {
		c.RequestTTL = DefaultRequestTTL
	}
	if c.RepairMaxBytes == 0 {
		c.RepairMaxBytes = DefaultRepairMaxBytes
	}
	if c.MaskRefresh == 0 {
		c.MaskRefresh = DefaultMaskRefresh
	}
	if c.RequestTTL < 0 || c.RepairMaxBytes < 0 || c.MaskRefresh < 0 {
		return nil, errors.New("ops: RequestTTL, RepairMaxBytes and MaskRefresh must be positive")
	}
	router, err := route.New(c.Route)
	if err != nil {
		return nil, fmt.Errorf("ops: %w", err)
	}
	o := &Ops{st: st, t: t, cfg: c, log: confval.Logger(c.Logger), router: router, kick: make(chan struct{}, 1), now: time.Now}
	for _, p := range c.SensitivePaths {
		segs, err := contract.ParsePath(p)
		if err != nil {
			return nil, fmt.Errorf("ops: sensitive path %q: %w", p, err)
		}
		o.masks = append(o.masks, segs)
	}
	return o, nil
}

// Table is the table the operations act on.
func (o *Ops) Table() outboxdriver.Table { return o.t }

// MaxPage is the largest page one call returns.
func (o *Ops) MaxPage() int { return o.cfg.MaxPage }

// Subject names what an operation is about, for its audit rows: an event,
// a request, or neither. A value that is not a well-formed id is left out.
type Subject struct {
	Event, Request string
}

// ids returns s's ids in canonical form, each empty unless well-formed.
func (s Subject) ids() (event, request string) {
	if u, err := uuid.Parse(s.Event); err == nil {
		event = u.String()
	}
	if u, err := uuid.Parse(s.Request); err == nil {
		request = u.String()
	}
	return event, request
}

// Allow checks that a's role has permission p for operation op, before
// anything else of the call is read: a refusal is audited as a denied row
// naming about's event or request, and returned as a *DeniedError. Every
// operation checks its permission itself too; Allow lets a caller (the
// console) refuse a role before it parses the input it would pass on, so
// that a role that may not act learns nothing from the input's errors.
func (o *Ops) Allow(ctx context.Context, a Actor, op string, p Permission, about Subject) error {
	if a.Name != "" && a.Role.May(p) {
		return nil
	}
	event, request := about.ids()
	o.record(ctx, outboxdriver.AuditRecord{
		Actor: a.Name, Action: ActionDenied, Detail: op + ": needs the " + string(p) + " permission",
		Role: string(a.Role), EventID: event, RequestID: request,
	})
	return &DeniedError{Actor: a, Operation: op, Need: p}
}

// allow is Allow about nothing in particular.
func (o *Ops) allow(ctx context.Context, a Actor, op string, p Permission) error {
	return o.Allow(ctx, a, op, p, Subject{})
}

// record appends r to the audit, or logs why it could not.
func (o *Ops) record(ctx context.Context, r outboxdriver.AuditRecord) {
	if err := o.Record(ctx, r); err != nil {
		o.log.Error("ops: audit row not written", "action", r.Action, "actor", r.Actor, "err", err)
	}
}

// Record appends r to the audit table: for things that are not dead-letter
// actions, such as a login.
func (o *Ops) Record(ctx context.Context, r outboxdriver.AuditRecord) error {
	r.Actor, r.Detail, r.Reason = clip(r.Actor, 200), clip(r.Detail, 2000), clip(r.Reason, maxReasonLen)
	return o.st.AppendAudit(ctx, o.t, r)
}

// Refused records that a request by a was refused before any operation
// ran (a missing CSRF token, a bad API token): what was asked and why, and
// the event or request it was about.
func (o *Ops) Refused(ctx context.Context, a Actor, what, why string, about Subject) {
	event, request := about.ids()
	o.record(ctx, outboxdriver.AuditRecord{
		Actor: a.Name, Action: ActionDenied, Detail: what + ": " + why,
		Role: string(a.Role), EventID: event, RequestID: request,
	})
}

// Overview summarises the table: backlog, oldest age, dead letters, held
// aggregates, partitions and their leases. Counts above OverviewExactUpTo
// may be estimates (Store.EstimateStatus), marked in Status.Estimated, so
// that the overview never reads a large backlog whole.
func (o *Ops) Overview(ctx context.Context, a Actor) (outboxdriver.Status, error) {
	if err := o.allow(ctx, a, "view the overview", Read); err != nil {
		return outboxdriver.Status{}, err
	}
	return o.st.EstimateStatus(ctx, o.t, OverviewExactUpTo)
}

// OverviewExactUpTo is the count up to which the overview's numbers are
// exact.
const OverviewExactUpTo = 1_000

// DeadLetters lists one page of the dead letters q selects, oldest first.
// A destination filter (q.Destination) follows the relays' routing
// (Config.Route): it selects the dead letters whose routed column holds a
// value routed there, among at most 10,000 distinct values.
func (o *Ops) DeadLetters(ctx context.Context, a Actor, q outboxdriver.DeadLetterQuery) (outboxdriver.DeadLetterPage, error) {
	if err := o.allow(ctx, a, "list dead letters", Read); err != nil {
		return outboxdriver.DeadLetterPage{}, err
	}
	if err := o.checkLimit(q.Limit); err != nil {
		return outboxdriver.DeadLetterPage{}, err
	}
	for _, f := range []struct{ name, v string }{{"aggregatetype", q.AggregateType}, {"aggregateid", q.AggregateID}, {"type", q.Type}, {"error", q.ErrorContains}, {"destination", q.Destination}} {
		if len(f.v) > maxFilterLen || !utf8.ValidString(f.v) || strings.ContainsRune(f.v, 0) {
			return outboxdriver.DeadLetterPage{}, &InputError{f.name, fmt.Sprintf("at most %d bytes of text", maxFilterLen)}
		}
	}
	if !q.Since.IsZero() && !q.Until.IsZero() && !q.Since.Before(q.Until) {
		return outboxdriver.DeadLetterPage{}, &InputError{"since", "must be before until"}
	}
	if q.Destination == "" {
		return o.st.FindDeadLetters(ctx, o.t, q)
	}
	dest := q.Destination
	q.Destination = ""
	col, values, err := o.destinationValues(dest, "the dead letters the other filters select", func(col string, limit int) ([]string, error) {
		return o.st.DeadLetterValues(ctx, o.t, q, col, limit)
	})
	if err != nil {
		return outboxdriver.DeadLetterPage{}, err
	}
	return o.st.FindRoutedDeadLetters(ctx, o.t, q, col, values)
}

// DeadLetter returns one dead letter with its payload (masked) and
// headers.
func (o *Ops) DeadLetter(ctx context.Context, a Actor, id string) (View, error) {
	if err := o.Allow(ctx, a, "view a dead letter", Read, Subject{Event: id}); err != nil {
		return View{}, err
	}
	u, err := ParseID(id)
	if err != nil {
		return View{}, err
	}
	d, err := o.st.DeadLetter(ctx, o.t, u)
	if err != nil {
		return View{}, err
	}
	return o.view(ctx, d), nil
}

// Retry moves dead letters back into the outbox (ids nil: all of them),
// each audited with a's name and role and the reason, and returns the ids
// moved. Ids that are not dead letters are left out of the result.
func (o *Ops) Retry(ctx context.Context, a Actor, ids []string, reason string) ([]string, error) {
	return o.move(ctx, a, "retry dead letters", ids, reason, func(ids []string, by outboxdriver.Acting) ([]string, error) {
		return o.st.RetryDeadLetters(ctx, o.t, ids, by)
	})
}

// Discard deletes dead letters for good and releases the aggregates held
// behind them (ids nil: all of them), each audited with a's name and role
// and the reason, and returns the ids deleted.
func (o *Ops) Discard(ctx context.Context, a Actor, ids []string, reason string) ([]string, error) {
	return o.move(ctx, a, "discard dead letters", ids, reason, func(ids []string, by outboxdriver.Acting) ([]string, error) {
		return o.st.DiscardDeadLetters(ctx, o.t, ids, by)
	})
}

func (o *Ops) move(ctx context.Context, a Actor, op string, ids []string, reason string, do func([]string, outboxdriver.Acting) ([]string, error)) ([]string, error) {
	var about Subject
	if len(ids) == 1 {
		about.Event = ids[0]
	}
	if err := o.Allow(ctx, a, op, Act, about); err != nil {
		return nil, err
	}
	if ids != nil && len(ids) == 0 {
		return nil, &InputError{"ids", "name at least one dead letter"}
	}
	canon := make([]string, len(ids))
	for i, id := range ids {
		u, err := ParseID(id)
		if err != nil {
			return nil, err
		}
		canon[i] = u
	}
	if ids == nil {
		canon = nil
	}
	if len(reason) > maxReasonLen || !utf8.ValidString(reason) {
		return nil, &InputError{"reason", fmt.Sprintf("at most %d bytes of text", maxReasonLen)}
	}
	return do(canon, outboxdriver.Acting{Name: a.Name, Role: string(a.Role), Reason: reason})
}

// Audit lists the audit rows q selects, newest first.
func (o *Ops) Audit(ctx context.Context, a Actor, q outboxdriver.AuditQuery) ([]outboxdriver.AuditRecord, error) {
	if err := o.allow(ctx, a, "read the audit", Read); err != nil {
		return nil, err
	}
	if err := o.checkLimit(q.Limit); err != nil {
		return nil, err
	}
	for _, f := range []struct{ name, v string }{{"actor", q.Actor}, {"action", q.Action}} {
		if len(f.v) > maxFilterLen || !utf8.ValidString(f.v) {
			return nil, &InputError{f.name, fmt.Sprintf("at most %d bytes of text", maxFilterLen)}
		}
	}
	if q.EventID != "" {
		id, err := ParseID(q.EventID)
		if err != nil {
			return nil, err
		}
		q.EventID = id
	}
	if q.Before < 0 {
		return nil, &InputError{"before", "want the id of an audit row"}
	}
	if q.RequestID != "" {
		id, err := parseRequestID(q.RequestID)
		if err != nil {
			return nil, err
		}
		q.RequestID = id
	}
	recs, err := o.st.FindAudit(ctx, o.t, q)
	for i := range recs {
		recs[i].Before, recs[i].After = o.maskDiff(ctx, recs[i].Before), o.maskDiff(ctx, recs[i].After)
	}
	return recs, err
}

func (o *Ops) checkLimit(n int) error {
	if n < 1 || n > o.cfg.MaxPage {
		return &InputError{"limit", fmt.Sprintf("between 1 and %d", o.cfg.MaxPage)}
	}
	return nil
}

// ParseID checks that id is an event id (a UUID) and returns its canonical
// form.
func ParseID(id string) (string, error) {
	u, err := uuid.Parse(id)
	if err != nil {
		return "", &InputError{"id", fmt.Sprintf("%q is not an event id (a UUID)", clip(id, 64))}
	}
	return u.String(), nil
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}
