// Command orders-billing is a runnable example of the outbox and the inbox
// working together, against a local PostgreSQL and NATS JetStream:
//
//	go run ./examples/orders-billing --orders 200
//
// An orders service commits each order with an OrderPlaced event written
// through the outbox in the same transaction. A relay, embedded in the
// process, publishes the events to JetStream. A billing service consumes
// them with natsconsumer and the inbox: it creates the order's invoice in
// the same transaction as the inbox's record of the event, and writes an
// InvoiceCreated event through the outbox in that transaction too, so the
// chain goes on exactly once per order. To show the inbox at work, a share
// of the events (--redeliver, percent) is published a second time, as a
// relay that crashed after publishing and before recording it would.
//
// It prints a short report and exits 0 only if every order has exactly one
// invoice. Everything lives in its own schema (--schema) and stream
// (--stream); it migrates what it needs at start.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/inbox/inboxpgx"
	"github.com/outboxkit/outbox/inbox/natsconsumer"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/route"
	"github.com/outboxkit/outbox/sink/natssink"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// options are the command's flags.
type options struct {
	db, nats, schema, stream string
	orders, redeliver        int
	timeout                  time.Duration
	verbose                  bool
}

// run runs the example and returns the exit code: 0 when every order has
// exactly one invoice, 1 when not (or on a failure), 2 for bad flags.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var o options
	fs := flag.NewFlagSet("orders-billing", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.db, "db", "postgres://postgres@127.0.0.1:5432/test", "PostgreSQL URL")
	fs.StringVar(&o.nats, "nats", "nats://127.0.0.1:4222", "NATS URL (JetStream enabled)")
	fs.IntVar(&o.orders, "orders", 100, "orders to place")
	fs.IntVar(&o.redeliver, "redeliver", 10, "percent of the events published a second time")
	fs.StringVar(&o.schema, "schema", "orders_billing", "schema of the example's tables")
	fs.StringVar(&o.stream, "stream", "ORDERS_BILLING", "JetStream stream; its subjects are <stream in lower case>.>")
	fs.DurationVar(&o.timeout, "timeout", 2*time.Minute, "longest wait for the invoices")
	fs.BoolVar(&o.verbose, "v", false, "log what the relay and the consumer do")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "orders-billing: unexpected argument %q\n", fs.Arg(0))
		return 2
	case o.orders < 1:
		fmt.Fprintf(stderr, "orders-billing: --orders %d: place at least one\n", o.orders)
		return 2
	case o.redeliver < 0 || o.redeliver > 100:
		fmt.Fprintf(stderr, "orders-billing: --redeliver %d: a percentage from 0 to 100\n", o.redeliver)
		return 2
	case strings.ContainsAny(o.stream, ".*>/\\ \t\r\n") || o.stream == "":
		fmt.Fprintf(stderr, "orders-billing: --stream %q: a stream name without '.', '*', '>', '/', '\\' or whitespace\n", o.stream)
		return 2
	}
	if err := (outboxdriver.Table{Schema: o.schema, Name: "outbox"}).Validate(); err != nil {
		fmt.Fprintf(stderr, "orders-billing: --schema: %v\n", err)
		return 2
	}
	rep, err := example(ctx, o, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "orders-billing: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "orders:                 %d\n", rep.orders)
	fmt.Fprintf(stdout, "invoices:               %d\n", rep.invoices)
	fmt.Fprintf(stdout, "orders invoiced twice:  %d\n", rep.doubled)
	fmt.Fprintf(stdout, "duplicates suppressed:  %d\n", rep.duplicates)
	fmt.Fprintf(stdout, "outbox backlog:         %d\n", rep.backlog)
	if rep.invoices != rep.orders || rep.doubled != 0 {
		fmt.Fprintln(stdout, "FAIL: not exactly one invoice per order")
		return 1
	}
	fmt.Fprintln(stdout, "OK: exactly one invoice per order")
	return 0
}

// report is what a run found.
type report struct {
	orders, invoices, doubled int
	duplicates                int64
	backlog                   int64
}

// duplicates counts the events the inbox suppressed.
type duplicates struct{ n atomic.Int64 }

func (d *duplicates) Handled(_ string, o inbox.Outcome, _ time.Duration) {
	if o == inbox.Duplicate {
		d.n.Add(1)
	}
}

