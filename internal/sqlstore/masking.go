package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Audit actions of the masking stored with the table.
const (
	actionMaskAdd    = "mask-add"
	actionMaskRemove = "mask-remove"
)

// MaskPaths lists the payload paths stored with t as sensitive, by
// aggregate type, event type and path. A table that predates the masking
// table has none; one that does not exist wraps
// outboxdriver.ErrNotMigrated.
func (s Store) MaskPaths(ctx context.Context, t outboxdriver.Table) ([]outboxdriver.MaskPath, error) {
	db, n, err := s.open(t)
	if err != nil {
		return nil, err
	}
	rows, err := db.QueryContext(ctx, "SELECT aggregatetype, `type`, `path`, source, actor, "+s.d.TimeText("`at`")+` FROM `+n.masking+" ORDER BY aggregatetype, `type`, `path`")
	if err != nil {
		if !s.d.NoTable(err) {
			return nil, s.fail(ctx, t, "masked paths of", err)
		}
		switch ok, err := s.d.Migrated(ctx, db, n.t); {
		case err != nil:
			return nil, fmt.Errorf("%s: masked paths of %s: %w", s.d.Driver, t, oneLine(err))
		case !ok:
			return nil, driverkit.NotMigrated(s.d.Driver, t)
		}
		return []outboxdriver.MaskPath{}, nil
	}
	defer rows.Close()
	out := []outboxdriver.MaskPath{}
	for rows.Next() {
		var p outboxdriver.MaskPath
		if err := rows.Scan(&p.AggregateType, &p.Type, &p.Path, &p.Source, &p.Actor, timeCol{&p.At}); err != nil {
			return nil, s.fail(ctx, t, "masked paths of", err)
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fail(ctx, t, "masked paths of", err)
	}
	return out, nil
}

// AddMaskPath stores p with t and writes the audit row in the same
// transaction; it reports false, writing nothing, when p's path is stored
// for its scope already.
func (s Store) AddMaskPath(ctx context.Context, t outboxdriver.Table, p outboxdriver.MaskPath, by outboxdriver.Acting) (bool, error) {
	return s.changeMask(ctx, t, p, by, actionMaskAdd)
}

// RemoveMaskPath deletes the stored path p.Path of p's scope from t and
// writes the audit row in the same transaction; it reports false, writing
// nothing, when there is none.
func (s Store) RemoveMaskPath(ctx context.Context, t outboxdriver.Table, p outboxdriver.MaskPath, by outboxdriver.Acting) (bool, error) {
	if p.Source == "" {
		p.Source = outboxdriver.MaskSourceOperator // not stored: only checked
	}
	return s.changeMask(ctx, t, p, by, actionMaskRemove)
}

func (s Store) changeMask(ctx context.Context, t outboxdriver.Table, p outboxdriver.MaskPath, by outboxdriver.Acting, action string) (bool, error) {
	db, n, err := s.open(t)
	if err != nil {
		return false, err
	}
	if err := p.Validate(); err != nil {
		return false, fmt.Errorf("%s: %w", s.d.Driver, err)
	}
	const key = "aggregatetype = ? AND `type` = ? AND `path` = ?"
	var changed bool
	err = s.inTx(ctx, db, func(tx *sql.Tx) error {
		source := p.Source
		if action == actionMaskAdd {
			res, err := tx.ExecContext(ctx, s.d.InsertIgnore+` INTO `+n.masking+" (aggregatetype, `type`, `path`, source, actor, `at`) VALUES (?, ?, ?, ?, ?, "+s.d.Now+`)`,
				p.AggregateType, p.Type, p.Path, p.Source, by.Name)
			if err != nil {
				return err
			}
			if k, err := res.RowsAffected(); err != nil || k == 0 {
				return err
			}
		} else {
			err := tx.QueryRowContext(ctx, `SELECT source FROM `+n.masking+` WHERE `+key+s.d.ForUpdate, p.AggregateType, p.Type, p.Path).Scan(&source)
			if errors.Is(err, sql.ErrNoRows) {
				return nil
			}
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `DELETE FROM `+n.masking+` WHERE `+key, p.AggregateType, p.Type, p.Path); err != nil {
				return err
			}
		}
		changed = true
		_, err := tx.ExecContext(ctx, `INSERT INTO `+n.audit+` (actor, role, action, detail, reason) VALUES (?, ?, ?, ?, ?)`,
			by.Name, by.Role, action, driverkit.MaskAuditDetail(p, source), by.Reason)
		return err
	})
	if err != nil {
		return false, s.fail(ctx, t, action+" of", err)
	}
	return changed, nil
}
