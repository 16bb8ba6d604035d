package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxsql"
)

// The cases of the write scenario, in the order they are measured at each
// writer count.
const (
	// CaseBaseline is the business transaction alone: BEGIN; INSERT an
	// order; COMMIT.
	CaseBaseline = "baseline"
	// CaseRoundTrip adds one statement that writes nothing: SELECT
	// length($1) of the event's payload, sent with the extended protocol
	// as WriteTx sends its INSERT. It is the floor of anything that costs
	// a round trip of its own: what is left between it and the baseline is
	// the round trip, not the row.
	CaseRoundTrip = "round_trip"
	// CasePlainInsert adds one plain INSERT of a uuid and a jsonb payload
	// into a table with nothing but a primary key: one more statement and
	// round trip, the floor of any approach that writes its event with a
	// statement of its own.
	CasePlainInsert = "plain_insert"
	// CaseOutbox adds one event through WriteTx, with the notify trigger
	// in place (outbox migrate --wakeups trigger) but no relay registered
	// idle, so no NOTIFY.
	CaseOutbox = "outbox"
	// CaseOutboxQueue adds one event queued with outboxpgx.Driver.Queue in
	// the pgx.Batch that carries the order's INSERT, sent with
	// tx.SendBatch: no round trip of its own. The event's aggregate id
	// cannot come from the order's RETURNING id inside the same batch, so
	// this case generates the order id in the client and inserts it
	// explicitly (no RETURNING). Trigger on, no relay idle.
	CaseOutboxQueue = "outbox_queue"
	// CaseOutboxCommit adds one event to an outboxpgx.Tx, whose Commit
	// sends the events' INSERT with the COMMIT: no round trip of its own,
	// and the event names the order by the id its INSERT returned, as in
	// CaseOutbox. Trigger on, no relay idle.
	CaseOutboxCommit = "outbox_commit"
	// CaseOutboxNotify is CaseOutbox with a relay registered idle for the
	// whole run, so that every commit sends a NOTIFY: the worst case of
	// notifying on every commit.
	CaseOutboxNotify = "outbox_notify"
	// CaseOutboxNoTrigger is CaseOutbox on the default table (schema
	// version 26 on: no notify trigger, the writers wake relays, as with
	// --wakeups writers): the writers keep a view of whether a relay
	// waits instead (none does), so compared with CaseOutbox, the cost of
	// the trigger's check against that of the writers' view.
	CaseOutboxNoTrigger = "outbox_no_trigger"
	// CaseOutbox10 adds ten events in one WriteTx, trigger in place, no
	// relay idle.
	CaseOutbox10 = "outbox_10_events"
	// CaseOutboxMessage adds one event through WriteTx as a logical
	// decoding message (outboxpgx.WithMessages; WriteModeMessage): one WAL
	// record, no row.
	CaseOutboxMessage = "outbox_message"
	// CaseOutboxMessageQueue is CaseOutboxMessage through Driver.Queue in
	// the order's pgx.Batch, and CaseOutboxMessageCommit through an
	// outboxpgx.Tx (the message goes with the COMMIT): the message without
	// a round trip of its own.
	CaseOutboxMessageQueue  = "outbox_message_queue"
	CaseOutboxMessageCommit = "outbox_message_commit"
	// CaseOutboxInsertDelete adds one event through WriteTx inserted and
	// deleted again in the same statement (outboxpgx.WithInsertDelete;
	// WriteModeInsertDelete).
	CaseOutboxInsertDelete = "outbox_insert_delete"
	// CaseOutboxInsertDeleteQueue is CaseOutboxInsertDelete through
	// Driver.Queue in the order's pgx.Batch, and
	// CaseOutboxInsertDeleteCommit through an outboxpgx.Tx (sent with the
	// COMMIT): without a round trip of its own. CasePlainInsertQueue is
	// their floor: CasePlainInsert's row in the order's pgx.Batch.
	CaseOutboxInsertDeleteQueue  = "outbox_insert_delete_queue"
	CaseOutboxInsertDeleteCommit = "outbox_insert_delete_commit"
	CasePlainInsertQueue         = "plain_insert_queue"
	// CaseBaselineSQL is CaseBaseline through database/sql (*sql.Tx on
	// pgx's stdlib driver; WriteModeSQL).
	CaseBaselineSQL = "baseline_sql"
	// CaseOutboxSQL is CaseOutboxNoTrigger through database/sql: WriteTx
	// on a *sql.Tx (outboxsql; WriteModeSQL) into the default table.
	CaseOutboxSQL = "outbox_sql"
)

