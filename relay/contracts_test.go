package relay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/contract"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/relay"
)

// With contracts, the relay checks rows written by plain SQL: one that
// breaks its contract, names an unknown version, or has no contract is
// dead-lettered at once with cause "contract"; a valid one is published
// with header eventVersion, the given one or its contract's latest.
func TestRelayDeadLettersContractViolations(t *testing.T) {
	t.Parallel()
	reg, err := contract.Load("../contract/testdata/orders")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t)
	e.start(t, nil, relay.Config{Contracts: reg})
	bad := map[string]string{
		"00000000-0000-7000-8000-000000000001": "at /total: fails minimum",
		"00000000-0000-7000-8000-000000000002": "has no contract version 9",
		"00000000-0000-7000-8000-000000000003": "order/OrderShipped has no contract",
		"00000000-0000-7000-8000-000000000004": "holds card.token",
	}
	_, err = e.pool.Exec(context.Background(), `INSERT INTO `+e.table.Qualified("")+` (id, aggregatetype, aggregateid, type, payload, headers) VALUES
		('00000000-0000-7000-8000-000000000001', 'order', '1', 'OrderPlaced', '{"orderId": 1, "total": -5, "currency": "EUR"}', '{}'),
		('00000000-0000-7000-8000-000000000002', 'order', '2', 'OrderPlaced', '{"orderId": 2, "total": 5}', '{"eventVersion": "9"}'),
		('00000000-0000-7000-8000-000000000003', 'order', '3', 'OrderShipped', '{}', '{}'),
		('00000000-0000-7000-8000-000000000004', 'order', '4', 'OrderPlaced', '{"orderId": 4, "total": 5, "currency": "EUR", "card": {"token": "tok"}}', '{}'),
		('00000000-0000-7000-8000-000000000005', 'order', '5', 'OrderPlaced', '{"orderId": 5, "total": 5, "currency": "EUR"}', '{}'),
		('00000000-0000-7000-8000-000000000006', 'order', '6', 'OrderPlaced', '{"orderId": 6, "total": 5}', '{"eventVersion": "1"}')`)
	if err != nil {
		t.Fatal(err)
	}
	for id, dl := range e.waitDeadLetters(t, len(bad)) {
		want := bad[id]
		if want == "" || !strings.HasPrefix(dl.lastErr, relay.CauseContract+": ") || !strings.Contains(dl.lastErr, want) || dl.attempts != 1 {
			t.Errorf("dead letter %s: attempts %d, last_error %q; want 1 attempt and cause contract saying %q", id, dl.attempts, dl.lastErr, want)
		}
	}
	versions := map[string]string{}
	for _, m := range testenv.StreamMessages(t, e.stream) {
		versions[m.Header.Get("id")] = m.Header.Get(contract.VersionHeader)
	}
	want := map[string]string{"00000000-0000-7000-8000-000000000005": "2", "00000000-0000-7000-8000-000000000006": "1"}
	if len(versions) != len(want) {
		t.Fatalf("published %v, want %v", versions, want)
	}
	for id, v := range want {
		if versions[id] != v {
			t.Errorf("event %s published with eventVersion %q, want %q", id, versions[id], v)
		}
	}
}

type deadLetterRow struct {
	attempts int
	lastErr  string
}

// waitDeadLetters polls until the backlog is empty and n events are
// dead-lettered, and returns the dead letters by id.
func (e *env) waitDeadLetters(t *testing.T, n int) map[string]deadLetterRow {
	t.Helper()
	await.Eventually(t, 30*time.Second, func() error {
		if st := e.status(t); st.Backlog != 0 || st.DeadLetters != int64(n) {
			return fmt.Errorf("backlog %d, dead letters %d; want 0 and %d", st.Backlog, st.DeadLetters, n)
		}
		return nil
	})
	rows, err := e.pool.Query(context.Background(), `SELECT id::text, attempts, last_error FROM `+e.table.Qualified("_dead_letter"))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]deadLetterRow{}
	for rows.Next() {
		var id string
		var dl deadLetterRow
		if err := rows.Scan(&id, &dl.attempts, &dl.lastErr); err != nil {
			t.Fatal(err)
		}
		out[id] = dl
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// A paused destination's event is left untouched even when its contract
// would refuse it: no attempt, no dead letter until the pause is lifted;
// events of other scopes are handled meanwhile.
func TestPausedDestinationKeepsContractViolation(t *testing.T) {
	t.Parallel()
	reg, err := contract.Load("../contract/testdata/orders")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t)
	drv := outboxpgx.New(e.pool)
	by := outboxdriver.Acting{Name: "test", Role: "operator", Reason: "receiver maintenance"}
	scope := outboxdriver.PauseScope{Kind: outboxdriver.PauseDestination, Value: e.prefix + ".order"}
	if ok, err := drv.SetPause(context.Background(), e.table, scope, by); err != nil || !ok {
		t.Fatalf("pause: %v, %v", ok, err)
	}
	const bad, other = "00000000-0000-7000-8000-000000000001", "00000000-0000-7000-8000-000000000002"
	// The bad order first, then an invoice that has no contract: once the
	// invoice is dead-lettered, the relay has seen the order.
	_, err = e.pool.Exec(context.Background(), `INSERT INTO `+e.table.Qualified("")+` (id, aggregatetype, aggregateid, type, payload, headers) VALUES
		('`+bad+`', 'order', '1', 'OrderPlaced', '{"orderId": 1, "total": -5, "currency": "EUR"}', '{}')`)
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.pool.Exec(context.Background(), `INSERT INTO `+e.table.Qualified("")+` (id, aggregatetype, aggregateid, type, payload, headers) VALUES
		('`+other+`', 'invoice', '1', 'InvoiceSent', '{}', '{}')`)
	if err != nil {
		t.Fatal(err)
	}
	e.start(t, nil, relay.Config{Contracts: reg, PollInterval: 100 * time.Millisecond})
	await.Eventually(t, 30*time.Second, func() error {
		if e.status(t).DeadLetters == 0 {
			return errors.New("the invoice without a contract was not dead-lettered")
		}
		return nil
	})
	var attempts int
	if err := e.pool.QueryRow(context.Background(), `SELECT attempts FROM `+e.table.Qualified("")+` WHERE id = $1`, bad).Scan(&attempts); err != nil || attempts != 0 {
		t.Fatalf("the paused order: attempts %d, %v; want still in the outbox with no attempt", attempts, err)
	}
	if n := e.status(t).DeadLetters; n != 1 {
		t.Fatalf("%d dead letters while the order's destination is paused, want 1 (the invoice)", n)
	}
	if ok, err := drv.LiftPause(context.Background(), e.table, scope, by); err != nil || !ok {
		t.Fatalf("resume: %v, %v", ok, err)
	}
	dls := e.waitDeadLetters(t, 2)
	if dl := dls[bad]; !strings.HasPrefix(dl.lastErr, relay.CauseContract+": ") || dl.attempts != 1 {
		t.Fatalf("the order after resume: %+v, want dead-lettered for its contract", dl)
	}
}
