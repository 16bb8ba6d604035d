package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/contract"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxpgx"
)

// With a contract registry, WriteTx refuses an event that breaks its
// contract or holds a forbidden field, writing nothing of the call, and
// stores the contract's version as header eventVersion.
func TestWriteTxChecksContracts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	drv := outboxpgx.New(pool)
	if _, err := drv.Migrate(ctx, tb, nil); err != nil {
		t.Fatal(err)
	}
	reg, err := contract.Load("contract/testdata/orders")
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(drv, &outbox.Config{Schema: tb.Schema, Table: tb.Name, Contracts: reg})
	if err != nil {
		t.Fatal(err)
	}
	good := outbox.Event{AggregateType: "order", AggregateID: "1", Type: "OrderPlaced", Payload: []byte(`{"orderId": 1, "total": 5, "currency": "EUR"}`)}
	v1 := outbox.Event{AggregateType: "order", AggregateID: "2", Type: "OrderPlaced", Payload: []byte(`{"orderId": 2, "total": 5}`),
		Headers: map[string]string{outbox.VersionHeader: "1"}}
	bad := []outbox.Event{
		{AggregateType: "order", AggregateID: "3", Type: "OrderPlaced", Payload: []byte(`{"orderId": 3, "total": -1, "currency": "EUR"}`)},
		{AggregateType: "order", AggregateID: "3", Type: "OrderPlaced", Payload: []byte(`{"orderId": 3, "total": 1, "currency": "EUR", "card": {"token": "tok_live_1"}}`)},
		{AggregateType: "order", AggregateID: "3", Type: "OrderCancelled", Payload: []byte(`{}`)},
		{AggregateType: "order", AggregateID: "3", Type: "OrderPlaced", RawPayload: []byte(`abc`)},
		// Not JSON: with contracts, the check's own parse refuses it.
		{AggregateType: "order", AggregateID: "3", Type: "OrderPlaced", Payload: []byte(`{"orderId": 3, "total": 1,`)},
	}
	for i, b := range bad {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		err = ob.WriteTx(ctx, tx, good, b)
		if !errors.Is(err, outbox.ErrInvalidEvent) || !errors.Is(err, contract.ErrViolation) || !strings.Contains(err.Error(), "event 1") {
			t.Errorf("bad event %d: WriteTx: %v; want ErrInvalidEvent and ErrViolation about event 1", i, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+tb.Qualified("")).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d rows after refused writes, want none", n)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := ob.WriteTx(ctx, tx, good, v1); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT aggregateid, headers->>'eventVersion' FROM `+tb.Qualified("")+` ORDER BY aggregateid`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var id, v string
		if err := rows.Scan(&id, &v); err != nil {
			t.Fatal(err)
		}
		got = append(got, id+"=v"+v)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if strings.Join(got, " ") != "1=v2 2=v1" {
		t.Fatalf("stored versions %q, want 1=v2 (latest) and 2=v1 (given)", got)
	}
}