// The write paths Config.WriteModes adds to the write scenario.
const (
	WriteModeMessage      = "message"       // CaseOutboxMessage
	WriteModeInsertDelete = "insert-delete" // CaseOutboxInsertDelete
	WriteModeSQL          = "sql"           // CaseBaselineSQL, CaseOutboxSQL
)

// WriteModes returns the names Config.WriteModes accepts.
func WriteModes() []string {
	return []string{WriteModeMessage, WriteModeInsertDelete, WriteModeSQL, WriteModeOldRow}
}

// Counters reported by the write scenario for each cell.
const (
	// CounterCommitted counts every committed transaction, warm-ups
	// included.
	CounterCommitted = "committed"
	// CounterOutboxRows counts the rows found in the outbox table after
	// each round: committed times the events per transaction.
	CounterOutboxRows = "outbox_rows"
	// CounterPlainRows counts the rows found in the plain table after
	// each round: committed in CasePlainInsert and CasePlainInsertQueue,
	// 0 in every other case.
	CounterPlainRows = "plain_rows"
	// CounterNotifications counts the notifications a LISTEN connection
	// on the table's channel received: committed in CaseOutboxNotify, 0
	// in every other case.
	CounterNotifications = "notifications"
)

// How a write case adds its extra rows to the business transaction.
type writeMode int

const (
	viaWriteTx    writeMode = iota // WriteTx after the order's INSERT
	viaQueue                       // Driver.Queue in the order's pgx.Batch
	viaCommit                      // outboxpgx.Tx: the events go with the COMMIT
	viaPlain                       // one plain INSERT into the plain table
	viaPlainQueue                  // viaPlain in the order's pgx.Batch
	viaWatermill                   // one INSERT of Watermill's row
	viaRoundTrip                   // one statement that writes nothing
)

type writeCase struct {
	name, desc string
	events     int // outbox events per transaction
	mode       writeMode
	trigger    bool // the notify trigger is enabled
	idle       bool // a relay is registered idle
	// path is the write mode (Config.WriteModes) that adds the case; ""
	// for the default cases.
	path string
}

