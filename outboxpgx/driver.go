// Package outboxpgx is the PostgreSQL driver of the outbox on pgx v5: it
// writes events inside a pgx.Tx, migrates the schema, and is the relay's
// Source (claim with FOR UPDATE SKIP LOCKED, wake-up by LISTEN/NOTIFY).
package outboxpgx

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Driver writes events through pgx. The zero value is not usable; call New.
type Driver struct {
	mu    sync.Mutex
	multi map[outboxdriver.Table]string
	one   map[outboxdriver.Table]string
}

// New returns a Driver. It holds no connection: WriteTx uses the caller's
// transaction.
func New() *Driver {
	return &Driver{multi: map[outboxdriver.Table]string{}, one: map[outboxdriver.Table]string{}}
}

var _ outboxdriver.Writer[pgx.Tx] = (*Driver)(nil)

const insertCols = `(id, aggregatetype, aggregateid, type, payload, payload_raw, headers, tracingspancontext)`

// insertOneSQL and insertManySQL are cached per table: pgx prepares each
// once per connection, so an insert costs no parse or plan.
func (d *Driver) sql(t outboxdriver.Table, n int) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if n == 1 {
		s, ok := d.one[t]
		if !ok {
			s = `INSERT INTO ` + pgschema.NamesOf(t).Table + ` ` + insertCols + `
VALUES ($1::uuid, $2, $3, $4, $5::jsonb, $6, coalesce($7::jsonb, '{}'::jsonb), $8)`
			d.one[t] = s
		}
		return s
	}
	s, ok := d.multi[t]
	if !ok {
		s = `INSERT INTO ` + pgschema.NamesOf(t).Table + ` ` + insertCols + `
SELECT u.id, u.at, u.aid, u.ty, u.p::jsonb, u.raw, coalesce(u.h::jsonb, '{}'::jsonb), u.tc
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::text[], $8::text[])
  AS u(id, at, aid, ty, p, raw, h, tc)`
		d.multi[t] = s
	}
	return s
}

// InsertTx inserts rows within tx in one round trip: one VALUES row for a
// single event, unnest over arrays for several.
func (d *Driver) InsertTx(ctx context.Context, tx pgx.Tx, t outboxdriver.Table, rows []outboxdriver.Row) error {
	if tx == nil {
		return fmt.Errorf("transaction is nil")
	}
	sql, args := d.Statement(t, rows)
	_, err := tx.Exec(ctx, sql, args...)
	return err
}

// Statement returns the INSERT statement and its arguments for rows, for
// callers that queue it themselves (in a pgx.Batch sent with COMMIT, say).
func (d *Driver) Statement(t outboxdriver.Table, rows []outboxdriver.Row) (string, []any) {
	if len(rows) == 1 {
		r := rows[0]
		return d.sql(t, 1), []any{r.ID, r.AggregateType, r.AggregateID, r.Type, text(r.Payload), r.RawPayload, text(r.Headers), text([]byte(r.TraceContext))}
	}
	n := len(rows)
	ids, ats, aids, tys := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	ps, hs, tcs := make([]*string, n), make([]*string, n), make([]*string, n)
	raws := make([][]byte, n)
	for i, r := range rows {
		ids[i], ats[i], aids[i], tys[i] = r.ID, r.AggregateType, r.AggregateID, r.Type
		ps[i], raws[i], hs[i], tcs[i] = text(r.Payload), r.RawPayload, text(r.Headers), text([]byte(r.TraceContext))
	}
	return d.sql(t, n), []any{ids, ats, aids, tys, ps, raws, hs, tcs}
}

// Queue validates events and queues their INSERT on b, the pgx.Batch that
// carries the business statements of the same transaction: the events cost
// no round trip of their own. Send b inside the transaction
// (tx.SendBatch) and commit as usual; the events exist for the relay if and
// only if that transaction commits. ob must write through this Driver's
// table; on an invalid event nothing is queued and the error wraps
// outbox.ErrInvalidEvent.
func (d *Driver) Queue(ctx context.Context, b *pgx.Batch, ob *outbox.Outbox[pgx.Tx], events ...outbox.Event) error {
	if len(events) == 0 {
		return nil
	}
	rows, err := ob.Rows(ctx, events...)
	if err != nil {
		return err
	}
	sql, args := d.Statement(ob.Table(), rows)
	b.Queue(sql, args...)
	return nil
}

// text maps nil or empty to SQL NULL.
func text(b []byte) *string {
	if len(b) == 0 {
		return nil
	}
	s := string(b)
	return &s
}
