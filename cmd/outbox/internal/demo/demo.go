// Package demo runs the whole outbox story in one process tree: an orders
// service writes orders and their events in transactions (some rolled
// back), a relay process publishes them, a billing consumer applies each
// event once through the inbox; midway the relay is SIGKILLed and
// restarted, and duplicates are injected on the broker. It ends with a
// report that counts what was lost, what appeared from nowhere and what
// arrived out of order. `outbox demo` is its command.
package demo

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/inboxsql"
	"github.com/outboxkit/outbox/internal/confval"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxmysql"
	"github.com/outboxkit/outbox/outboxsql"
	"github.com/outboxkit/outbox/outboxsqlite"
)

// Config configures a run.
type Config struct {
	// DB is the database URL: postgres://..., mysql://... or
	// sqlite://path. Empty means a SQLite file in a new temporary
	// directory.
	DB string
	// Sink is the NATS server (nats://host:port) with JetStream. Empty
	// means an embedded server.
	Sink string
	// Orders is how many orders the orders service places; each has three
	// events (placed, paid, shipped). Defaults to 200.
	Orders int
	// Writers is how many orders are written at once. Defaults to 4.
	Writers int
	// Rate is the most transactions per second the writers commit in all,
	// a steady load rather than a burst. Defaults to 300.
	Rate int
	// Binary is the outbox command the relay runs as (a child process,
	// so that it can be killed for real). Defaults to this executable.
	Binary string
	// Serve keeps the relay running after the report, with its metrics on
	// MetricsAddr, until ctx ends; OnReport, if set, gets the report when
	// the story is over, before the wait.
	Serve       bool
	OnReport    func(*Report)
	MetricsAddr string
	// Out receives the progress and the report.
	Out io.Writer
	// Live redraws one status line in place (a terminal) instead of
	// printing a line per second.
	Live bool
}

// Report is what a run counted.
type Report struct {
	Committed, RolledBack  int
	Published              int // distinct event ids in the stream
	Consumed               int // events the billing consumer applied
	DuplicatesSuppressed   int // deliveries the inbox recognised
	DuplicatesInjected     int
	Lost, Phantoms         int
	DoubleEffects          int
	OrderViolations        int
	RelayCrashes           int
	P50, P99, Max          time.Duration // commit-to-consumer
	PubP50, PubP99, PubMax time.Duration // commit-to-publish (the stream)
	// SteadyP50, SteadyP99 are commit-to-publish of the events committed
	// before the crash, while the first relay ran.
	SteadyP50, SteadyP99 time.Duration
	// DB, Broker and Table describe where the run happened.
	DB, Broker, Table string
	// DBURL, Schema and TableName name the outbox table for the CLI.
	DBURL, Schema, TableName string
	Elapsed                  time.Duration
	relayArgs                []string
}

// OK reports whether nothing was lost, invented, applied twice or
// reordered.
func (r *Report) OK() bool {
	return r.Lost == 0 && r.Phantoms == 0 && r.DoubleEffects == 0 && r.OrderViolations == 0 && r.Consumed == r.Committed
}

// steps are the events of an order, in order.
var steps = []string{"OrderPlaced", "OrderPaid", "OrderShipped"}

// Run runs the story and returns its report. The error is about the run
// itself (a database that cannot be reached); a run that lost an event
// returns a report whose OK is false.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Orders == 0 {
		cfg.Orders = 200
	}
	if cfg.Writers == 0 {
		cfg.Writers = 4
	}
	if cfg.Rate == 0 {
		cfg.Rate = 300
	}
	if cfg.Rate < 1 || cfg.Rate > 100_000 {
		return nil, fmt.Errorf("demo: rate %d: use 1 to 100000 transactions/s", cfg.Rate)
	}
	if cfg.Orders < 1 || cfg.Orders > 1_000_000 || cfg.Writers < 1 || cfg.Writers > 64 {
		return nil, fmt.Errorf("demo: orders %d, writers %d: use 1 to 1000000 orders and 1 to 64 writers", cfg.Orders, cfg.Writers)
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if cfg.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("demo: cannot find the outbox executable to run the relay: %w", err)
		}
		cfg.Binary = exe
	}
	d := &run{cfg: cfg, rep: &Report{}, committedAt: map[string]time.Time{}, rolledBack: map[string]bool{}}
	defer d.close()
	start := time.Now()
	if err := d.openDB(ctx); err != nil {
		return nil, err
	}
	if err := d.openBroker(ctx); err != nil {
		return nil, err
	}
	if err := d.migrate(ctx); err != nil {
		return nil, err
	}
	if err := d.story(ctx); err != nil {
		return nil, err
	}
	d.rep.Elapsed = time.Since(start)
	if cfg.Serve {
		if cfg.OnReport != nil {
			cfg.OnReport(d.rep)
		}
		<-ctx.Done()
	}
	return d.rep, nil
}

