package bench

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxsql"
)

// The writers of the latency scenario. Without Config.PlainWrites every
// cell uses WriterPipelined; with it, each loaded cell runs once more with
// each of the other writers, beside it.
const (
	// WriterPipelined sends BEGIN, the event's INSERT and COMMIT as one
	// pipeline: one round trip.
	WriterPipelined = "pipelined"
	// WriterPgx is an ordinary transaction on a pgx.Tx: BEGIN, WriteTx,
	// COMMIT, three round trips (case suffix _pgx).
	WriterPgx = "pgx"
	// WriterSQL is the same on a *sql.Tx through outboxsql (suffix _sql).
	WriterSQL = "sql"
	// WriterOrderOnly is the baseline without an outbox: BEGIN, INSERT an
	// order, COMMIT on a pgx.Tx (case order_only). Nothing is delivered;
	// its latency is the transaction's own time, BEGIN to COMMIT's return.
	WriterOrderOnly = "order_only"
	// WriterWatermill is BEGIN, INSERT Watermill's outbox row, COMMIT on a
	// pgx.Tx (case watermill_row): the Go peer's write at the same rate.
	// Nothing relays it; its latency is the transaction's own time.
	WriterWatermill = "watermill_row"
)

// baselineWriter says the writer writes no event of the outbox: the cell
// measures the writers alone.
func baselineWriter(w string) bool { return w == WriterOrderOnly || w == WriterWatermill }

// plainCells returns the cells that run beside c with Config.PlainWrites.
func plainCells(c latencyCell) []latencyCell {
	long := ""
	if c.longTx {
		long = "_long_tx"
	}
	out := []latencyCell{}
	for _, w := range []string{WriterPgx, WriterSQL} {
		p := c
		p.name, p.writer = c.name+"_"+w, w
		out = append(out, p)
	}
	for _, w := range []string{WriterOrderOnly, WriterWatermill} {
		p := c
		p.name, p.writer = w+long, w
		out = append(out, p)
	}
	return out
}

// plainWriters are the tables and outboxes the writers of PlainWrites
// use.
type plainWriters struct {
	sqlDB  *sql.DB
	obSQL  *outbox.Outbox[*sql.Tx]
	orders string
	other  *otherRows
	// mu guards txTimes: the baseline cells' transactions, by when
	// COMMIT returned, and how long each took.
	txTimes []txTime
}

type txTime struct {
	at  time.Time
	dur time.Duration
}

// newPlainWriters creates the orders table and Watermill's table in the
// scenario's schema.
func (s *deliverSetup) newPlainWriters(ctx context.Context) (*plainWriters, error) {
	p := &plainWriters{orders: outboxdriver.QuoteIdent(s.table.Schema) + ".orders"}
	if _, err := s.pool.Exec(ctx, `CREATE TABLE `+p.orders+` (
    id bigserial PRIMARY KEY, customer text NOT NULL, total numeric NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fmt.Errorf("bench: create orders table: %w", err)
	}
	p.other = &otherRows{watermill: outboxdriver.QuoteIdent(s.table.Schema) + ".watermill"}
	if _, err := s.pool.Exec(ctx, fmt.Sprintf(watermillDDL, p.other.watermill)); err != nil {
		return nil, fmt.Errorf("bench: create Watermill's table: %w", err)
	}
	p.sqlDB = stdlib.OpenDBFromPool(s.pool)
	var err error
	if p.obSQL, err = outbox.New(outboxsql.New(p.sqlDB), &outbox.Config{Schema: s.table.Schema, Table: s.table.Name}); err != nil {
		p.sqlDB.Close()
		return nil, err
	}
	return p, nil
}

func (p *plainWriters) close() { p.sqlDB.Close() }

// writePlain commits ev (or, for a baseline writer, the writer's own row)
// in an ordinary transaction of writer w.
func (lt *latencyRun) writePlain(ctx context.Context, w string, ev outbox.Event) error {
	p := lt.plain
	switch w {
	case WriterPgx:
		return pgx.BeginFunc(ctx, lt.s.pool, func(tx pgx.Tx) error { return lt.ob.WriteTx(ctx, tx, ev) })
	case WriterSQL:
		tx, err := p.sqlDB.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() // a no-op after Commit
		if err := p.obSQL.WriteTx(ctx, tx, ev); err != nil {
			return err
		}
		return tx.Commit()
	}
	t0 := time.Now()
	err := pgx.BeginFunc(ctx, lt.s.pool, func(tx pgx.Tx) error {
		if w == WriterWatermill {
			return p.other.writeWatermill(ctx, tx, ev.Payload)
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+p.orders+` (customer, total) VALUES ($1, $2)`, ev.AggregateID, 42.5)
		return err
	})
	if err != nil {
		return err
	}
	now := time.Now()
	lt.mu.Lock()
	p.txTimes = append(p.txTimes, txTime{now, now.Sub(t0)})
	lt.mu.Unlock()
	return nil
}

// baselineRecorder returns the baseline cell's transaction times whose
// COMMIT returned in [from, to), and forgets them all.
func (lt *latencyRun) baselineRecorder(from, to time.Time) (*Recorder, int64) {
	rec := &Recorder{}
	var n int64
	lt.mu.Lock()
	defer lt.mu.Unlock()
	for _, t := range lt.plain.txTimes {
		if t.at.Before(from) || !t.at.Before(to) {
			continue
		}
		n++
		rec.Record(t.dur)
	}
	lt.plain.txTimes = nil
	return rec, n
}