var writeCases = []writeCase{
	{CaseBaseline, "BEGIN; INSERT an order; COMMIT (no outbox)", 0, viaWriteTx, true, false, ""},
	{CaseRoundTrip, "+ SELECT length($1) of the payload: a round trip of its own that writes nothing, the floor of any extra statement", 0, viaRoundTrip, true, false, ""},
	{CasePlainInsert, "+ 1 plain INSERT (uuid PK, jsonb) of its own: the floor of any extra row with a statement of its own", 0, viaPlain, true, false, ""},
	{CaseWatermillRow, "+ 1 INSERT of Watermill's outbox row ((transaction_id xid8, offset) key, json payload)", 0, viaWatermill, true, false, ""},
	{CaseOutbox, "+ 1 event via WriteTx; the notify trigger on (--wakeups trigger), no relay idle: no NOTIFY", 1, viaWriteTx, true, false, ""},
	{CaseOutboxOldRow, "+ 1 event via WriteTx into the row of before schema version 10 (uuid primary key, (partition, seq) index)", 1, viaWriteTx, true, false, WriteModeOldRow},
	{CaseOutboxQueue, "+ 1 event via Driver.Queue in the order's pgx.Batch: no round trip of its own; order id made client-side", 1, viaQueue, true, false, ""},
	{CaseOutboxCommit, "+ 1 event added to an outboxpgx.Tx: sent with the COMMIT, no round trip of its own", 1, viaCommit, true, false, ""},
	{CaseOutboxNotify, "+ 1 event; a relay registered idle: every commit NOTIFYs", 1, viaWriteTx, true, true, ""},
	{CaseOutboxNoTrigger, "+ 1 event via WriteTx into the default table (no notify trigger; writers wake relays): the writers' view says no relay waits", 1, viaWriteTx, false, false, ""},
	{CaseOutbox10, "+ 10 events in one WriteTx; trigger on, no relay idle", 10, viaWriteTx, true, false, ""},
	{CaseOutboxMessage, "+ 1 event via WriteTx as a logical decoding message (WithMessages): one WAL record, no row", 1, viaWriteTx, true, false, WriteModeMessage},
	{CaseOutboxMessageQueue, "+ 1 event as a logical decoding message via Driver.Queue in the order's pgx.Batch: no round trip of its own", 1, viaQueue, true, false, WriteModeMessage},
	{CaseOutboxMessageCommit, "+ 1 event as a logical decoding message added to an outboxpgx.Tx: sent with the COMMIT, no round trip of its own", 1, viaCommit, true, false, WriteModeMessage},
	{CaseOutboxInsertDelete, "+ 1 event via WriteTx, inserted and deleted in one statement (WithInsertDelete)", 1, viaWriteTx, true, false, WriteModeInsertDelete},
	{CaseOutboxInsertDeleteQueue, "+ 1 event inserted and deleted via Driver.Queue in the order's pgx.Batch: no round trip of its own", 1, viaQueue, true, false, WriteModeInsertDelete},
	{CaseOutboxInsertDeleteCommit, "+ 1 event inserted and deleted, added to an outboxpgx.Tx: sent with the COMMIT, no round trip of its own", 1, viaCommit, true, false, WriteModeInsertDelete},
	{CasePlainInsertQueue, "+ 1 plain INSERT (uuid PK, jsonb) in the order's pgx.Batch: the floor of a row without a round trip of its own", 0, viaPlainQueue, true, false, WriteModeInsertDelete},
	{CaseBaselineSQL, "BEGIN; INSERT an order; COMMIT through database/sql (*sql.Tx), no outbox", 0, viaWriteTx, true, false, WriteModeSQL},
	{CaseOutboxSQL, "+ 1 event via WriteTx on a *sql.Tx (outboxsql) into the default table (no notify trigger)", 1, viaWriteTx, false, false, WriteModeSQL},
}

// idleRelay is the name the scenario registers in the wake-up table to
// stand for an idle relay.
const idleRelay = "bench-idle-relay"