type run struct {
	cfg Config
	rep *Report

	dbURL   string // as the relay gets it
	db      *sql.DB
	dialect inboxsql.Dialect
	writer  outboxdriver.Writer[*sql.Tx]
	table   outboxdriver.Table
	tmpDir  string

	natsURL string
	nc      *nats.Conn
	js      jetstream.JetStream
	stream  string
	subject string // the relay's destination prefix

	ob *outbox.Outbox[*sql.Tx]
	ib *inbox.Inbox[*sql.Tx]

	relay        *exec.Cmd
	relayDone    chan struct{}
	relayState   atomic.Value // string
	tokens       <-chan struct{}
	crashedAt    time.Time
	cons         jetstream.Consumer
	dupSuppr     atomic.Int64
	consumed     atomic.Int64
	mu           sync.Mutex
	committedAt  map[string]time.Time // event id -> Commit returned
	rolledBack   map[string]bool
	arrivedAt    map[string]time.Time
	publishedAt  map[string]time.Time // first seen in the stream
	cleanupFuncs []func()
}

func (d *run) close() {
	for i := len(d.cleanupFuncs) - 1; i >= 0; i-- {
		d.cleanupFuncs[i]()
	}
}

func (d *run) onClose(f func()) { d.cleanupFuncs = append(d.cleanupFuncs, f) }

// openDB opens the database: a fresh SQLite file by default.
func (d *run) openDB(ctx context.Context) error {
	raw := d.cfg.DB
	suffix := strconv.FormatInt(time.Now().UnixNano()%1_000_000_000, 36)
	if raw == "" {
		dir, err := os.MkdirTemp("", "outbox-demo-")
		if err != nil {
			return fmt.Errorf("demo: temporary directory: %w", err)
		}
		d.tmpDir = dir
		d.onClose(func() { os.RemoveAll(dir) })
		raw = "sqlite://" + filepath.Join(dir, "demo.db")
		suffix = ""
	}
	scheme, rest, _ := strings.Cut(raw, "://")
	d.table = outboxdriver.Table{Name: "demo_outbox" + underscore(suffix)}
	switch strings.ToLower(scheme) {
	case "sqlite":
		db, err := outboxsqlite.Open(ctx, rest)
		if err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		d.db, d.dialect, d.writer = db, inboxsql.SQLite, outboxsqlite.New(db)
		d.table.Schema = "main"
		d.rep.DB = "SQLite file " + rest
	case "postgres", "postgresql":
		db, err := sql.Open("pgx", raw)
		if err != nil {
			return fmt.Errorf("demo: --db: %w", err)
		}
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := db.PingContext(pctx); err != nil {
			db.Close()
			return fmt.Errorf("demo: cannot connect to PostgreSQL: %v; check --db and that PostgreSQL is running", err)
		}
		db.SetMaxOpenConns(d.cfg.Writers + 4)
		d.db, d.dialect, d.writer = db, inboxsql.Postgres, outboxsql.New(db)
		d.table.Schema = "public"
		d.rep.DB = "PostgreSQL " + redact(raw)
	case "mysql":
		cfg, err := outboxmysql.ParseURL(raw)
		if err != nil {
			return fmt.Errorf("demo: --db: %w", err)
		}
		db, err := sql.Open("mysql", cfg.FormatDSN())
		if err != nil {
			return fmt.Errorf("demo: --db: %w", err)
		}
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := db.PingContext(pctx); err != nil {
			db.Close()
			return fmt.Errorf("demo: cannot connect to MySQL/MariaDB at %s: %v; check --db and that MySQL/MariaDB is running", cfg.Addr, err)
		}
		db.SetMaxOpenConns(d.cfg.Writers + 4)
		d.db, d.dialect, d.writer = db, inboxsql.MySQL, outboxmysql.New(db)
		d.table.Schema = cfg.DBName
		d.rep.DB = "MySQL/MariaDB " + redact(raw)
	default:
		return fmt.Errorf("demo: --db %s: use sqlite://path, postgres://user@host:5432/db or mysql://user:pass@host:3306/db", redact(raw))
	}
	d.onClose(func() { d.db.Close() })
	d.dbURL = raw
	d.rep.Table = d.table.String()
	d.rep.DBURL, d.rep.Schema, d.rep.TableName = raw, d.table.Schema, d.table.Name
	return nil
}

