package workload

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox/outboxdriver"
)

// RunMySQL writes the workload into MySQL/MariaDB table t (t.Schema is
// the database), as Run does on PostgreSQL: plain SQL only, each
// transaction locks its aggregate's row, bumps its version and inserts
// one event per version with only Debezium's columns.
func RunMySQL(ctx context.Context, db *sql.DB, t outboxdriver.Table, cfg Config) (*Result, error) {
	return RunOn(ctx, &mysqlDB{db: db,
		aggs:  "`" + t.Schema + "`.`" + t.Name + "_workload_aggs`",
		table: "`" + t.Schema + "`.`" + t.Name + "`"}, cfg)
}

// mysqlDB is the workload's MySQL/MariaDB.
type mysqlDB struct {
	db          *sql.DB
	aggs, table string
}

func (d *mysqlDB) Prepare(ctx context.Context, aggregates int) error {
	if _, err := d.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+d.aggs+` (id VARCHAR(64) PRIMARY KEY, v INT NOT NULL) ENGINE=InnoDB`); err != nil {
		return err
	}
	for i := range aggregates {
		if _, err := d.db.ExecContext(ctx, `INSERT IGNORE INTO `+d.aggs+` VALUES (?, 0)`, fmt.Sprint("agg-", i)); err != nil {
			return err
		}
	}
	return nil
}

func (d *mysqlDB) Begin(ctx context.Context) (Tx, error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return &mysqlTx{tx: tx, d: d}, nil
}

type mysqlTx struct {
	tx *sql.Tx
	d  *mysqlDB
}

func (t *mysqlTx) Bump(ctx context.Context, agg string, n int) (int, error) {
	var v int
	if err := t.tx.QueryRowContext(ctx, `SELECT v FROM `+t.d.aggs+` WHERE id = ? FOR UPDATE`, agg).Scan(&v); err != nil {
		return 0, err
	}
	_, err := t.tx.ExecContext(ctx, `UPDATE `+t.d.aggs+` SET v = v + ? WHERE id = ?`, n, agg)
	return v, err
}

func (t *mysqlTx) Insert(ctx context.Context, typ, agg, payload string) (string, error) {
	id := uuid.NewString()
	_, err := t.tx.ExecContext(ctx, `INSERT INTO `+t.d.table+` (id, aggregatetype, aggregateid, type, payload)
VALUES (?, ?, ?, 'Changed', ?)`, id, typ, agg, payload)
	return id, err
}

func (t *mysqlTx) Commit(context.Context) error   { return t.tx.Commit() }
func (t *mysqlTx) Rollback(context.Context) error { return t.tx.Rollback() }