// WritePath measures what the outbox costs the business transactions that
// write events: transactions/s and latency of each write case
// (CaseBaseline, CasePlainInsert and the outbox cases, see their doc) at
// each writer count of cfg.
//
// It creates a fresh schema with an orders table, the plain table of
// CasePlainInsert and a migrated outbox table, and drops it at the end.
// Every writer repeats one transaction on its own pooled connection: BEGIN;
// INSERT INTO orders ... RETURNING id; WriteTx with the case's events (or
// the plain INSERT); COMMIT. CaseOutboxQueue instead sends the order's
// INSERT, with an id made by the client, and the events' INSERT in one
// pgx.Batch. Before each measurement the tables are truncated, the
// trigger and the idle registration set for the case, and a CHECKPOINT run
// when the role may. A LISTEN connection, like an idle relay's, stays open
// on the table's channel for the whole run and counts the notifications of
// each cell, and a WaitSampler samples what the writers' backends wait on.
// After each measurement the scenario checks that the tables hold exactly
// the rows of the committed transactions, that every event names an order
// that exists, and that only CaseOutboxNotify notified, once per commit,
// and reports these numbers as counters.
func WritePath(ctx context.Context, cfg Config) (results []Result, err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	pool := cfg.Pool
	env, err := ReadEnv(ctx, pool)
	if err != nil {
		return nil, err
	}
	env.DurationSeconds, env.Rounds, env.WarmupSeconds = cfg.Duration.Seconds(), cfg.Rounds, cfg.Warmup.Seconds()

	schema, drop, err := freshSchema(ctx, pool, cfg.Schema)
	if err != nil {
		return nil, err
	}
	defer func() {
		if derr := drop(); derr != nil && err == nil {
			err = derr
		}
	}()
	wb, err := newWriteBench(ctx, pool, schema)
	if err != nil {
		return nil, err
	}
	defer wb.close()
	if slices.Contains(cfg.WriteModes, WriteModeMessage) || slices.Contains(cfg.WriteModes, WriteModeInsertDelete) {
		// Their writers refuse while no slot relays the table (an event
		// would be lost): make it, and drop it before the schema goes.
		dropSlot, err := makeSlot(ctx, pool, wb.table)
		if err != nil {
			return nil, err
		}
		defer func() {
			if derr := dropSlot(); derr != nil && err == nil {
				err = derr
			}
		}()
	}
	if env.Checkpoint, err = checkpoint(ctx, pool); err != nil {
		return nil, err
	}
	wb.checkpoint = env.Checkpoint
	env.SchemaVersion = wb.schemaVersion

	var cells []Cell
	for _, n := range cfg.Writers {
		for _, c := range writeCases {
			if c.path != "" && !slices.Contains(cfg.WriteModes, c.path) {
				continue
			}
			cells = append(cells, Cell{
				Case:        c.name,
				Description: c.desc,
				Workers:     n,
				Baseline:    c.name == CaseBaseline,
				Prepare:     wb.prepare(c),
				Op:          wb.op(c),
				Collect:     wb.collect(c),
			})
		}
	}
	plan := Plan{
		Scenario: "write", Unit: "tx",
		Duration: cfg.Duration, Rounds: cfg.Rounds, Warmup: cfg.Warmup,
		Progress: cfg.Progress, Env: env, Waits: wb.waits,
	}
	return plan.Run(ctx, cells)
}

// writeBench holds what the write cells share.
type writeBench struct {
	pool   *pgxpool.Pool
	table  outboxdriver.Table
	names  driverkit.Names
	orders string // qualified orders table
	plain  string // qualified table of CasePlainInsert
	drv    *outboxpgx.Driver
	ob     *outbox.Outbox[pgx.Tx]
	// obMessage and obInsertDelete write with the other write modes;
	// sqlDB and obSQL through database/sql.
	obMessage, obInsertDelete   *outbox.Outbox[pgx.Tx]
	drvMessage, drvInsertDelete *outboxpgx.Driver // obMessage's, obInsertDelete's
	// obNoTrigger writes CaseOutboxNoTrigger, with a Driver of its own:
	// a Driver's view of whether the table has its trigger is its own,
	// and the other cases' must not lag behind the trigger's switching.
	obNoTrigger *outbox.Outbox[pgx.Tx]
	sqlDB       *sql.DB
	obSQL       *outbox.Outbox[*sql.Tx]
	// nextOrder numbers the orders whose id the client makes
	// (CaseOutboxQueue), far above what the orders' sequence hands out.
	nextOrder  atomic.Int64
	lis        *listener
	waits      *WaitSampler
	other      *otherRows
	checkpoint bool
	// schemaVersion is the outbox schema version migrated to.
	schemaVersion int
}