func underscore(s string) string {
	if s == "" {
		return ""
	}
	return "_" + s
}

// openBroker starts an embedded NATS server with JetStream, or connects to
// the given one, and creates the demo's stream.
func (d *run) openBroker(ctx context.Context) error {
	url := d.cfg.Sink
	if url == "" {
		dir, err := os.MkdirTemp("", "outbox-demo-nats-")
		if err != nil {
			return fmt.Errorf("demo: temporary directory: %w", err)
		}
		d.onClose(func() { os.RemoveAll(dir) })
		srv, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
		if err != nil {
			return fmt.Errorf("demo: embedded NATS server: %w", err)
		}
		go srv.Start()
		if !srv.ReadyForConnections(10 * time.Second) {
			srv.Shutdown()
			return errors.New("demo: the embedded NATS server did not start within 10s")
		}
		d.onClose(func() { srv.Shutdown(); srv.WaitForShutdown() })
		url = srv.ClientURL()
		d.rep.Broker = "embedded NATS JetStream at " + url
	} else {
		if s, _, _ := strings.Cut(url, "://"); s != "nats" {
			return fmt.Errorf("demo: --sink %s: the demo's consumer speaks NATS JetStream: use nats://host:port", redact(url))
		}
		d.rep.Broker = "NATS JetStream at " + redact(url)
	}
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		return fmt.Errorf("demo: cannot connect to NATS at %s: %v (is nats-server running with -js?)", redact(url), err)
	}
	d.onClose(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	d.natsURL, d.nc, d.js = url, nc, js
	tag := strings.ToUpper(strings.TrimPrefix(d.table.Name, "demo_"))
	d.stream = "DEMO_" + tag
	d.subject = "demo." + strings.ToLower(tag)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: d.stream, Subjects: []string{d.subject + ".>"}}); err != nil {
		return fmt.Errorf("demo: create stream %s: %w", d.stream, err)
	}
	d.onClose(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, d.stream)
	})
	return nil
}

// migrate creates the outbox, the inbox and the business tables.
func (d *run) migrate(ctx context.Context) error {
	var err error
	switch d.dialect {
	case inboxsql.SQLite:
		_, err = outboxsqlite.New(d.db).Migrate(ctx, d.table, &outboxdriver.MigrateOptions{Partitions: 8})
	case inboxsql.MySQL:
		_, err = outboxmysql.New(d.db).Migrate(ctx, d.table, &outboxdriver.MigrateOptions{Partitions: 8})
	default:
		_, err = outboxsql.New(d.db).Migrate(ctx, d.table, &outboxdriver.MigrateOptions{Partitions: 8})
	}
	if err != nil {
		return fmt.Errorf("demo: migrate the outbox: %w", err)
	}
	it := outboxdriver.Table{Schema: d.table.Schema, Name: strings.Replace(d.table.Name, "outbox", "inbox", 1)}
	if _, err := inboxsql.Migrate(ctx, d.db, d.dialect, it); err != nil {
		return fmt.Errorf("demo: migrate the inbox: %w", err)
	}
	orders, billing := d.biz("orders"), d.biz("billing")
	for _, stmt := range []string{
		// VARCHAR, not TEXT: MySQL keys no TEXT column.
		`CREATE TABLE IF NOT EXISTS ` + orders + ` (id VARCHAR(64) PRIMARY KEY, customer TEXT NOT NULL, status TEXT NOT NULL)`,
		// One row per applied event: a second effect of one event would
		// show as a second row.
		`CREATE TABLE IF NOT EXISTS ` + billing + ` (event_id TEXT NOT NULL, order_id TEXT NOT NULL, step INTEGER NOT NULL, in_order INTEGER NOT NULL)`,
	} {
		if _, err := d.db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("demo: create tables: %w", err)
		}
	}
	if d.tmpDir == "" {
		d.onClose(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			d.db.ExecContext(ctx, `DROP TABLE IF EXISTS `+orders)
			d.db.ExecContext(ctx, `DROP TABLE IF EXISTS `+billing)
			inboxsql.MigrateDown(ctx, d.db, d.dialect, it, 0)
			switch d.dialect {
			case inboxsql.SQLite:
				outboxsqlite.New(d.db).MigrateDown(ctx, d.table, 0)
			case inboxsql.MySQL:
				outboxmysql.New(d.db).MigrateDown(ctx, d.table, 0)
			default:
				outboxsql.New(d.db).MigrateDown(ctx, d.table, 0)
			}
		})
	}
	d.ob, err = outbox.New(d.writer, &outbox.Config{Schema: d.table.Schema, Table: d.table.Name})
	if err != nil {
		return err
	}
	drv, err := inboxsql.New(d.db, d.dialect)
	if err != nil {
		return err
	}
	d.ib, err = inbox.New(drv, &inbox.Config{Consumer: "billing", Schema: it.Schema, Table: it.Name, Metrics: dupCounter{&d.dupSuppr}})
	return err
}

