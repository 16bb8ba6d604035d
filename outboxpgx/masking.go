package outboxpgx

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Audit actions of the masking stored with the table.
const (
	actionMaskAdd    = "mask-add"
	actionMaskRemove = "mask-remove"
)

func maskingTable(t outboxdriver.Table) string { return t.WithDefaults().Qualified("_masking") }

// MaskPaths lists the payload paths stored with t as sensitive, by
// aggregate type, event type and path. A table that predates the masking
// table (schema version 21) has none; one that does not exist wraps
// outboxdriver.ErrNotMigrated.
func (d *Driver) MaskPaths(ctx context.Context, t outboxdriver.Table) ([]outboxdriver.MaskPath, error) {
	if _, err := d.names(t); err != nil {
		return nil, err
	}
	rows, err := d.pool.Query(ctx, `SELECT aggregatetype, type, path, source, actor, at FROM `+maskingTable(t)+` ORDER BY aggregatetype, type, path`)
	if err != nil {
		if !isUndefinedTable(err) {
			return nil, d.fail(ctx, t, "masked paths of", err)
		}
		switch ok, err := migrated(ctx, d.pool, t); {
		case err != nil:
			return nil, fmt.Errorf("outboxpgx: masked paths of %s: %w", t, err)
		case !ok:
			return nil, driverkit.NotMigrated("outboxpgx", t)
		}
		return []outboxdriver.MaskPath{}, nil
	}
	ps, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outboxdriver.MaskPath, error) {
		var p outboxdriver.MaskPath
		err := r.Scan(&p.AggregateType, &p.Type, &p.Path, &p.Source, &p.Actor, &p.At)
		return p, err
	})
	if err != nil {
		return nil, d.fail(ctx, t, "masked paths of", err)
	}
	if ps == nil {
		ps = []outboxdriver.MaskPath{}
	}
	return ps, nil
}

// AddMaskPath stores p with t and writes the audit row in the same
// transaction; it reports false, writing nothing, when p's path is stored
// for its scope already.
func (d *Driver) AddMaskPath(ctx context.Context, t outboxdriver.Table, p outboxdriver.MaskPath, by outboxdriver.Acting) (bool, error) {
	return d.changeMask(ctx, t, p, by, actionMaskAdd, `INSERT INTO `+maskingTable(t)+` (aggregatetype, type, path, source, actor)
VALUES ($1, $2, $3, $4, $5) ON CONFLICT (aggregatetype, type, path) DO NOTHING RETURNING source`,
		p.AggregateType, p.Type, p.Path, p.Source, by.Name)
}

// RemoveMaskPath deletes the stored path p.Path of p's scope from t and
// writes the audit row in the same transaction; it reports false, writing
// nothing, when there is none.
func (d *Driver) RemoveMaskPath(ctx context.Context, t outboxdriver.Table, p outboxdriver.MaskPath, by outboxdriver.Acting) (bool, error) {
	if p.Source == "" {
		p.Source = outboxdriver.MaskSourceOperator // not stored: only checked
	}
	return d.changeMask(ctx, t, p, by, actionMaskRemove, `DELETE FROM `+maskingTable(t)+` WHERE aggregatetype = $1 AND type = $2 AND path = $3 RETURNING source`,
		p.AggregateType, p.Type, p.Path)
}

func (d *Driver) changeMask(ctx context.Context, t outboxdriver.Table, p outboxdriver.MaskPath, by outboxdriver.Acting, action, change string, args ...any) (bool, error) {
	n, err := d.names(t)
	if err != nil {
		return false, err
	}
	if err := p.Validate(); err != nil {
		return false, fmt.Errorf("outboxpgx: %w", err)
	}
	var changed bool
	err = pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		var source string
		switch err := tx.QueryRow(ctx, change, args...).Scan(&source); {
		case errors.Is(err, pgx.ErrNoRows):
			return nil
		case err != nil:
			return err
		}
		changed = true
		_, err := tx.Exec(ctx, `INSERT INTO `+n.Audit+` (actor, role, action, detail, reason) VALUES ($1, $2, $3, $4, $5)`,
			by.Name, by.Role, action, driverkit.MaskAuditDetail(p, source), by.Reason)
		return err
	})
	if err != nil {
		return false, d.fail(ctx, t, action+" of", err)
	}
	return changed, nil
}
