// Package workload writes outbox events the way a busy service does (many
// concurrent transactions, some rolled back, some committing late) using
// plain SQL with only Debezium's columns, and checks what a broker received
// against what committed: no loss, no phantom, per-aggregate commit order,
// identical copies.
package workload

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Config shapes a workload.
type Config struct {
	Aggregates   int           // distinct aggregate ids
	Transactions int           // transactions in all
	Writers      int           // concurrent writers
	PerTx        int           // events per transaction (default 1)
	RollbackPct  int           // share of transactions rolled back
	LatePct      int           // share of transactions that commit late
	LateDelay    time.Duration // how late
	Type         string        // aggregatetype (default "order")
}

// Payload is the body of every event the workload writes.
type Payload struct {
	Agg string `json:"agg"`
	V   int    `json:"v"` // the aggregate's version: 1, 2, 3... in commit order
}

// Result is what committed.
type Result struct {
	// Versions maps an aggregate to the number of events committed for it.
	Versions map[string]int
	// IDs holds every committed event id.
	IDs map[string]Payload
	// RolledBack counts events of rolled-back transactions.
	RolledBack int
}

// Committed is the number of committed events.
func (r *Result) Committed() int { return len(r.IDs) }

// Add adds what o committed to r: a later run on the same table, whose
// aggregates' versions go on from r's.
func (r *Result) Add(o *Result) {
	for id, p := range o.IDs {
		r.IDs[id] = p
	}
	for agg, v := range o.Versions {
		r.Versions[agg] = max(r.Versions[agg], v)
	}
	r.RolledBack += o.RolledBack
}

// DB is the database a workload writes to: a PostgreSQL pool (Run) or any
// other database through its own implementation (RunOn).
type DB interface {
	// Prepare creates the aggregates' version rows agg-0 .. agg-(n-1).
	Prepare(ctx context.Context, aggregates int) error
	// Begin opens a business transaction.
	Begin(ctx context.Context) (Tx, error)
}

