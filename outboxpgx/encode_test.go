package outboxpgx

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Every argument of every form of the write path's INSERT must encode in
// the format pgx tries first. pgx falls back to the other format when the
// first fails, but only after it has built an error (its message prints the
// whole argument): for a []string sent as a uuid[] that was every
// multi-row write. The test encodes each argument as pgx's extended
// protocol does first, with the parameter types the server reports.
func TestWriteArgumentsEncodeInTheirFirstFormat(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	if _, err := New(pool).Migrate(ctx, tb, nil); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	rows := func(n int, delayed bool) []outboxdriver.Row {
		rs := make([]outboxdriver.Row, n)
		for i := range rs {
			rs[i] = outboxdriver.Row{ID: uuid.NewString(), AggregateType: "order", AggregateID: "1", Type: "Placed",
				Payload: []byte(`{"n":1}`), Headers: []byte(`{"h":"v"}`)}
			if delayed {
				rs[i].DeliverAt = time.Now().Add(time.Hour)
			}
		}
		return rs
	}
	forms := []struct {
		name string
		d    *Driver
		rows []outboxdriver.Row
	}{
		{"one row", New(pool, WithoutWakeups()), rows(1, false)},
		{"several rows", New(pool, WithoutWakeups()), rows(10, false)},
		{"several rows, delayed", New(pool, WithoutWakeups()), rows(10, true)},
		{"insert-delete", New(pool, WithInsertDelete()), rows(10, false)},
	}
	m := conn.Conn().TypeMap()
	for _, f := range forms {
		sql, args := f.d.statement(tb, f.rows)
		sd, err := conn.Conn().Prepare(ctx, "", sql)
		if err != nil {
			t.Fatalf("%s: prepare: %v", f.name, err)
		}
		for i, a := range args {
			oid := sd.ParamOIDs[i]
			format := m.FormatCodeForOID(oid)
			switch a.(type) {
			case string, *string: // what pgx's ExtendedQueryBuilder picks first
				format = pgtype.TextFormatCode
			}
			if _, err := m.Encode(oid, format, a, nil); err != nil {
				t.Errorf("%s: argument $%d (%T) does not encode in its first format: %v", f.name, i+1, a, err)
			}
		}
	}
}
