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

// SensitivePaths lists the payload paths masked wherever a payload is
// shown, as configured.
func (o *Ops) SensitivePaths() []string { return slices.Clone(o.cfg.SensitivePaths) }

// Reveal returns a dead letter with the values at one configured
// sensitive path shown (the others stay masked); path may be empty when
// only one is configured. It needs the operator's
// permission and a reason, and the audit row is written before anything
// is shown: when it cannot be written, nothing is revealed.
func (o *Ops) Reveal(ctx context.Context, a Actor, id, path, reason string) (View, error) {
	if err := o.allow(ctx, a, "reveal a masked payload field", Act); err != nil {
		return View{}, err
	}
	u, err := ParseID(id)
	if err != nil {
		return View{}, err
	}
	if path == "" && len(o.cfg.SensitivePaths) == 1 {
		path = o.cfg.SensitivePaths[0]
	}
	at := slices.Index(o.cfg.SensitivePaths, path)
	if at < 0 {
		return View{}, &InputError{"path", fmt.Sprintf("%q is not a sensitive path; these are: %s", clip(path, 64), strings.Join(o.cfg.SensitivePaths, ", "))}
	}
	if err := checkReason(reason, true); err != nil {
		return View{}, err
	}
	if o.ins == nil {
		return View{}, fmt.Errorf("ops: reveal: %w", ErrUnsupported)
	}
	d, err := o.ins.DeadLetter(ctx, o.t, u)
	if err != nil {
		return View{}, err
	}
	if err := o.Record(ctx, outboxdriver.AuditRecord{
		AuditEntry: outboxdriver.AuditEntry{Actor: a.Name, Action: ActionReveal, EventID: u, Detail: "revealed payload path " + path},
		Role:       string(a.Role), Reason: reason,
	}); err != nil {
		return View{}, fmt.Errorf("ops: reveal: the audit row could not be written, so nothing is revealed: %w", err)
	}
	return o.viewRevealing(d, at), nil
}