// orderPlaced is the OrderPlaced event's payload.
type orderPlaced struct {
	OrderID string `json:"order_id"`
	Amount  int64  `json:"amount_cents"`
}

func example(ctx context.Context, o options, stderr io.Writer) (rep report, err error) {
	log := slog.New(slog.DiscardHandler)
	if o.verbose {
		log = slog.New(slog.NewTextHandler(stderr, nil))
	}
	prefix := strings.ToLower(o.stream)
	schema := outboxdriver.QuoteIdent(o.schema)

	pool, err := pgxpool.New(ctx, o.db)
	if err != nil {
		return rep, fmt.Errorf("--db: %w", err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return rep, fmt.Errorf("cannot reach PostgreSQL: %w", err)
	}
	nc, err := nats.Connect(o.nats, nats.Timeout(5*time.Second))
	if err != nil {
		return rep, fmt.Errorf("cannot reach NATS at %s: %w", o.nats, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return rep, err
	}

	// Migrate: the outbox, the inbox, and the services' own tables.
	obTable := outboxdriver.Table{Schema: o.schema, Name: "outbox"}
	if _, err := outboxpgx.New(pool).Migrate(ctx, obTable, nil); err != nil {
		return rep, err
	}
	if _, err := inboxpgx.Migrate(ctx, pool, outboxdriver.Table{Schema: o.schema, Name: inbox.DefaultTable}); err != nil {
		return rep, err
	}
	if _, err := pool.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS `+schema+`.orders (id uuid PRIMARY KEY, run uuid NOT NULL, amount_cents bigint NOT NULL);
		CREATE TABLE IF NOT EXISTS `+schema+`.invoices (id bigserial PRIMARY KEY, order_id uuid NOT NULL, amount_cents bigint NOT NULL);
		CREATE INDEX IF NOT EXISTS invoices_order_id ON `+schema+`.invoices (order_id)`); err != nil {
		return rep, err
	}
	ob, err := outbox.New(outboxpgx.New(pool), &outbox.Config{Schema: obTable.Schema, Table: obTable.Name})
	if err != nil {
		return rep, err
	}

	// The relay: outbox -> JetStream, subjects <prefix>.<aggregatetype>.
	snk, err := natssink.New(js, &natssink.Config{Stream: o.stream, Subjects: []string{prefix + ".>"}, Logger: log})
	if err != nil {
		return rep, err
	}
	if err := snk.EnsureStream(ctx); err != nil {
		return rep, err
	}
	router, err := route.New(&route.Config{Replacement: prefix + ".${routedByValue}"})
	if err != nil {
		return rep, err
	}
	src, err := outboxpgx.New(pool).NewSource(obTable, nil)
	if err != nil {
		return rep, err
	}
	defer src.Close()
	r, err := relay.New(src, snk, &relay.Config{Router: router, PollInterval: 100 * time.Millisecond, Logger: log})
	if err != nil {
		return rep, err
	}
	if err := r.Start(ctx); err != nil {
		return rep, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = r.Stop(sctx)
	}()

	// The billing service: one invoice per OrderPlaced, and an
	// InvoiceCreated event, in the inbox's transaction.
	var dups duplicates
	ib, err := inbox.New(inboxpgx.New(pool), &inbox.Config{Consumer: "billing", Schema: o.schema, Metrics: &dups})
	if err != nil {
		return rep, err
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, o.stream, natsconsumer.ConsumerConfig("billing", prefix+".order"))
	if err != nil {
		return rep, fmt.Errorf("create the billing consumer: %w", err)
	}
	bill := func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		var ev orderPlaced
		if err := json.Unmarshal(msg.Payload, &ev); err != nil {
			return consumer.Permanent(fmt.Errorf("OrderPlaced payload does not decode: %w", err))
		}
		if ev.OrderID == "" {
			return consumer.Permanent(errors.New("OrderPlaced payload has no order_id"))
		}
		var invoice int64
		if err := tx.QueryRow(ctx, `INSERT INTO `+schema+`.invoices (order_id, amount_cents) VALUES ($1, $2) RETURNING id`,
			ev.OrderID, ev.Amount).Scan(&invoice); err != nil {
			return err
		}
		payload, _ := json.Marshal(map[string]any{"invoice_id": invoice, "order_id": ev.OrderID, "amount_cents": ev.Amount})
		return ob.WriteTx(ctx, tx, outbox.Event{AggregateType: "invoice", AggregateID: fmt.Sprint(invoice), Type: "InvoiceCreated", Payload: payload})
	}
	billing, err := natsconsumer.New(cons, ib, bill, &natsconsumer.Config{Config: consumer.Config{Logger: log}})
	if err != nil {
		return rep, err
	}
	if err := billing.Start(ctx); err != nil {
		return rep, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = billing.Stop(sctx)
	}()

	// The orders service: each order and its OrderPlaced event commit
	// together, from four concurrent writers.
	runID := uuid.New()
	events := make([]outbox.Event, o.orders)
	for i := range events {
		ev := orderPlaced{OrderID: uuid.NewString(), Amount: int64(100 + rand.IntN(100000))}
		payload, _ := json.Marshal(ev)
		events[i] = outbox.Event{ID: uuid.Must(uuid.NewV7()).String(), AggregateType: "order", AggregateID: ev.OrderID,
			Type: "OrderPlaced", Payload: payload}
	}
	var (
		wg    sync.WaitGroup
		next  atomic.Int64
		werrs = make(chan error, 4)
	)
	for range 4 {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(events); i = int(next.Add(1) - 1) {
				ev := events[i]
				var p orderPlaced
				_ = json.Unmarshal(ev.Payload, &p)
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.orders (id, run, amount_cents) VALUES ($1, $2, $3)`, p.OrderID, runID, p.Amount); err != nil {
						return err
					}
					return ob.WriteTx(ctx, tx, ev)
				})
				if err != nil {
					werrs <- fmt.Errorf("place order: %w", err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(werrs)
	if err := <-werrs; err != nil {
		return rep, err
	}

	// At least once: publish a share of the events again with the same id
	// and no Nats-Msg-Id, as a relay that crashed after publishing and
	// before recording would (after JetStream's de-duplication window).
	copies := int64(len(events) * o.redeliver / 100)
	for i := range copies {
		ev := events[int(i)*len(events)/int(copies)]
		m := nats.NewMsg(prefix + ".order")
		m.Header.Set(inbox.HeaderID, ev.ID)
		m.Header.Set(inbox.HeaderKey, ev.AggregateID)
		m.Data = ev.Payload
		if _, err := js.PublishMsg(ctx, m); err != nil {
			return rep, fmt.Errorf("publish a copy: %w", err)
		}
	}

	// Wait for the billing service and the relay to catch up.
	deadline := time.Now().Add(o.timeout)
	for {
		if err := count(ctx, pool, schema, runID, &rep); err != nil {
			return rep, err
		}
		st, err := outboxpgx.New(pool).Status(ctx, obTable)
		if err != nil {
			return rep, err
		}
		rep.backlog = st.Backlog
		rep.duplicates = dups.n.Load()
		if rep.invoices >= rep.orders && rep.duplicates >= copies && rep.backlog == 0 {
			return rep, nil
		}
		if time.Now().After(deadline) {
			return rep, fmt.Errorf("after %s: %d of %d orders invoiced, %d of %d copies suppressed, backlog %d",
				o.timeout, rep.invoices, rep.orders, rep.duplicates, copies, rep.backlog)
		}
		select {
		case <-ctx.Done():
			return rep, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// count fills in the orders of this run, their invoices, and the orders
// invoiced more than once.
func count(ctx context.Context, pool *pgxpool.Pool, schema string, run uuid.UUID, rep *report) error {
	err := pool.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM `+schema+`.orders WHERE run = $1),
		       count(i.id),
		       (SELECT count(*) FROM (SELECT i2.order_id FROM `+schema+`.invoices i2
		                              JOIN `+schema+`.orders o2 ON o2.id = i2.order_id AND o2.run = $1
		                              GROUP BY i2.order_id HAVING count(*) > 1) d)
		FROM `+schema+`.invoices i JOIN `+schema+`.orders o ON o.id = i.order_id AND o.run = $1`, run).
		Scan(&rep.orders, &rep.invoices, &rep.doubled)
	if err != nil {
		return fmt.Errorf("count invoices: %w", err)
	}
	return nil
}