func newWriteBench(ctx context.Context, pool *pgxpool.Pool, schema string) (*writeBench, error) {
	t := outboxdriver.Table{Schema: schema, Name: "outbox"}
	wb := &writeBench{
		pool:   pool,
		table:  t,
		names:  pgschema.NamesOf(t),
		orders: outboxdriver.QuoteIdent(schema) + ".orders",
		plain:  outboxdriver.QuoteIdent(schema) + ".plain",
		drv:    outboxpgx.New(pool),
	}
	wb.nextOrder.Store(clientOrderIDs)
	if _, err := pool.Exec(ctx, `CREATE TABLE `+wb.orders+` (
    id         bigserial   PRIMARY KEY,
    customer   text        NOT NULL,
    total      numeric     NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fmt.Errorf("bench: create orders table: %w", err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+wb.plain+` (id uuid PRIMARY KEY, payload jsonb)`); err != nil {
		return nil, fmt.Errorf("bench: create plain table: %w", err)
	}
	// With the notify trigger, which the cases switch on and off
	// (writeCase.trigger); a new table's default has none.
	versions, err := outboxpgx.New(pool).Migrate(ctx, t, &outboxdriver.MigrateOptions{Wakeups: outboxdriver.WakeupsTrigger})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if len(versions) > 0 {
		wb.schemaVersion = slices.Max(versions)
	}
	ob, err := outbox.New(wb.drv, &outbox.Config{Schema: t.Schema, Table: t.Name})
	if err != nil {
		return nil, err
	}
	wb.ob = ob
	cfgOB := &outbox.Config{Schema: t.Schema, Table: t.Name}
	if wb.obNoTrigger, err = outbox.New(outboxpgx.New(pool), cfgOB); err != nil {
		return nil, err
	}
	wb.drvMessage = outboxpgx.New(pool, outboxpgx.WithMessages())
	if wb.obMessage, err = outbox.New(wb.drvMessage, cfgOB); err != nil {
		return nil, err
	}
	wb.drvInsertDelete = outboxpgx.New(pool, outboxpgx.WithInsertDelete())
	if wb.obInsertDelete, err = outbox.New(wb.drvInsertDelete, cfgOB); err != nil {
		return nil, err
	}
	if wb.other, err = newOtherRows(ctx, pool, wb.drv, schema); err != nil {
		return nil, err
	}
	wb.sqlDB = stdlib.OpenDBFromPool(pool)
	if wb.obSQL, err = outbox.New(outboxsql.New(wb.sqlDB), cfgOB); err != nil {
		return nil, err
	}
	if wb.waits, err = NewWaitSampler(ctx, pool, waitSampleInterval); err != nil {
		return nil, err
	}
	if wb.lis, err = listen(ctx, pool, t.Channel()); err != nil {
		wb.waits.Close()
		return nil, err
	}
	return wb, nil
}

// clientOrderIDs is the first order id the client makes.
const clientOrderIDs = 1 << 62

// waitSampleInterval spaces the wait-event samples: often enough for a
// few hundred per cell, rarely enough to cost the server little.
const waitSampleInterval = 20 * time.Millisecond

func (wb *writeBench) close() {
	wb.sqlDB.Close()
	wb.lis.close()
	wb.waits.Close()
}

// prepare sets the trigger and the idle registration of case c, empties
// the tables, checkpoints and discards stray notifications.
func (wb *writeBench) prepare(c writeCase) func(context.Context) error {
	trigger := "ENABLE"
	if !c.trigger {
		trigger = "DISABLE"
	}
	stmts := []string{
		`ALTER TABLE ` + wb.names.Table + ` ` + trigger + ` TRIGGER ` + outboxdriver.QuoteIdent(wb.table.Name+"_notify"),
		`DELETE FROM ` + wb.names.Wakeup,
		`TRUNCATE ` + wb.orders + `, ` + wb.plain + `, ` + wb.names.Table + `, ` + wb.other.watermill + `, ` + wb.other.old.Qualified(""),
	}
	if c.idle {
		stmts = append(stmts, `INSERT INTO `+wb.names.Wakeup+` (relay, expires_at) VALUES (`+
			pgschema.QuoteLiteral(idleRelay)+`, now() + interval '1 day')`)
	}
	return func(ctx context.Context) error {
		err := pgx.BeginFunc(ctx, wb.pool, func(tx pgx.Tx) error {
			for _, s := range stmts {
				if _, err := tx.Exec(ctx, s); err != nil {
					return fmt.Errorf("%s: %w", s, err)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		if wb.checkpoint {
			if _, err := checkpoint(ctx, wb.pool); err != nil {
				return err
			}
		}
		_, err = wb.lis.settle(ctx)
		return err
	}
}

// op returns one business transaction of case c.
func (wb *writeBench) op(c writeCase) Op {
	insert := `INSERT INTO ` + wb.orders + ` (customer, total) VALUES ($1, $2) RETURNING id`
	insertWithID := `INSERT INTO ` + wb.orders + ` (id, customer, total) VALUES ($1, $2, $3)`
	insertPlain := `INSERT INTO ` + wb.plain + ` (id, payload) VALUES ($1::uuid, $2::jsonb)`
	if c.path == WriteModeSQL {
		return wb.opSQL(c, insert)
	}
	ob, drv := wb.ob, wb.drv
	switch c.path {
	case WriteModeMessage:
		ob, drv = wb.obMessage, wb.drvMessage
	case WriteModeInsertDelete:
		ob, drv = wb.obInsertDelete, wb.drvInsertDelete
	case WriteModeOldRow:
		ob = wb.other.obOld
	}
	if c.name == CaseOutboxNoTrigger {
		ob = wb.obNoTrigger
	}
	return func(ctx context.Context, worker int) error {
		customer := "customer-" + strconv.Itoa(worker)
		var (
			tx     pgx.Tx
			withTx *outboxpgx.Tx // viaCommit: tx, adding its events to its COMMIT
			err    error
		)
		if c.mode == viaCommit {
			withTx, err = drv.Begin(ctx, pgx.TxOptions{})
			tx = withTx
		} else {
			tx, err = wb.pool.Begin(ctx)
		}
		if err != nil {
			return err
		}
		defer tx.Rollback(context.WithoutCancel(ctx)) // a no-op after Commit
		wb.waits.Track(tx.Conn().PgConn().PID())
		if c.mode == viaQueue || c.mode == viaPlainQueue {
			id := wb.nextOrder.Add(1)
			b := &pgx.Batch{}
			b.Queue(insertWithID, id, customer, 42.5)
			if c.mode == viaPlainQueue {
				u, err := uuid.NewV7()
				if err != nil {
					return err
				}
				b.Queue(insertPlain, u.String(), string(orderEvents(id, customer, 1)[0].Payload))
			} else if err := ob.Queue(ctx, b, orderEvents(id, customer, c.events)...); err != nil {
				return err
			}
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return fmt.Errorf("batch of order and events: %w", err)
			}
			return tx.Commit(ctx)
		}
		var id int64
		if err := tx.QueryRow(ctx, insert, customer, 42.5).Scan(&id); err != nil {
			return fmt.Errorf("insert order: %w", err)
		}
		switch {
		case c.mode == viaCommit:
			if err := ob.WriteTx(ctx, withTx, orderEvents(id, customer, c.events)...); err != nil {
				return err
			}
		case c.mode == viaPlain:
			u, err := uuid.NewV7()
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, insertPlain, u.String(), string(orderEvents(id, customer, 1)[0].Payload)); err != nil {
				return fmt.Errorf("plain insert: %w", err)
			}
		case c.mode == viaRoundTrip:
			p := orderEvents(id, customer, 1)[0].Payload
			var n int
			if err := tx.QueryRow(ctx, roundTrip, string(p)).Scan(&n); err != nil {
				return fmt.Errorf("round trip: %w", err)
			}
			if n != len(p) {
				return fmt.Errorf("round trip: the server counted %d characters of a %d-byte payload", n, len(p))
			}
		case c.mode == viaWatermill:
			if err := wb.other.writeWatermill(ctx, tx, orderEvents(id, customer, 1)[0].Payload); err != nil {
				return err
			}
		case c.events > 0:
			if err := ob.WriteTx(ctx, tx, orderEvents(id, customer, c.events)...); err != nil {
				return err
			}
		}
		return tx.Commit(ctx)
	}
}

// roundTrip is CaseRoundTrip's statement.
const roundTrip = `SELECT length($1::text)`

// opSQL returns one business transaction of case c through database/sql.
func (wb *writeBench) opSQL(c writeCase, insert string) Op {
	return func(ctx context.Context, worker int) error {
		customer := "customer-" + strconv.Itoa(worker)
		tx, err := wb.sqlDB.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() // a no-op after Commit
		var id int64
		if err := tx.QueryRowContext(ctx, insert, customer, 42.5).Scan(&id); err != nil {
			return fmt.Errorf("insert order: %w", err)
		}
		if c.events > 0 {
			if err := wb.obSQL.WriteTx(ctx, tx, orderEvents(id, customer, c.events)...); err != nil {
				return err
			}
		}
		return tx.Commit()
	}
}

// orderEvents returns n events about order id: OrderPlaced, then
// OrderLineAdded for the others.
func orderEvents(id int64, customer string, n int) []outbox.Event {
	aid := strconv.FormatInt(id, 10)
	evs := make([]outbox.Event, n)
	p := make([]byte, 0, 64)
	p = append(p, `{"order_id":`...)
	p = strconv.AppendInt(p, id, 10)
	placed := append(append(append(p, `,"customer":"`...), customer...), `","total":42.5}`...)
	evs[0] = outbox.Event{AggregateType: "order", AggregateID: aid, Type: "OrderPlaced", Payload: placed}
	for i := 1; i < n; i++ {
		line := append(append(p[:len(p):len(p)], `,"line":`...), strconv.Itoa(i)...)
		line = append(line, `,"sku":"sku-1234","quantity":1}`...)
		evs[i] = outbox.Event{AggregateType: "order", AggregateID: aid, Type: "OrderLineAdded", Payload: line}
	}
	return evs
}

// collect checks that the tables hold exactly what the committed
// transactions wrote, that every event names an order that exists, and
// that only the idle case notified, and returns the counters.
func (wb *writeBench) collect(c writeCase) func(context.Context, Measurement) (map[string]int64, error) {
	return func(ctx context.Context, m Measurement) (map[string]int64, error) {
		notified, err := wb.lis.settle(ctx)
		if err != nil {
			return nil, err
		}
		var orders, rows, plain, wm int64
		table := wb.names.Table
		if c.path == WriteModeOldRow {
			table = wb.other.old.Qualified("")
		}
		if err := wb.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+wb.orders+`), (SELECT count(*) FROM `+table+`), (SELECT count(*) FROM `+wb.plain+`), (SELECT count(*) FROM `+wb.other.watermill+`)`).Scan(&orders, &rows, &plain, &wm); err != nil {
			return nil, fmt.Errorf("count rows: %w", err)
		}
		var wantWM int64
		if c.mode == viaWatermill {
			wantWM = m.Completed
		}
		if wm != wantWM {
			return nil, fmt.Errorf("check: %d Watermill rows for %d committed transactions, want %d", wm, m.Completed, wantWM)
		}
		if orders != m.Completed {
			return nil, fmt.Errorf("check: %d orders for %d committed transactions", orders, m.Completed)
		}
		want := m.Completed * int64(c.events)
		if c.path == WriteModeMessage || c.path == WriteModeInsertDelete {
			want = 0 // the events are in the WAL only
		}
		if rows != want {
			return nil, fmt.Errorf("check: %d outbox rows for %d committed transactions of %d event(s), want %d", rows, m.Completed, c.events, want)
		}
		var orphans int64
		if err := wb.pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` o
