package outboxpgx_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

// The writers' check reads one value for all the relays: a commit
// notifies while any of them is registered idle, and stops when the last
// one leaves, however their registrations and departures interleave.
func TestWakeupsLastWhileAnyRelayIsIdle(t *testing.T) {
	t.Parallel()
	pool, tb := setup(t)
	ob := newOutbox(t, tb)
	ctx := context.Background()
	conn := listen(t, pool, tb)
	a, b := newSourceWith(t, pool, tb, &outboxdriver.SourceConfig{RelayName: "relay-a"}), newSourceWith(t, pool, tb, &outboxdriver.SourceConfig{RelayName: "relay-b"})
	for _, s := range []outboxdriver.Source{a, b} {
		if err := s.SetIdle(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.SetIdle(ctx, 0); err != nil {
		t.Fatal(err)
	}
	write(t, pool, ob, true, ev("1", 1))
	if n := nextNotification(t, conn, "the notification of a commit while relay-b was still idle"); n.Payload != "" {
		t.Fatalf("payload %q, want none", n.Payload)
	}
	if err := b.SetIdle(ctx, 0); err != nil {
		t.Fatal(err)
	}
	write(t, pool, ob, true, ev("2", 1))
	expectMarker(t, pool, conn, tb, "after-both-left", "the commit made after both relays left the registry")

	// Eight relays join and leave at once, 40 times each; at the end only
	// relay-3 is registered. The writers' value must then be relay-3's
	// expiry, not a departed relay's or nothing.
	const relays, rounds = 8, 40
	srcs := make([]outboxdriver.Source, relays)
	for i := range srcs {
		srcs[i] = newSourceWith(t, pool, tb, &outboxdriver.SourceConfig{RelayName: fmt.Sprintf("relay-%d", i)})
	}
	var wg sync.WaitGroup
	errs := make(chan error, relays)
	for i, s := range srcs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				ttl := time.Duration(0)
				if r%2 == 0 || (i == 3 && r == rounds-1) {
					ttl = time.Hour
				}
				if err := s.SetIdle(ctx, ttl); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var awake, want int64
	if err := pool.QueryRow(ctx, `SELECT pg_sequence_last_value($1::regclass),
		(SELECT ceil(extract(epoch FROM expires_at) * 1000)::bigint FROM `+tb.Qualified("_wakeup")+` WHERE relay = 'relay-3')`,
		tb.Qualified("_awake")).Scan(&awake, &want); err != nil {
		t.Fatal(err)
	}
	if awake != want {
		t.Fatalf("the writers read %d, want relay-3's expiry %d", awake, want)
	}
	write(t, pool, ob, true, ev("3", 1))
	if n := nextNotification(t, conn, "the notification of a commit while relay-3 was idle"); n.Payload != "" {
		t.Fatalf("payload %q, want none", n.Payload)
	}
	if err := srcs[3].SetIdle(ctx, 0); err != nil {
		t.Fatal(err)
	}
	write(t, pool, ob, true, ev("4", 1))
	expectMarker(t, pool, conn, tb, "after-all-left", "the commit made after every relay left the registry")
}

// A relay that leaves while another's registration is not committed yet
// waits for it, and then counts it: the writers' value keeps the other
// relay's expiry rather than the departed one's "nobody".
func TestWakeupDepartureWaitsForARegistrationInFlight(t *testing.T) {
	t.Parallel()
	pool, tb := setup(t)
	ctx := context.Background()
	b := newSourceWith(t, pool, tb, &outboxdriver.SourceConfig{RelayName: "relay-b"})
	if err := b.SetIdle(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var want int64
	if err := tx.QueryRow(ctx, `INSERT INTO `+tb.Qualified("_wakeup")+` (relay, expires_at)
		VALUES ('relay-a', now() + interval '1 hour') RETURNING ceil(extract(epoch FROM expires_at) * 1000)::bigint`).Scan(&want); err != nil {
		t.Fatal(err)
	}
	left := make(chan error, 1)
	go func() { left <- b.SetIdle(ctx, 0) }()
	// relay-b's departure either waits on relay-a's registration or (the
	// defect) has already run without it.
	await.Eventually(t, 20*time.Second, func() error {
		select {
		case err := <-left:
			left <- err
			return nil
		default:
		}
		var waiting bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND objsubid = 1 AND (classid::bigint << 32 | objid::bigint) = hashtextextended($1, 0))`,
			"outbox.awake:"+tb.String()).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if !waiting {
			return errors.New("relay-b's departure neither returned nor waited")
		}
		return nil
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-left; err != nil {
		t.Fatal(err)
	}
	var awake int64
	if err := pool.QueryRow(ctx, `SELECT pg_sequence_last_value($1::regclass)`, tb.Qualified("_awake")).Scan(&awake); err != nil {
		t.Fatal(err)
	}
	if awake != want {
		t.Fatalf("the writers read %d after relay-b left, want relay-a's expiry %d", awake, want)
	}
}

// A writer needs nothing but INSERT on the outbox table: the notify
// trigger's check reads no table, and wakes an idle relay all the same.
// The relay's role needs no right on the sequence the check reads.
func TestWriterWithOnlyInsertWakesAnIdleRelay(t *testing.T) {
	t.Parallel()
	pool, tb := setup(t)
	ctx := context.Background()
	conn := listen(t, pool, tb)
	schema := outboxdriver.QuoteIdent(tb.Schema)
	_, relayPool := testenv.PoolAs(t, pool, "outbox_relay_role",
		`GRANT USAGE ON SCHEMA `+schema+` TO %s`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA `+schema+` TO %s`)
	_, writerPool := testenv.PoolAs(t, pool, "outbox_writer_role",
		`GRANT USAGE ON SCHEMA `+schema+` TO %s`,
		`GRANT INSERT ON `+tb.Qualified("")+` TO %s`)
	s, err := outboxpgx.New(relayPool).NewSource(tb, &outboxdriver.SourceConfig{RelayName: "limited"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.SetIdle(ctx, time.Minute); err != nil {
		t.Fatalf("a relay without rights on the sequence cannot register idle: %v", err)
	}
	if _, err := writerPool.Exec(ctx, `INSERT INTO `+tb.Qualified("")+` (id, aggregatetype, aggregateid, type, payload)
		VALUES (gen_random_uuid(), 'order', '1', 'OrderPlaced', '{}')`); err != nil {
		t.Fatalf("a writer with INSERT alone cannot write an event: %v", err)
	}
	if n := nextNotification(t, conn, "the notification of the limited writer's insert"); n.Payload != "" {
		t.Fatalf("payload %q, want none", n.Payload)
	}
	if err := s.SetIdle(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := writerPool.Exec(ctx, `INSERT INTO `+tb.Qualified("")+` (id, aggregatetype, aggregateid, type, payload)
		VALUES (gen_random_uuid(), 'order', '1', 'OrderPlaced', '{}')`); err != nil {
		t.Fatal(err)
	}
	expectMarker(t, pool, conn, tb, "after-limited-left", "the limited writer's insert after the relay left")
}