// Tx is one business transaction of the workload.
type Tx interface {
	// Bump locks aggregate agg's row, adds n to its version and returns
	// the version before.
	Bump(ctx context.Context, agg string, n int) (int, error)
	// Insert inserts one event with plain SQL (only Debezium's columns)
	// and returns its id.
	Insert(ctx context.Context, typ, agg, payload string) (string, error)
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// Run writes the workload into PostgreSQL table t. Each transaction locks
// its aggregate's row (as business code that updates the aggregate does),
// bumps its version and inserts one event per version by plain SQL, so
// commit order per aggregate is the version order.
func Run(ctx context.Context, pool *pgxpool.Pool, t outboxdriver.Table, cfg Config) (*Result, error) {
	return RunOn(ctx, &pgDB{pool: pool, aggs: t.Qualified("_workload_aggs"), table: pgschema.NamesOf(t).Table}, cfg)
}

// RunOn writes the workload through db, as Run does on PostgreSQL.
func RunOn(ctx context.Context, db DB, cfg Config) (*Result, error) {
	if cfg.PerTx == 0 {
		cfg.PerTx = 1
	}
	if cfg.Type == "" {
		cfg.Type = "order"
	}
	if err := db.Prepare(ctx, cfg.Aggregates); err != nil {
		return nil, err
	}
	res := &Result{Versions: map[string]int{}, IDs: map[string]Payload{}}
	var mu sync.Mutex
	jobs := make(chan int)
	errs := make(chan error, cfg.Writers)
	var wg sync.WaitGroup
	for range cfg.Writers {
		wg.Go(func() {
			for i := range jobs {
				agg := fmt.Sprint("agg-", rand.IntN(cfg.Aggregates))
				rollback := rand.IntN(100) < cfg.RollbackPct
				late := rand.IntN(100) < cfg.LatePct
				ids, payloads, err := func() ([]string, []Payload, error) {
					tx, err := db.Begin(ctx)
					if err != nil {
						return nil, nil, err
					}
					defer tx.Rollback(context.WithoutCancel(ctx))
					v, err := tx.Bump(ctx, agg, cfg.PerTx)
					if err != nil {
						return nil, nil, err
					}
					var ids []string
					var ps []Payload
					for k := 1; k <= cfg.PerTx; k++ {
						p := Payload{Agg: agg, V: v + k}
						b, _ := json.Marshal(p)
						id, err := tx.Insert(ctx, cfg.Type, agg, string(b))
						if err != nil {
							return nil, nil, err
						}
						ids, ps = append(ids, id), append(ps, p)
					}
					if late {
						time.Sleep(cfg.LateDelay)
					}
					if rollback {
						return nil, nil, tx.Rollback(ctx)
					}
					return ids, ps, tx.Commit(ctx)
				}()
				if err != nil {
					errs <- fmt.Errorf("transaction %d: %w", i, err)
					return
				}
				mu.Lock()
				if rollback {
					res.RolledBack += cfg.PerTx
				}
				for k, id := range ids {
					res.IDs[id] = payloads[k]
					res.Versions[agg] = max(res.Versions[agg], payloads[k].V)
				}
				mu.Unlock()
			}
		})
	}
	var err error
feed:
	for i := range cfg.Transactions {
		select {
		case jobs <- i:
		case err = <-errs:
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	return res, err
}

// pgDB is the workload's PostgreSQL.
type pgDB struct {
	pool        *pgxpool.Pool
	aggs, table string
}

func (d *pgDB) Prepare(ctx context.Context, aggregates int) error {
	if _, err := d.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+d.aggs+` (id text PRIMARY KEY, v int NOT NULL)`); err != nil {
		return err
	}
	_, err := d.pool.Exec(ctx, `INSERT INTO `+d.aggs+` SELECT 'agg-' || g, 0 FROM generate_series(0, $1 - 1) g ON CONFLICT DO NOTHING`, aggregates)
	return err
}

func (d *pgDB) Begin(ctx context.Context) (Tx, error) {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &pgTx{tx: tx, d: d}, nil
}

type pgTx struct {
	tx pgx.Tx
	d  *pgDB
}

func (t *pgTx) Bump(ctx context.Context, agg string, n int) (int, error) {
	var v int
	err := t.tx.QueryRow(ctx, `UPDATE `+t.d.aggs+` SET v = v + $2 WHERE id = $1 RETURNING v - $2`, agg, n).Scan(&v)
	return v, err
}

func (t *pgTx) Insert(ctx context.Context, typ, agg, payload string) (string, error) {
	var id string
	err := t.tx.QueryRow(ctx, `INSERT INTO `+t.d.table+` (id, aggregatetype, aggregateid, type, payload)
		VALUES (gen_random_uuid(), $1, $2, 'Changed', $3::json) RETURNING id::text`, typ, agg, payload).Scan(&id)
	return id, err
}

func (t *pgTx) Commit(ctx context.Context) error   { return t.tx.Commit(ctx) }
func (t *pgTx) Rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

// Delivery is one message a broker holds.
type Delivery struct {
	ID      string
	Key     string // the aggregate id the message carries as its key
	Payload []byte
}

// Check compares deliveries (in the broker's order) with what committed.
// It returns the number of duplicate copies and an error describing every
// violated invariant: a committed event missing (loss), a message no
// committed transaction wrote (phantom), first deliveries of an aggregate
// out of commit order, copies of one id that differ, a key that is not
// the aggregate id.
func Check(res *Result, got []Delivery) (dups int, err error) {
	var problems []string
	add := func(format string, args ...any) {
		if len(problems) < 20 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	first := map[string][]byte{}
	next := map[string]int{}
	for i, d := range got {
		want, ok := res.IDs[d.ID]
		if !ok {
			add("message %d (id %s) was never committed (phantom)", i, d.ID)
			continue
		}
		if prev, seen := first[d.ID]; seen {
			dups++
			if string(prev) != string(d.Payload) {
				add("copies of %s differ: %s vs %s", d.ID, prev, d.Payload)
			}
			continue
		}
		first[d.ID] = d.Payload
		var p Payload
		if err := json.Unmarshal(d.Payload, &p); err != nil || p != want {
			add("message %d (id %s) carries %s, want %+v", i, d.ID, d.Payload, want)
			continue
		}
		if d.Key != p.Agg {
			add("message %d (id %s) has key %q, want %q", i, d.ID, d.Key, p.Agg)
		}
		if p.V != next[p.Agg]+1 {
			add("%s: version %d delivered after version %d (commit order broken)", p.Agg, p.V, next[p.Agg])
		}
		next[p.Agg] = p.V
	}
	var missing []string
	for id := range res.IDs {
		if _, ok := first[id]; !ok {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		add("%d committed event(s) never delivered (loss), e.g. %s", len(missing), missing[0])
	}
	if len(problems) > 0 {
		return dups, fmt.Errorf("%s", strings.Join(problems, "\n"))
	}
	return dups, nil
}
