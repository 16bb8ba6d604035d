package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Audit actions on a consumer's dead letters.
const (
	ActionInboxRetry   = "inbox-retry"
	ActionInboxDiscard = "inbox-discard"
)

// Inbox is the operations on the dead letters of the consumers of one
// inbox table: `outbox inbox` and the console's consumers page call it. It
// checks roles, masks payloads and writes audit rows through an Ops, so the
// outbox's rules hold here too: a viewer reads, an operator retries and
// discards, and every action (and every refusal) is an audit row in that
// Ops' audit table, written before the change.
type Inbox struct {
	o   *Ops
	adm inbox.Admin
	t   outboxdriver.Table
}

// NewInbox returns the operations on inbox table t through adm (an inbox
// driver: inboxpgx or inboxsql), checked and audited by o.
func NewInbox(o *Ops, adm inbox.Admin, t outboxdriver.Table) (*Inbox, error) {
	if o == nil || adm == nil {
		return nil, errors.New("ops: NewInbox needs an Ops and an inbox driver")
	}
	check := t
	if check.Schema == "" {
		check.Schema = "current_database" // MySQL: the connection's own
	}
	if err := check.Validate(); err != nil {
		return nil, fmt.Errorf("ops: inbox table: %w", err)
	}
	return &Inbox{o: o, adm: adm, t: t}, nil
}

// Table is the inbox table.
func (x *Inbox) Table() outboxdriver.Table { return x.t }

// InboxView is one consumer's dead letter as shown to a user: the payload
// shown as Ops shows an outbox dead letter's (sensitive paths masked).
type InboxView struct {
	inbox.DeadLetter
	// Payload is what to show of the payload: indented JSON, or text.
	Payload string `json:"payload"`
	// PayloadNote says what was left out or masked, or is "".
	PayloadNote string `json:"payload_note"`
	// Masked counts the values masked.
	Masked int `json:"masked"`
}

func checkConsumer(c string) error {
	if strings.TrimSpace(c) == "" || len(c) > 200 || !utf8.ValidString(c) || strings.ContainsRune(c, 0) {
		return &InputError{"consumer", "name the consumer: 1 to 200 bytes of text"}
	}
	return nil
}

// ParseDeadLetterID reads the id of a consumer's dead letter.
func ParseDeadLetterID(s string) (int64, error) {
	var id int64
	if _, err := fmt.Sscan(s, &id); err != nil || id <= 0 || fmt.Sprint(id) != s {
		return 0, &InputError{"id", fmt.Sprintf("%q is not a dead letter's id (a positive number)", clip(s, 64))}
	}
	return id, nil
}

// Status counts consumer's dedupe records and dead letters.
func (x *Inbox) Status(ctx context.Context, a Actor, consumer string) (inbox.Stats, error) {
	if err := x.o.allow(ctx, a, "view a consumer's status", Read); err != nil {
		return inbox.Stats{}, err
	}
	if err := checkConsumer(consumer); err != nil {
		return inbox.Stats{}, err
	}
	return x.adm.Stats(ctx, x.t, consumer)
}

// DeadLetters lists up to limit of consumer's dead letters, oldest first,
// without their payloads.
func (x *Inbox) DeadLetters(ctx context.Context, a Actor, consumer string, limit int) ([]inbox.DeadLetter, error) {
	if err := x.o.allow(ctx, a, "list a consumer's dead letters", Read); err != nil {
		return nil, err
	}
	if err := checkConsumer(consumer); err != nil {
		return nil, err
	}
	if err := x.o.checkLimit(limit); err != nil {
		return nil, err
	}
	dls, err := x.adm.DeadLetters(ctx, x.t, consumer, limit)
	for i := range dls {
		dls[i].Payload = nil
	}
	return dls, err
}

