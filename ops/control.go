package ops

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/outboxkit/outbox/outboxdriver"
)

// Audit actions of pauses and held aggregates (the Store writes them in
// the same transaction as the change).
const (
	ActionPause   = "pause"
	ActionResume  = "resume"
	ActionRelease = "release"
)

// Pauses lists the pauses in force, oldest first.
func (o *Ops) Pauses(ctx context.Context, a Actor) ([]outboxdriver.Pause, error) {
	if err := o.allow(ctx, a, "list pauses", Read); err != nil {
		return nil, err
	}
	return o.st.ListPauses(ctx, o.t)
}

// Pause stops the relays from publishing scope s until it is resumed;
// every relay honours it within one poll interval. Paused events wait:
// no attempt is spent and no event is dead-lettered for it. A reason is
// required. It reports false when s was paused already.
func (o *Ops) Pause(ctx context.Context, a Actor, s outboxdriver.PauseScope, reason string) (bool, error) {
	return o.changePause(ctx, a, "pause "+s.String(), s, reason, true)
}

// Resume lifts the pause of scope s; it reports false when s was not
// paused.
func (o *Ops) Resume(ctx context.Context, a Actor, s outboxdriver.PauseScope, reason string) (bool, error) {
	return o.changePause(ctx, a, "resume "+s.String(), s, reason, false)
}

func (o *Ops) changePause(ctx context.Context, a Actor, op string, s outboxdriver.PauseScope, reason string, pause bool) (bool, error) {
	if err := o.allow(ctx, a, op, Act); err != nil {
		return false, err
	}
	if err := s.Validate(); err != nil {
		return false, &InputError{"scope", err.Error()}
	}
	if err := checkReason(reason, pause); err != nil {
		return false, err
	}
	by := outboxdriver.Acting{Name: a.Name, Role: string(a.Role), Reason: reason}
	if pause {
		return o.st.SetPause(ctx, o.t, s, by)
	}
	return o.st.LiftPause(ctx, o.t, s, by)
}

// Held lists up to limit held aggregates, longest held first.
func (o *Ops) Held(ctx context.Context, a Actor, limit int) ([]outboxdriver.HeldAggregate, error) {
	if err := o.allow(ctx, a, "list held aggregates", Read); err != nil {
		return nil, err
	}
	if err := o.checkLimit(limit); err != nil {
		return nil, err
	}
	return o.st.HeldAggregates(ctx, o.t, limit)
}

// ErrNotHeld: the dead letter named holds no aggregate. It wraps
// ErrNotFound.
var ErrNotHeld = fmt.Errorf("the dead letter holds no aggregate: %w", ErrNotFound)

// Release lets the later events of the aggregate held behind the dead
// letter id flow on; the dead letter stays (retry or discard it on its
// own). Order within the aggregate is given up on purpose, so a reason is
// required. A dead letter that holds no aggregate is ErrNotHeld.
func (o *Ops) Release(ctx context.Context, a Actor, id, reason string) (outboxdriver.HeldAggregate, error) {
	if err := o.Allow(ctx, a, "release a held aggregate", Act, Subject{Event: id}); err != nil {
		return outboxdriver.HeldAggregate{}, err
	}
	id, err := ParseID(id)
	if err != nil {
		return outboxdriver.HeldAggregate{}, err
	}
	if err := checkReason(reason, true); err != nil {
		return outboxdriver.HeldAggregate{}, err
	}
	h, err := o.st.ReleaseHeld(ctx, o.t, id, outboxdriver.Acting{Name: a.Name, Role: string(a.Role), Reason: reason})
	if errors.Is(err, ErrNotFound) {
		return h, fmt.Errorf("ops: release %s: %w", id, ErrNotHeld)
	}
	return h, err
}

// checkReason checks a reason's length, and that one is given when
// required.
func checkReason(reason string, required bool) error {
	if len(reason) > maxReasonLen || !utf8.ValidString(reason) {
		return &InputError{"reason", fmt.Sprintf("at most %d bytes of text", maxReasonLen)}
	}
	if required && strings.TrimSpace(reason) == "" {
		return &InputError{"reason", "say why, for the audit"}
	}
	return nil
}

// MaxGroupAction is the most dead letters one action on a failure group
// moves; a larger group takes several.
const MaxGroupAction = 10_000

// FailureGroups lists up to limit groups of dead letters (same event
// type, same error class), largest first.
func (o *Ops) FailureGroups(ctx context.Context, a Actor, limit int) ([]outboxdriver.FailureGroup, error) {
	if err := o.allow(ctx, a, "list failure groups", Read); err != nil {
		return nil, err
	}
	if err := o.checkLimit(limit); err != nil {
		return nil, err
	}
	return o.st.FailureGroups(ctx, o.t, limit)
}

// RetryGroup retries up to MaxGroupAction dead letters of the failure
// group key, each audited as Retry audits it, and returns their ids. A
// key no group has is ErrNotFound.
func (o *Ops) RetryGroup(ctx context.Context, a Actor, key, reason string) ([]string, error) {
	return o.groupAction(ctx, a, "retry a failure group", key, reason, o.Retry)
}

// DiscardGroup discards up to MaxGroupAction dead letters of the failure
// group key, each audited as Discard audits it, and returns their ids.
func (o *Ops) DiscardGroup(ctx context.Context, a Actor, key, reason string) ([]string, error) {
	return o.groupAction(ctx, a, "discard a failure group", key, reason, o.Discard)
}

func (o *Ops) groupAction(ctx context.Context, a Actor, op, key, reason string, do func(context.Context, Actor, []string, string) ([]string, error)) ([]string, error) {
	if err := o.allow(ctx, a, op, Act); err != nil {
		return nil, err
	}
	if len(key) != 32 || strings.Trim(key, "0123456789abcdef") != "" {
		return nil, &InputError{"group", "want the key of a failure group (32 hex digits)"}
	}
	if err := checkReason(reason, false); err != nil {
		return nil, err
	}
	ids, err := o.st.FailureGroupIDs(ctx, o.t, key, MaxGroupAction)
	if err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("ops: failure group %s: %w", key, ErrNotFound)
	}
	return do(ctx, a, ids, reason)
}
