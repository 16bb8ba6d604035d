package ops

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/outboxkit/outbox/contract"
	"github.com/outboxkit/outbox/outboxdriver"
)

// DefaultMaskRefresh is Config.MaskRefresh's default.
const DefaultMaskRefresh = 2 * time.Second

// maskCache keeps the masking stored with the table (Store.MaskPaths)
// for Config.MaskRefresh.
type maskCache struct {
	mu    sync.Mutex
	paths []outboxdriver.MaskPath
	read  time.Time // zero: to be read
}

// storedMasks returns the paths stored with the table, read again once
// the last read is Config.MaskRefresh old. A failed read is an error: the
// caller hides what it would have masked with them.
func (o *Ops) storedMasks(ctx context.Context) ([]outboxdriver.MaskPath, error) {
	c := &o.stored
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.read.IsZero() && o.now().Sub(c.read) < o.cfg.MaskRefresh {
		return c.paths, nil
	}
	ps, err := o.st.MaskPaths(ctx, o.t)
	if err != nil {
		return nil, fmt.Errorf("ops: the masking stored with %s could not be read: %w", o.t, err)
	}
	c.paths, c.read = ps, o.now()
	return ps, nil
}

// forgetStored makes the next read of the stored masking go to the
// database: after a change this Ops made.
func (o *Ops) forgetStored() {
	o.stored.mu.Lock()
	o.stored.read = time.Time{}
	o.stored.mu.Unlock()
}

// MaskPaths lists the payload paths stored with the table as sensitive,
// which every surface masks (docs/security.md).
func (o *Ops) MaskPaths(ctx context.Context, a Actor) ([]outboxdriver.MaskPath, error) {
	if err := o.allow(ctx, a, "list the masked paths", Read); err != nil {
		return nil, err
	}
	return o.st.MaskPaths(ctx, o.t)
}

// AddMaskPath stores p with the table (Source "" is MaskSourceOperator),
// audited with a's name and role and the reason; it reports false when
// the path is stored for that scope already. Every process that shows
// the table's payloads masks it within its Config.MaskRefresh.
func (o *Ops) AddMaskPath(ctx context.Context, a Actor, p outboxdriver.MaskPath, reason string) (bool, error) {
	return o.changeMask(ctx, a, "add a masked path", p, reason, false, o.st.AddMaskPath)
}

// RemoveMaskPath deletes the stored path p.Path of p's scope, audited
// with a's name and role and the reason; it reports false when there is
// none. It needs a reason: it shows what was hidden. Paths passed in
// Config stay masked.
func (o *Ops) RemoveMaskPath(ctx context.Context, a Actor, p outboxdriver.MaskPath, reason string) (bool, error) {
	return o.changeMask(ctx, a, "remove a masked path", p, reason, true, o.st.RemoveMaskPath)
}

func (o *Ops) changeMask(ctx context.Context, a Actor, op string, p outboxdriver.MaskPath, reason string, needReason bool,
	do func(context.Context, outboxdriver.Table, outboxdriver.MaskPath, outboxdriver.Acting) (bool, error)) (bool, error) {
	if err := o.allow(ctx, a, op, Act); err != nil {
		return false, err
	}
	if p.Source == "" {
		p.Source = outboxdriver.MaskSourceOperator
	}
	if err := CheckMaskPath(p); err != nil {
		return false, err
	}
	if err := checkReason(reason, needReason); err != nil {
		return false, err
	}
	changed, err := do(ctx, o.t, p, outboxdriver.Acting{Name: a.Name, Role: string(a.Role), Reason: reason})
	o.forgetStored()
	return changed, err
}

// CheckMaskPath reports, as an *InputError, why p cannot be stored with
// the table: a path that is not a dot-separated JSON path, or text that
// is too long or holds control characters.
func CheckMaskPath(p outboxdriver.MaskPath) error {
	if err := p.Validate(); err != nil {
		return &InputError{"path", err.Error()}
	}
	if _, err := contract.ParsePath(p.Path); err != nil {
		return &InputError{"path", fmt.Sprintf("%q: %v", p.Path, err)}
	}
	return nil
}

// ContractMaskPaths returns the paths reg's contracts name sensitive or
// forbidden, as paths to store with the table: each contract's for its
// aggregate type and event type (source "contract A/T"), the registry's
// own for every event (source "contract registry").
func ContractMaskPaths(reg *contract.Registry) []outboxdriver.MaskPath {
	var out []outboxdriver.MaskPath
	add := func(p outboxdriver.MaskPath) {
		if !slices.ContainsFunc(out, func(q outboxdriver.MaskPath) bool {
			return q.AggregateType == p.AggregateType && q.Type == p.Type && q.Path == p.Path
		}) {
			out = append(out, p)
		}
	}
	for _, path := range reg.RegistryPaths() {
		add(outboxdriver.MaskPath{Path: path, Source: "contract registry"})
	}
	for _, c := range reg.Contracts() {
		for _, path := range append(slices.Clone(c.Sensitive), c.Forbidden...) {
			source := "contract " + c.AggregateType + "/" + c.Type
			if len(source) > outboxdriver.MaxMaskText {
				source = "contract"
			}
			add(outboxdriver.MaskPath{AggregateType: c.AggregateType, Type: c.Type, Path: path, Source: source})
		}
	}
	return out
}