WHERE NOT EXISTS (SELECT 1 FROM `+wb.orders+` r WHERE r.id::text = o.aggregateid)`).Scan(&orphans); err != nil {
			return nil, fmt.Errorf("count events without their order: %w", err)
		}
		if orphans != 0 {
			return nil, fmt.Errorf("check: %d outbox rows name an order that does not exist", orphans)
		}
		var wantPlain int64
		if c.mode == viaPlain || c.mode == viaPlainQueue {
			wantPlain = m.Completed
		}
		if plain != wantPlain {
			return nil, fmt.Errorf("check: %d rows in the plain table for %d committed transactions, want %d", plain, m.Completed, wantPlain)
		}
		want = 0
		if c.idle && c.trigger && c.events > 0 {
			want = m.Completed
		}
		// Without the trigger the writers wake relays (--wakeups writers):
		// a writer whose view of the registry is too old to rule a relay
		// out sends a wake-up (after a pause of its own, say), so a few
		// are expected; never more than one a commit.
		if c.events > 0 && !c.trigger && notified <= m.Completed {
			want = notified
		}
		if notified != want {
			return nil, fmt.Errorf("check: %d notifications for %d committed transactions, want %d", notified, m.Completed, want)
		}
		return map[string]int64{CounterCommitted: m.Completed, CounterOutboxRows: rows, CounterNotifications: notified, CounterPlainRows: plain, CounterWatermillRows: wm}, nil
	}
}

// listener is a LISTEN connection on one channel that counts the
// notifications with an empty payload (the trigger's). settle tells when
// all notifications committed so far have been counted.
type listener struct {
	pool    *pgxpool.Pool
	conn    *pgx.Conn
	channel string
	count   atomic.Int64
	fences  chan string
	seq     int
	cancel  context.CancelFunc
	done    chan struct{}
	err     error // why run stopped; read after done is closed
}

// listen opens a connection outside the pool and listens on channel.
func listen(ctx context.Context, pool *pgxpool.Pool, channel string) (*listener, error) {
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
	if err != nil {
		return nil, fmt.Errorf("bench: LISTEN connection: %w", err)
	}
	if _, err := conn.Exec(ctx, `LISTEN `+outboxdriver.QuoteIdent(channel)); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("bench: LISTEN: %w", err)
	}
	lctx, cancel := context.WithCancel(ctx)
	l := &listener{pool: pool, conn: conn, channel: channel, fences: make(chan string), cancel: cancel, done: make(chan struct{})}
	go l.run(lctx)
	return l, nil
}

func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	for {
		n, err := l.conn.WaitForNotification(ctx)
		if err != nil {
			l.err = err
			return
		}
		if n.Payload == "" {
			l.count.Add(1)
			continue
		}
		select {
		case l.fences <- n.Payload:
		case <-ctx.Done():
			l.err = ctx.Err()
			return
		}
	}
}

// settle sends a fence notification on the channel and waits for it.
// Notifications arrive in commit order, so once the fence is in, every
// notification committed before it has been counted. It returns that count
// and starts a new one.
func (l *listener) settle(ctx context.Context) (int64, error) {
	l.seq++
	fence := "fence-" + strconv.Itoa(l.seq)
	if _, err := l.pool.Exec(ctx, `SELECT pg_notify($1, $2)`, l.channel, fence); err != nil {
		return 0, fmt.Errorf("bench: send fence notification: %w", err)
	}
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	for {
		select {
		case f := <-l.fences:
			if f == fence {
				return l.count.Swap(0), nil
			}
		case <-l.done:
			return 0, fmt.Errorf("bench: LISTEN connection: %w", l.err)
		case <-timeout.C:
			return 0, errors.New("bench: LISTEN connection: no fence notification within 30s")
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

func (l *listener) close() {
	l.cancel()
	<-l.done
	l.conn.Close(context.Background())
}
