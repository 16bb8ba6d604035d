package natsconsumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/inbox/inboxpgx"
	"github.com/outboxkit/outbox/inbox/natsconsumer"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Environment of a consumer process the tests start (see TestMain).
const (
	envChild    = "NATSCONSUMER_TEST_CHILD"
	envSchema   = "NATSCONSUMER_TEST_SCHEMA"
	envStream   = "NATSCONSUMER_TEST_STREAM"
	envDurable  = "NATSCONSUMER_TEST_DURABLE"
	envConsumer = "NATSCONSUMER_TEST_CONSUMER"
	// envFault makes the process SIGKILL itself: "before-commit" inside
	// the first handler's transaction after its write, "after-commit"
	// right after the first commit (before the acknowledgement), "chaos"
	// after a commit now and then.
	envFault = "NATSCONSUMER_TEST_FAULT"
)

func TestMain(m *testing.M) {
	if os.Getenv(envChild) != "" {
		os.Exit(child())
	}
	goleak.VerifyTestMain(m)
}

// fixture is an inbox table and an effects table in a fresh schema, and a
// stream of the test's own.
type fixture struct {
	pool   *pgxpool.Pool
	tbl    outboxdriver.Table
	nc     *nats.Conn
	js     jetstream.JetStream
	stream string // also the subject prefix
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	tbl.Name = "inbox"
	ctx := testenv.Context(t, 30*time.Second)
	if _, err := inboxpgx.Migrate(ctx, pool, tbl); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+effectsTable(tbl.Schema)+` (seq bigserial PRIMARY KEY, consumer text NOT NULL, event_id text NOT NULL, agg text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	nc, js := testenv.JetStream(t)
	_, prefix := testenv.Stream(t, js)
	return &fixture{pool: pool, tbl: tbl, nc: nc, js: js, stream: prefix}
}

func effectsTable(schema string) string { return outboxdriver.QuoteIdent(schema) + ".effects" }

// durable creates a durable consumer on the fixture's stream.
func (f *fixture) durable(t *testing.T, name string, ackWait time.Duration) jetstream.Consumer {
	t.Helper()
	cc := natsconsumer.ConsumerConfig(name, f.stream+".>")
	if ackWait > 0 {
		cc.AckWait = ackWait
	}
	cons, err := f.js.CreateOrUpdateConsumer(testenv.Context(t, 10*time.Second), f.stream, cc)
	if err != nil {
		t.Fatal(err)
	}
	return cons
}

func (f *fixture) inbox(t *testing.T, name string, m inbox.Metrics) *inbox.Inbox[pgx.Tx] {
	t.Helper()
	ib, err := inbox.New(inboxpgx.New(f.pool), &inbox.Config{Consumer: name, Schema: f.tbl.Schema, Table: f.tbl.Name, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	return ib
}

// handler records one effect per handled message; a payload that is not a
// JSON object is a permanent error.
func handler(schema, name string) consumer.Handler[pgx.Tx] {
	return func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		var body map[string]any
		if err := json.Unmarshal(msg.Payload, &body); err != nil {
			return consumer.Permanent(fmt.Errorf("payload does not decode: %w", err))
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+effectsTable(schema)+` (consumer, event_id, agg) VALUES ($1, $2, $3)`,
			name, strings.ToLower(msg.EventID), msg.AggregateID)
		return err
	}
}

// start starts a Consumer that the test stops when it ends.
func start(t *testing.T, cons jetstream.Consumer, ib *inbox.Inbox[pgx.Tx], h consumer.Handler[pgx.Tx], cfg *natsconsumer.Config) *natsconsumer.Consumer[pgx.Tx] {
	t.Helper()
	c, err := natsconsumer.New(cons, ib, h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(testenv.Context(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return c
}

// publish sends a message as natssink does. With dedupe false it leaves out
// Nats-Msg-Id, so that the stream keeps a second copy of the same event.
func (f *fixture) publish(t *testing.T, aggType, id, key string, payload []byte, dedupe bool) {
	t.Helper()
	m := nats.NewMsg(f.stream + "." + aggType)
	if id != "" {
		m.Header.Set(inbox.HeaderID, id)
		if dedupe {
			m.Header.Set(jetstream.MsgIDHeader, id)
		}
	}
	if key != "" {
		m.Header.Set(inbox.HeaderKey, key)
	}
	m.Data = payload
	if _, err := f.js.PublishMsg(testenv.Context(t, 10*time.Second), m); err != nil {
		t.Fatal(err)
	}
}

// effects returns the number of effects per event id of consumer name.
func (f *fixture) effects(t *testing.T, name string) map[string]int {
	t.Helper()
	rows, err := f.pool.Query(testenv.Context(t, 10*time.Second),
		`SELECT event_id, count(*) FROM `+effectsTable(f.tbl.Schema)+` WHERE consumer = $1 GROUP BY event_id`, name)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		out[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// drained is a condition for testenv.Eventually: cons has nothing left to
// deliver or to be acked.
func drained(t *testing.T, cons jetstream.Consumer) func() error {
	return func() error {
		info, err := cons.Info(testenv.Context(t, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if info.NumPending != 0 || info.NumAckPending != 0 || info.NumRedelivered != 0 {
			return fmt.Errorf("consumer %s: %d pending, %d unacknowledged, %d redelivered", info.Name, info.NumPending, info.NumAckPending, info.NumRedelivered)
		}
		return nil
	}
}

// counts counts the inbox's outcomes.
type counts struct{ n [5]atomic.Int64 }

func (c *counts) Handled(_ string, o inbox.Outcome, _ time.Duration) {
	if int(o) < len(c.n) {
		c.n[o].Add(1)
	}
}

func (c *counts) get(o inbox.Outcome) int64 { return c.n[o].Load() }

// child runs a consumer process: see the env constants.
func child() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	schema, name, fault := os.Getenv(envSchema), os.Getenv(envConsumer), os.Getenv(envFault)
	pool, err := pgxpool.New(ctx, testenv.DatabaseURL())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer pool.Close()
	nc, err := nats.Connect(testenv.NATSURL())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cons, err := js.Consumer(ctx, os.Getenv(envStream), os.Getenv(envDurable))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var m counts
	ib, err := inbox.New(inboxpgx.New(pool), &inbox.Config{Consumer: name, Schema: schema, Table: "inbox", Metrics: &m})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	kill := func() { _ = syscall.Kill(os.Getpid(), syscall.SIGKILL) }
	h := handler(schema, name)
	cfg := &natsconsumer.Config{Config: consumer.Config{RetryBase: 50 * time.Millisecond, RetryMax: time.Second}}
	switch fault {
	case "before-commit":
		inner := h
		h = func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
			if err := inner(ctx, tx, msg); err != nil {
				return err
			}
			kill() // the effect is written, the transaction not committed
			return nil
		}
	case "after-commit":
		cfg.OnStage = func(s consumer.Stage, _ inbox.Message) {
			if s == consumer.StageHandled {
				kill() // committed, not acknowledged
			}
		}
	case "chaos":
		cfg.OnStage = func(s consumer.Stage, _ inbox.Message) {
			if s == consumer.StageHandled && rand.IntN(50) == 0 {
				kill()
			}
		}
	case "":
	default:
		fmt.Fprintln(os.Stderr, "unknown fault", fault)
		return 2
	}
	c, err := natsconsumer.New(cons, ib, h, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if err := c.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println("ready")
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Stop(sctx); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("processed=%d duplicate=%d\n", m.get(inbox.Processed), m.get(inbox.Duplicate))
	return 0
}
