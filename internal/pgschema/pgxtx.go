package pgschema

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// PgxQuerier is a pgx pool, connection or transaction.
type PgxQuerier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// PgxTx is q as the Tx that migrations and SetupSlot read and write
// through.
func PgxTx(q PgxQuerier) Tx { return pgxTx{q} }

type pgxTx struct{ q PgxQuerier }

func (m pgxTx) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := m.q.Exec(ctx, sql, args...)
	return err
}

func (m pgxTx) Each(ctx context.Context, sql string, args []any, row func(scan func(dest ...any) error) error) error {
	rows, err := m.q.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := row(rows.Scan); err != nil {
			return err
		}
	}
	return rows.Err()
}

func (m pgxTx) Versions(ctx context.Context, sql string, args ...any) ([]int, error) {
	rows, err := m.q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int])
}