// biz names a business table of the run.
func (d *run) biz(name string) string {
	return d.quote(d.table.Schema) + "." + d.quote(strings.Replace(d.table.Name, "outbox", name, 1))
}

// quote quotes a validated identifier in the dialect: backticks on MySQL.
func (d *run) quote(s string) string {
	if d.dialect == inboxsql.MySQL {
		return "`" + s + "`"
	}
	return outboxdriver.QuoteIdent(s)
}

type dupCounter struct{ n *atomic.Int64 }

func (c dupCounter) Handled(_ string, o inbox.Outcome, _ time.Duration) {
	if o == inbox.Duplicate {
		c.n.Add(1)
	}
}

// story runs writers, relay and consumer, crashes the relay midway,
// injects duplicates, waits for the consumer to catch up and counts.
func (d *run) story(ctx context.Context) error {
	fmt.Fprintf(d.cfg.Out, "outbox demo: %d orders x %d events over %d writers, at most %d transactions/s\n  database: %s (table %s)\n  broker:   %s\n\n",
		d.cfg.Orders, len(steps), d.cfg.Writers, d.cfg.Rate, d.rep.DB, d.rep.Table, d.rep.Broker)
	d.arrivedAt, d.publishedAt = map[string]time.Time{}, map[string]time.Time{}
	stopWatch, err := d.watchStream(ctx)
	if err != nil {
		return err
	}
	defer stopWatch()
	stopConsumer, err := d.consume(ctx)
	if err != nil {
		return err
	}
	defer stopConsumer()
	if err := d.startRelay(ctx); err != nil {
		return err
	}
	if d.cfg.Serve {
		d.onClose(d.stopRelay) // it keeps relaying while the run is served
	} else {
		defer d.stopRelay()
	}
	if err := d.waitRelayOwns(ctx); err != nil {
		return err
	}

	progressDone := make(chan struct{})
	stopProgress := make(chan struct{})
	go func() { defer close(progressDone); d.progress(ctx, stopProgress) }()
	defer func() {
		select {
		case <-stopProgress:
		default:
			close(stopProgress)
		}
		<-progressDone
	}()

	// A steady load: one token per transaction.
	tokens := make(chan struct{})
	pacerDone := make(chan struct{})
	go func() {
		defer close(tokens)
		tick := time.NewTicker(time.Second / time.Duration(d.cfg.Rate))
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				select {
				case tokens <- struct{}{}:
				case <-pacerDone:
					return
				}
			case <-pacerDone:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	d.tokens = tokens
	defer close(pacerDone)
	var written atomic.Int64
	crashAt := int64(d.cfg.Orders * len(steps) / 2)
	var wg sync.WaitGroup
	errs := make(chan error, d.cfg.Writers)
	next := atomic.Int64{}
	for range d.cfg.Writers {
		wg.Go(func() {
			for {
				o := int(next.Add(1))
				if o > d.cfg.Orders || ctx.Err() != nil {
					return
				}
				if err := d.writeOrder(ctx, o, &written); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	// Crash the relay for real midway, while writers keep writing.
	crashed := make(chan error, 1)
	go func() {
		for written.Load() < crashAt && ctx.Err() == nil && len(errs) == 0 {
			time.Sleep(5 * time.Millisecond)
		}
		crashed <- d.crashRelay(ctx)
	}()
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	if err := <-crashed; err != nil {
		return err
	}
	if err := d.injectDuplicates(ctx, 3); err != nil {
		return err
	}
	// Wait for the consumer to apply every committed event.
	d.mu.Lock()
	want := len(d.committedAt)
	d.mu.Unlock()
	deadline := time.Now().Add(2 * time.Minute)
	for int(d.consumed.Load()) < want && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	// Count only once the consumer has acknowledged the whole stream: the
	// injected copies and the redeliveries after the crash included.
	if err := d.waitAcked(ctx, time.Minute); err != nil {
		return err
	}
	close(stopProgress)
	<-progressDone
	return d.count(ctx)
}

// writeOrder writes an order's three steps, each in a transaction of its
// own with the order row; about one in eight transactions is rolled back
// after writing its event, and then retried.
func (d *run) writeOrder(ctx context.Context, o int, written *atomic.Int64) error {
	id := fmt.Sprintf("order-%05d", o)
	for step, typ := range steps {
		for {
			if _, ok := <-d.tokens; !ok {
				return ctx.Err()
			}
			evID := uuid.Must(uuid.NewV7()).String()
			rollback := rand.IntN(8) == 0
			err := d.tx(ctx, func(tx *sql.Tx) error {
				var err error
				if step == 0 {
					_, err = tx.ExecContext(ctx, `INSERT INTO `+d.biz("orders")+` (id, customer, status) VALUES (`+d.ph(1)+`, `+d.ph(2)+`, `+d.ph(3)+`)`, id, "customer-"+strconv.Itoa(o%17), typ)
				} else {
					_, err = tx.ExecContext(ctx, `UPDATE `+d.biz("orders")+` SET status = `+d.ph(1)+` WHERE id = `+d.ph(2), typ, id)
				}
				if err != nil {
					return err
				}
				payload, _ := json.Marshal(map[string]any{"order_id": id, "step": step + 1})
				if err := d.ob.WriteTx(ctx, tx, outbox.Event{ID: evID, AggregateType: "order", AggregateID: id, Type: typ, Payload: payload}); err != nil {
					return err
				}
				if rollback {
					return errRollback
				}
				return nil
			})
			if errors.Is(err, errRollback) {
				d.mu.Lock()
				d.rolledBack[evID] = true
				d.rep.RolledBack++
				d.mu.Unlock()
				continue
			}
			if err != nil {
				return fmt.Errorf("demo: write %s %s: %w", id, typ, err)
			}
			now := time.Now()
			d.mu.Lock()
			d.committedAt[evID] = now
			d.mu.Unlock()
			written.Add(1)
			break
		}
	}
	return nil
}

var errRollback = errors.New("rolled back on purpose")

// tx runs fn in a transaction, retrying a transaction SQLite refused as
// busy.
func (d *run) tx(ctx context.Context, fn func(*sql.Tx) error) error {
	for attempt := 0; ; attempt++ {
		tx, err := d.db.BeginTx(ctx, nil)
		if err == nil {
			if err = fn(tx); err == nil {
				err = tx.Commit()
			} else {
				tx.Rollback()
			}
		}
		if err == nil || errors.Is(err, errRollback) || !busy(err) || attempt == 20 {
			return err
		}
		time.Sleep(time.Duration(attempt+1) * 5 * time.Millisecond)
	}
}

func busy(err error) bool {
	s := err.Error()
	return strings.Contains(s, "SQLITE_BUSY") || strings.Contains(s, "database is locked") || strings.Contains(s, "40001") || strings.Contains(s, "40P01")
}

// ph is the n-th placeholder of the dialect.
func (d *run) ph(n int) string {
	if d.dialect == inboxsql.Postgres {
		return "$" + strconv.Itoa(n)
	}
	return "?"
}

// consume runs the billing consumer: a durable JetStream consumer whose
// handler applies each event through the inbox and acknowledges after the
// commit.
func (d *run) consume(ctx context.Context) (func(), error) {
	cons, err := d.js.CreateOrUpdateConsumer(ctx, d.stream, jetstream.ConsumerConfig{
		Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second, MaxAckPending: 256,
	})
	if err != nil {
		return nil, fmt.Errorf("demo: consumer: %w", err)
	}
	// Events of one order go one at a time, in stream order: a worker per
	// hash of the order id.
	const workers = 4
	queues := make([]chan jetstream.Msg, workers)
	var wg sync.WaitGroup
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	for i := range queues {
		queues[i] = make(chan jetstream.Msg, 64)
		wg.Go(func() {
			for m := range queues[i] {
				d.handle(hctx, m)
			}
		})
	}
	d.cons = cons
	cc, err := cons.Consume(func(m jetstream.Msg) {
		key := m.Headers().Get("key")
		h := 0
		for i := 0; i < len(key); i++ {
			h = h*31 + int(key[i])
		}
		queues[(h&0x7fffffff)%workers] <- m
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("demo: consume: %w", err)
	}
	return func() {
		cc.Stop()
		<-cc.Closed()
		for _, q := range queues {
			close(q)
		}
		wg.Wait()
		cancel()
	}, nil
}

// handle applies one delivery: record it in the inbox and bill it in the
// same transaction, then acknowledge. A failure is not acknowledged: the
// broker redelivers it after AckWait.
func (d *run) handle(ctx context.Context, m jetstream.Msg) {
	hdr := map[string]string{}
	for k, v := range m.Headers() {
		if len(v) > 0 {
			hdr[k] = v[0]
		}
	}
	msg := inbox.NewMessage(m.Subject(), nil, hdr, m.Data())
	var p struct {
		OrderID string `json:"order_id"`
		Step    int    `json:"step"`
	}
	if err := json.Unmarshal(m.Data(), &p); err != nil || p.OrderID == "" {
		_ = d.ib.DeadLetter(ctx, msg, fmt.Errorf("undecodable payload: %v", err))
		_ = m.Ack()
		return
	}
	for attempt := 0; ; attempt++ {
		res, err := d.ib.Handle(ctx, msg, func(ctx context.Context, tx *sql.Tx) error {
			var last sql.NullInt64
			if err := tx.QueryRowContext(ctx, `SELECT max(step) FROM `+d.biz("billing")+` WHERE order_id = `+d.ph(1), p.OrderID).Scan(&last); err != nil {
				return err
			}
			inOrder := 0
			if int(last.Int64)+1 == p.Step {
				inOrder = 1
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO `+d.biz("billing")+` (event_id, order_id, step, in_order) VALUES (`+d.ph(1)+`, `+d.ph(2)+`, `+d.ph(3)+`, `+d.ph(4)+`)`,
				msg.EventID, p.OrderID, p.Step, inOrder)
			return err
		})
		if errors.Is(err, inbox.ErrInvalidMessage) {
			_ = d.ib.DeadLetter(ctx, msg, err)
			_ = m.Ack()
			return
		}
		if err != nil {
			if ctx.Err() != nil || attempt == 20 {
				return // not acknowledged: redelivered
			}
			time.Sleep(time.Duration(attempt+1) * 5 * time.Millisecond)
			continue
		}
		if res.Applied() {
			now := time.Now()
			d.mu.Lock()
			if _, seen := d.arrivedAt[msg.EventID]; !seen {
				d.arrivedAt[msg.EventID] = now
			}
			d.mu.Unlock()
			d.consumed.Add(1)
		}
		_ = m.Ack()
		return
	}
}

// watchStream notes when each event first reaches the stream, with an
// ordered consumer that touches no database: commit-to-publish latency.
func (d *run) watchStream(ctx context.Context) (func(), error) {
	cons, err := d.js.OrderedConsumer(ctx, d.stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, fmt.Errorf("demo: stream watcher: %w", err)
	}
	d.cons = cons
	cc, err := cons.Consume(func(m jetstream.Msg) {
		now := time.Now()
		id := m.Headers().Get("id")
		d.mu.Lock()
		if _, seen := d.publishedAt[id]; !seen {
			d.publishedAt[id] = now
		}
		d.mu.Unlock()
	})
	if err != nil {
		return nil, fmt.Errorf("demo: stream watcher: %w", err)
	}
	return cc.Stop, nil
}

// startRelay starts `outbox relay` as a child process.
func (d *run) startRelay(ctx context.Context) error {
	args := []string{"relay", "--db", d.dbURL, "--schema", d.table.Schema, "--table", d.table.Name,
		"--sink", d.natsURL, "--nats-stream", d.stream, "--nats-subjects", d.subject + ".>", "--nats-no-create-stream",
		"--route-replacement", d.subject + ".${routedByValue}",
		"--poll-interval", "100ms", "--lease-ttl", "1s", "--batch", "100", "--log-level", "error"}
	if d.cfg.MetricsAddr != "" {
		args = append(args, "--metrics-addr", d.cfg.MetricsAddr)
	}
	d.rep.relayArgs = args
	cmd := exec.Command(d.cfg.Binary, args...)
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("demo: start the relay (%s): %w", d.cfg.Binary, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	d.relay, d.relayDone = cmd, done
	d.relayState.Store("running (pid " + strconv.Itoa(cmd.Process.Pid) + ")")
	return nil
}

// waitRelayOwns waits until a relay holds partition leases: the relay is up.
func (d *run) waitRelayOwns(ctx context.Context) error {
	leases := d.quote(d.table.Schema) + "." + d.quote(d.table.Name+"_leases")
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := d.db.QueryRowContext(ctx, `SELECT count(*) FROM `+leases+` WHERE owner IS NOT NULL`).Scan(&n); err != nil {
			return fmt.Errorf("demo: read the relay's leases: %w", err)
		}
		if n > 0 {
			return nil
		}
		select {
		case <-d.relayDone:
			return fmt.Errorf("demo: the relay exited at start; to see why, run: outbox %s", strings.Join(d.rep.relayArgs, " "))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return errors.New("demo: the relay took no partition within 30s")
		}
	}
}

// crashRelay SIGKILLs the relay and starts a new one.
func (d *run) crashRelay(ctx context.Context) error {
	if d.relay == nil {
		return nil
	}
	_ = d.relay.Process.Signal(syscall.SIGKILL)
	<-d.relayDone
	d.mu.Lock()
	d.crashedAt = time.Now()
	d.mu.Unlock()
	d.rep.RelayCrashes++
	d.relayState.Store("SIGKILLed, restarting")
	select {
	case <-time.After(300 * time.Millisecond):
	case <-ctx.Done():
		return ctx.Err()
	}
	return d.startRelay(ctx)
}

// stopRelay stops the relay with SIGTERM (a graceful stop).
func (d *run) stopRelay() {
	if d.relay == nil {
		return
	}
	_ = d.relay.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.relayDone:
	case <-time.After(15 * time.Second):
		_ = d.relay.Process.Kill()
		<-d.relayDone
	}
}

// waitAcked waits until the consumer has acknowledged every message the
// stream holds now.
func (d *run) waitAcked(ctx context.Context, within time.Duration) error {
	st, err := d.js.Stream(ctx, d.stream)
	if err != nil {
		return err
	}
	si, err := st.Info(ctx)
	if err != nil {
		return err
	}
	last := si.State.LastSeq
	deadline := time.Now().Add(within)
	for {
		ci, err := d.cons.Info(ctx)
		if err != nil {
			return err
		}
		if ci.AckFloor.Stream >= last {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: the consumer acknowledged the stream up to message %d of %d within %s", ci.AckFloor.Stream, last, within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// injectDuplicates publishes copies of n delivered events to the stream
// under a fresh Nats-Msg-Id, so that JetStream's own de-duplication lets
// them through: only the inbox stands between them and a second effect.
func (d *run) injectDuplicates(ctx context.Context, n int) error {
	st, err := d.js.Stream(ctx, d.stream)
	if err != nil {
		return err
	}
	// Copy events the consumer has applied already.
	deadline := time.Now().Add(time.Minute)
	for d.consumed.Load() < int64(n) {
		if time.Now().After(deadline) {
			return errors.New("demo: nothing was consumed within a minute; is the relay running?")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	for seq := uint64(1); n > 0; seq++ {
		raw, err := st.GetMsg(ctx, seq)
		if err != nil {
			return fmt.Errorf("demo: read message %d to duplicate: %w", seq, err)
		}
		m := nats.NewMsg(raw.Subject)
		m.Data = raw.Data
		for k, v := range raw.Header {
			m.Header[k] = slices.Clone(v)
		}
		m.Header.Set(jetstream.MsgIDHeader, "injected-"+uuid.NewString())
		if _, err := d.js.PublishMsg(ctx, m); err != nil {
			return fmt.Errorf("demo: inject a duplicate: %w", err)
		}
		d.rep.DuplicatesInjected++
		n--
	}
	return nil
}

// progress redraws the status line until stop.
func (d *run) progress(ctx context.Context, stop <-chan struct{}) {
	every := time.Second
	if d.cfg.Live {
		every = 150 * time.Millisecond
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	line := func() string {
		d.mu.Lock()
		committed, rolled := len(d.committedAt), d.rep.RolledBack
		d.mu.Unlock()
		var inStream uint64
		if st, err := d.js.Stream(ctx, d.stream); err == nil {
			inStream = st.CachedInfo().State.Msgs
		}
		return fmt.Sprintf("committed %6d  rolled back %4d  in stream %6d  consumed %6d  duplicates suppressed %3d  relay %s",
			committed, rolled, inStream, d.consumed.Load(), d.dupSuppr.Load(), d.relayState.Load())
	}
	for {
		select {
		case <-stop:
			if d.cfg.Live {
				fmt.Fprintf(d.cfg.Out, "\r\033[K%s\n", line())
			}
			return
		case <-tick.C:
			if d.cfg.Live {
				fmt.Fprintf(d.cfg.Out, "\r\033[K%s", line())
			} else {
				fmt.Fprintln(d.cfg.Out, line())
			}
		}
	}
}

// count compares what was committed with what the stream holds and what
// billing applied.
func (d *run) count(ctx context.Context) error {
	r := d.rep
	d.mu.Lock()
	committed := d.committedAt
	r.Committed = len(committed)
	r.P50, r.P99, r.Max = percentiles(committed, d.arrivedAt)
	r.PubP50, r.PubP99, r.PubMax = percentiles(committed, d.publishedAt)
	steady := map[string]time.Time{}
	for id, at := range committed {
		if d.crashedAt.IsZero() || at.Before(d.crashedAt) {
			steady[id] = at
		}
	}
	r.SteadyP50, r.SteadyP99, _ = percentiles(steady, d.publishedAt)
	d.mu.Unlock()
	// The stream: distinct event ids.
	st, err := d.js.Stream(ctx, d.stream)
	if err != nil {
		return err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return err
	}
	ids := map[string]bool{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		ids[m.Header.Get("id")] = true
	}
	r.Published = len(ids)
	// Billing: one row per applied event.
	rows, err := d.db.QueryContext(ctx, `SELECT event_id, in_order FROM `+d.biz("billing"))
	if err != nil {
		return err
	}
	defer rows.Close()
	applied := map[string]int{}
	for rows.Next() {
		var id string
		var inOrder int
		if err := rows.Scan(&id, &inOrder); err != nil {
			return err
		}
		applied[id]++
		if inOrder == 0 {
			r.OrderViolations++
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	r.Consumed = len(applied)
	for id, n := range applied {
		if n > 1 {
			r.DoubleEffects += n - 1
		}
		if _, ok := committed[id]; !ok {
			r.Phantoms++
		}
	}
	for id := range committed {
		if applied[id] == 0 {
			r.Lost++
		}
	}
	r.DuplicatesSuppressed = int(d.dupSuppr.Load())
	return nil
}

// percentiles of the time from each commit to its event's arrival.
func percentiles(committed, arrived map[string]time.Time) (p50, p99, mx time.Duration) {
	var lat []time.Duration
	for id, at := range committed {
		if arr, ok := arrived[id]; ok {
			lat = append(lat, max(arr.Sub(at), 0))
		}
	}
	slices.Sort(lat)
	n := len(lat)
	if n == 0 {
		return 0, 0, 0
	}
	return lat[n/2], lat[min(n-1, n*99/100)], lat[n-1]
}

// Print writes the report.
func (r *Report) Print(w io.Writer) {
	verdict := "OK: every committed event was applied exactly once, in order; nothing else was"
	if !r.OK() {
		verdict = "FAILED"
	}
	fmt.Fprintf(w, `
report (%s)
  events committed          %d   (transactions rolled back on purpose: %d)
  events published          %d   (distinct ids in the stream; the relay was SIGKILLed %d time(s) and restarted)
  events consumed           %d   (applied by billing through the inbox)
  duplicates suppressed     %d   (%d injected on the broker, plus redeliveries after the crash)
  lost                      %d
  phantoms                  %d   (applied but never committed)
  double effects            %d
  order violations          %d   (an order's step applied before the one before it)
  commit-to-publish         p50 %s  p99 %s  (events committed before the crash)
                            p50 %s  p99 %s  max %s   (all, the crash and restart included)
  commit-to-consumer        p50 %s  p99 %s  max %s
%s
`, r.Elapsed.Round(time.Millisecond), r.Committed, r.RolledBack, r.Published, r.RelayCrashes, r.Consumed,
		r.DuplicatesSuppressed, r.DuplicatesInjected, r.Lost, r.Phantoms, r.DoubleEffects, r.OrderViolations,
		ms(r.SteadyP50), ms(r.SteadyP99), ms(r.PubP50), ms(r.PubP99), ms(r.PubMax), ms(r.P50), ms(r.P99), ms(r.Max), verdict)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond)) }

// redact hides a password in a URL.
func redact(raw string) string { return confval.RedactURL(raw) }