// DeadLetter returns one of consumer's dead letters with its headers and
// its payload, the sensitive paths masked.
func (x *Inbox) DeadLetter(ctx context.Context, a Actor, consumer string, id int64) (InboxView, error) {
	if err := x.o.allow(ctx, a, "view a consumer's dead letter", Read); err != nil {
		return InboxView{}, err
	}
	if err := checkConsumer(consumer); err != nil {
		return InboxView{}, err
	}
	dl, err := x.adm.DeadLetter(ctx, x.t, consumer, id)
	if err != nil {
		if errors.Is(err, inbox.ErrNotFound) {
			return InboxView{}, fmt.Errorf("consumer %s has no dead letter %d: %w", consumer, id, ErrNotFound)
		}
		return InboxView{}, err
	}
	d := outboxdriver.DeadLetterDetail{DeadLetter: outboxdriver.DeadLetter{ID: dl.EventID, AggregateType: dl.AggregateType,
		AggregateID: dl.AggregateID, Type: dl.Type}}
	if json.Valid(dl.Payload) {
		d.Payload = dl.Payload
	} else if dl.Payload != nil {
		d.PayloadRaw = dl.Payload
	}
	v := x.o.view(ctx, d)
	dl.Payload = nil
	return InboxView{DeadLetter: dl, Payload: v.Payload, PayloadNote: v.PayloadNote, Masked: v.Masked}, nil
}

// Retry marks consumer's dead letters ids (nil: all of them) for retry,
// each audited with a's name and role and the reason, and returns the ids
// marked; ids that are not dead letters are left out. A running consumer
// (consumer.Engine) hands each to its handler again.
func (x *Inbox) Retry(ctx context.Context, a Actor, consumer string, ids []int64, reason string) ([]int64, error) {
	return x.act(ctx, a, consumer, ids, reason, ActionInboxRetry, "retry a consumer's dead letters", "marked for retry", x.adm.RequestRetry)
}

// Discard deletes consumer's dead letters ids (nil: all of them) for
// good, each audited with a's name and role and the reason, and returns
// the ids deleted.
func (x *Inbox) Discard(ctx context.Context, a Actor, consumer string, ids []int64, reason string) ([]int64, error) {
	return x.act(ctx, a, consumer, ids, reason, ActionInboxDiscard, "discard a consumer's dead letters", "discarded", x.adm.DeleteDeadLetters)
}

func (x *Inbox) act(ctx context.Context, a Actor, consumer string, ids []int64, reason, action, op, done string,
	do func(context.Context, outboxdriver.Table, string, []int64) ([]int64, error)) ([]int64, error) {
	if err := x.o.allow(ctx, a, op, Act); err != nil {
		return nil, err
	}
	if err := checkConsumer(consumer); err != nil {
		return nil, err
	}
	if ids != nil && len(ids) == 0 {
		return nil, &InputError{"ids", "name at least one dead letter"}
	}
	for _, id := range ids {
		if id <= 0 {
			return nil, &InputError{"id", fmt.Sprintf("%d is not a dead letter's id (a positive number)", id)}
		}
	}
	if len(reason) > maxReasonLen || !utf8.ValidString(reason) {
		return nil, &InputError{"reason", fmt.Sprintf("at most %d bytes of text", maxReasonLen)}
	}
	if ids == nil {
		all, err := x.adm.DeadLetterIDs(ctx, x.t, consumer)
		if err != nil {
			return nil, err
		}
		ids = all
	}
	var acted []int64
	for _, id := range ids {
		dl, err := x.adm.DeadLetter(ctx, x.t, consumer, id)
		if errors.Is(err, inbox.ErrNotFound) {
			continue
		}
		if err != nil {
			return acted, err
		}
		r := outboxdriver.AuditRecord{Actor: a.Name, Action: action, Role: string(a.Role), Reason: reason,
			Detail: fmt.Sprintf("consumer %q of inbox %s: dead letter %d %s", consumer, x.t, id, done)}
		if u, err := uuid.Parse(dl.EventID); err == nil {
			r.EventID = u.String()
		}
		// The audit row comes first: no change is ever made unrecorded.
		if err := x.o.Record(ctx, r); err != nil {
			return acted, fmt.Errorf("audit %s of dead letter %d (nothing changed): %w", action, id, err)
		}
		got, err := do(ctx, x.t, consumer, []int64{id})
		if err != nil {
			return acted, err
		}
		acted = append(acted, got...)
	}
	return acted, nil
}
