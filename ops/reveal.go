package ops

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/outboxkit/outbox/outboxdriver"
)

// ActionReveal is the audit action of showing a masked payload field.
const ActionReveal = "reveal"

// Reveal returns a dead letter with the values at one of its sensitive
// paths (a configured one or its contract's) shown, the others staying
// masked; path may be empty when the event has only one. It needs the operator's
// permission and a reason, and the audit row is written before anything
// is shown: when it cannot be written, nothing is revealed.
func (o *Ops) Reveal(ctx context.Context, a Actor, id, path, reason string) (View, error) {
	if err := o.Allow(ctx, a, "reveal a masked payload field", Act, Subject{Event: id}); err != nil {
		return View{}, err
	}
	u, err := ParseID(id)
	if err != nil {
		return View{}, err
	}
	stored, err := o.storedMasks(ctx)
	if err != nil {
		return View{}, err
	}
	if o.cfg.Contracts == nil && len(stored) == 0 { // the paths are known before the event is read
		if err := checkRevealPath(o.cfg.SensitivePaths, path); err != nil {
			return View{}, err
		}
	}
	if err := checkReason(reason, true); err != nil {
		return View{}, err
	}
	d, err := o.st.DeadLetter(ctx, o.t, u)
	if err != nil {
		return View{}, err
	}
	paths, masks, err := o.sensitiveFor(ctx, d.AggregateType, d.Type)
	if err != nil {
		return View{}, err
	}
	if err := checkRevealPath(paths, path); err != nil {
		return View{}, err
	}
	if path == "" {
		path = paths[0]
	}
	at := slices.Index(paths, path)
	if err := o.Record(ctx, outboxdriver.AuditRecord{
		Actor: a.Name, Action: ActionReveal, EventID: u, Detail: "revealed payload path " + path,
		Role: string(a.Role), Reason: reason,
	}); err != nil {
		return View{}, fmt.Errorf("ops: reveal: the audit row could not be written, so nothing is revealed: %w", err)
	}
	return o.viewMasked(d, at, paths, masks), nil
}

// checkRevealPath checks that path is one of an event's sensitive paths,
// or empty when it has exactly one.
func checkRevealPath(paths []string, path string) error {
	if path == "" && len(paths) == 1 || slices.Contains(paths, path) {
		return nil
	}
	if len(paths) == 0 {
		return &InputError{"path", "this event has no sensitive path: nothing is masked"}
	}
	return &InputError{"path", fmt.Sprintf("%q is not a sensitive path; these are: %s", clip(path, 64), strings.Join(paths, ", "))}
}
