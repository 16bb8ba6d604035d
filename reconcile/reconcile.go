// Package reconcile finds what the outbox's guarantees cannot: events that
// wait too long, aggregates held too long, old dead letters, business rows
// written without their event, published events a consumer never
// recorded in its inbox, and gaps in an aggregate's version sequence. It
// reads a PostgreSQL outbox (pgx) and changes nothing. See
// docs/operations.md#reconciliation.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/outboxdriver"
)

// Check is a user's pair of queries that must agree: every id Business
// returns must be among the ids Events returns. Both take $1 and $2, the
// start and end of the window (timestamptz), and return one column, the
// id as text. For example, orders created in the window against the
// OrderPlaced events of the window.
type Check struct {
	Name     string `json:"name"`
	Business string `json:"business"`
	Events   string `json:"events"`
}

// Inbox names a consumer whose inbox must record every published event
// of the given aggregate types (all when empty) within Grace.
type Inbox struct {
	// Table is the inbox table, "schema.name" or "name" (in the outbox's
	// schema).
	Table string `json:"table"`
	// Consumer is the consumer's name in the inbox.
	Consumer string `json:"consumer"`
	// AggregateTypes limits the check to the events this consumer takes.
	AggregateTypes []string `json:"aggregate_types"`
}

// Config says what counts as a finding. Zero thresholds take the
// defaults.
type Config struct {
	// PendingAfter: an unpublished event older than this is a finding.
	// Defaults to 5m.
	PendingAfter time.Duration
	// HeldAfter: an aggregate held longer than this. Defaults to 15m.
	HeldAfter time.Duration
	// DeadLetterAfter: a dead letter older than this. Defaults to 1h.
	DeadLetterAfter time.Duration
	// Window is how far back Checks, Inboxes and version gaps look.
	// Defaults to 24h.
	Window time.Duration
	// Grace is how long a consumer may take to record a published event.
	// Defaults to 5m.
	Grace time.Duration
	// Checks are the business-row checks.
	Checks []Check
	// Inboxes are the consumers checked for events without their effect.
	// The outbox must keep published rows (retention keep).
	Inboxes []Inbox
	// VersionHeader, when set, names the header that carries an event's
	// per-aggregate version; a jump in it (5 then 7) is a finding.
	VersionHeader string
	// Timeout bounds each query. Defaults to 30s.
	Timeout time.Duration
	// MaxIDs is the most ids a finding lists. Defaults to 100.
	MaxIDs int
}

// Finding is one problem.
type Finding struct {
	// Kind is pending, held, dead-letter, missing-event, missing-effect or
	// version-gap.
	Kind string `json:"kind"`
	// Check names the business check or the consumer, when there is one.
	Check string `json:"check,omitempty"`
	// AggregateType groups pending events, held aggregates and dead
	// letters.
	AggregateType string `json:"aggregatetype,omitempty"`
	// Count is how many; IDs lists up to MaxIDs of them (event ids,
	// business ids, or aggregate ids for held aggregates and gaps).
	Count int64    `json:"count"`
	IDs   []string `json:"ids,omitempty"`
	// Oldest is the age of the oldest one, where that applies.
	Oldest time.Duration `json:"oldest_ns,omitempty"`
	// Detail says what was found, in words.
	Detail string `json:"detail"`
}

// Report is the outcome of one run.
type Report struct {
	At       time.Time `json:"at"`
	Findings []Finding `json:"findings"`
}

// Run reconciles table t on pool. An error means a query failed or ran
// out of time: the report holds the findings of the queries before it.
func Run(ctx context.Context, pool *pgxpool.Pool, t outboxdriver.Table, cfg *Config) (Report, error) {
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.PendingAfter, 5*time.Minute)
	def(&c.HeldAfter, 15*time.Minute)
	def(&c.DeadLetterAfter, time.Hour)
	def(&c.Window, 24*time.Hour)
	def(&c.Grace, 5*time.Minute)
	def(&c.Timeout, 30*time.Second)
	if c.MaxIDs == 0 {
		c.MaxIDs = 100
	}
	if err := t.Validate(); err != nil {
		return Report{}, fmt.Errorf("reconcile: %w", err)
	}
	rep := Report{At: time.Now().UTC(), Findings: []Finding{}}
	r := &runner{pool: pool, cfg: c, rep: &rep}
	steps := []func(context.Context) error{
		func(ctx context.Context) error {
			return r.grouped(ctx, "pending", `SELECT aggregatetype, count(*), extract(epoch FROM now() - min(created_at)), (array_agg(id::text ORDER BY seq))[1:$2]
				FROM `+t.Qualified("")+` WHERE published_at IS NULL AND created_at < now() - $1::interval GROUP BY aggregatetype ORDER BY aggregatetype`,
				c.PendingAfter, "event(s) unpublished for longer than %s")
		},
		func(ctx context.Context) error {
			return r.grouped(ctx, "held", `SELECT aggregatetype, count(*), extract(epoch FROM now() - min(held_at)), (array_agg(aggregateid ORDER BY held_at))[1:$2]
				FROM `+t.Qualified("_held")+` WHERE held_at < now() - $1::interval GROUP BY aggregatetype ORDER BY aggregatetype`,
				c.HeldAfter, "aggregate(s) held for longer than %s")
		},
		func(ctx context.Context) error {
			return r.grouped(ctx, "dead-letter", `SELECT aggregatetype, count(*), extract(epoch FROM now() - min(dead_lettered_at)), (array_agg(id::text ORDER BY dead_lettered_at))[1:$2]
				FROM `+t.Qualified("_dead_letter")+` WHERE dead_lettered_at < now() - $1::interval GROUP BY aggregatetype ORDER BY aggregatetype`,
				c.DeadLetterAfter, "dead letter(s) older than %s")
		},
	}
	for _, ch := range c.Checks {
		steps = append(steps, func(ctx context.Context) error { return r.check(ctx, ch) })
	}
	for _, in := range c.Inboxes {
		steps = append(steps, func(ctx context.Context) error { return r.inbox(ctx, t, in) })
	}
	if c.VersionHeader != "" {
		steps = append(steps, func(ctx context.Context) error { return r.gaps(ctx, t) })
	}
	for _, step := range steps {
		if err := step(ctx); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

type runner struct {
	pool *pgxpool.Pool
	cfg  Config
	rep  *Report
}

// query runs fn in a read-only transaction whose statements end after
// the configured timeout.
func (r *runner) query(ctx context.Context, what string, fn func(tx pgx.Tx) error) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout+time.Second)
	defer cancel()
	err := pgx.BeginTxFunc(ctx, r.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d", r.cfg.Timeout.Milliseconds())); err != nil {
			return err
		}
		return fn(tx)
	})
	if err != nil {
		return fmt.Errorf("reconcile: %s: %w", what, err)
	}
	return nil
}

func (r *runner) grouped(ctx context.Context, kind, sql string, after time.Duration, detail string) error {
	return r.query(ctx, kind, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sql, after, r.cfg.MaxIDs)
		if err != nil {
			return err
		}
		for rows.Next() {
			f := Finding{Kind: kind}
			var secs float64
			if err := rows.Scan(&f.AggregateType, &f.Count, &secs, &f.IDs); err != nil {
				return err
			}
			f.Oldest = time.Duration(secs * float64(time.Second)).Round(time.Millisecond)
			f.Detail = fmt.Sprintf("%d "+detail+" (oldest %s)", f.Count, after, f.Oldest)
			r.rep.Findings = append(r.rep.Findings, f)
		}
		return rows.Err()
	})
}

func (r *runner) window() (time.Time, time.Time) {
	end := time.Now()
	return end.Add(-r.cfg.Window), end
}

// check runs a business check: ids from Business missing from Events.
func (r *runner) check(ctx context.Context, ch Check) error {
	from, to := r.window()
	return r.query(ctx, "check "+ch.Name, func(tx pgx.Tx) error {
		ids := func(sql string) (map[string]bool, []string, error) {
			rows, err := tx.Query(ctx, sql, from, to)
			if err != nil {
				return nil, nil, err
			}
			list, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				return nil, nil, err
			}
			set := make(map[string]bool, len(list))
			for _, id := range list {
				set[id] = true
			}
			return set, list, nil
		}
		_, business, err := ids(ch.Business)
		if err != nil {
			return fmt.Errorf("business query: %w", err)
		}
		events, _, err := ids(ch.Events)
		if err != nil {
			return fmt.Errorf("events query: %w", err)
		}
		f := Finding{Kind: "missing-event", Check: ch.Name}
		for _, id := range business {
			if !events[id] {
				f.Count++
				if len(f.IDs) < r.cfg.MaxIDs {
					f.IDs = append(f.IDs, id)
				}
			}
		}
		if f.Count > 0 {
			f.Detail = fmt.Sprintf("%d business row(s) of the last %s without their event", f.Count, r.cfg.Window)
			r.rep.Findings = append(r.rep.Findings, f)
		}
		return nil
	})
}

// inbox finds published events of the window that the consumer has not
// recorded after the grace period.
func (r *runner) inbox(ctx context.Context, t outboxdriver.Table, in Inbox) error {
	it := outboxdriver.Table{Schema: t.Schema, Name: in.Table}
	if s, n, ok := strings.Cut(in.Table, "."); ok {
		it = outboxdriver.Table{Schema: s, Name: n}
	}
	if err := it.Validate(); err != nil {
		return fmt.Errorf("reconcile: inbox of %s: %w", in.Consumer, err)
	}
	if in.Consumer == "" {
		return errors.New("reconcile: an inbox check needs the consumer's name")
	}
	from, _ := r.window()
	return r.query(ctx, "inbox of "+in.Consumer, func(tx pgx.Tx) error {
		f := Finding{Kind: "missing-effect", Check: in.Consumer}
		err := tx.QueryRow(ctx, `SELECT count(*), coalesce((array_agg(o.id::text ORDER BY o.seq))[1:$5], '{}')
			FROM `+t.Qualified("")+` o
			WHERE o.published_at IS NOT NULL AND o.published_at < now() - $1::interval AND o.created_at >= $2
			  AND (cardinality($3::text[]) = 0 OR o.aggregatetype = ANY($3))
			  AND NOT EXISTS (SELECT 1 FROM `+it.Qualified("")+` i WHERE i.consumer = $4 AND i.event_id = o.id)`,
			r.cfg.Grace, from, in.AggregateTypes, in.Consumer, r.cfg.MaxIDs).Scan(&f.Count, &f.IDs)
		if err != nil {
			return err
		}
		if f.Count > 0 {
			f.Detail = fmt.Sprintf("%d published event(s) that consumer %s has not recorded after %s", f.Count, in.Consumer, r.cfg.Grace)
			r.rep.Findings = append(r.rep.Findings, f)
		}
		return nil
	})
}

// gaps finds aggregates whose version header jumps.
func (r *runner) gaps(ctx context.Context, t outboxdriver.Table) error {
	from, _ := r.window()
	return r.query(ctx, "version gaps", func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT aggregatetype, aggregateid, prev, version FROM (
				SELECT aggregatetype, aggregateid, version, lag(version) OVER (PARTITION BY aggregatetype, aggregateid ORDER BY seq) AS prev
				FROM (SELECT aggregatetype, aggregateid, seq, (headers->>$1)::bigint AS version
				      FROM `+t.Qualified("")+` WHERE created_at >= $2 AND headers->>$1 ~ '^[0-9]{1,18}$') v
			) g WHERE prev IS NOT NULL AND version <> prev + 1 ORDER BY aggregatetype, aggregateid`, r.cfg.VersionHeader, from)
		if err != nil {
			return err
		}
		byType := map[string]*Finding{}
		var order []string
		for rows.Next() {
			var at, id string
			var prev, v int64
			if err := rows.Scan(&at, &id, &prev, &v); err != nil {
				return err
			}
			f := byType[at]
			if f == nil {
				f = &Finding{Kind: "version-gap", AggregateType: at}
				byType[at] = f
				order = append(order, at)
			}
			f.Count++
			if len(f.IDs) < r.cfg.MaxIDs {
				f.IDs = append(f.IDs, fmt.Sprintf("%s (%d to %d)", id, prev, v))
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		for _, at := range order {
			f := byType[at]
			f.Detail = fmt.Sprintf("%d jump(s) in header %s within the last %s", f.Count, r.cfg.VersionHeader, r.cfg.Window)
			r.rep.Findings = append(r.rep.Findings, *f)
		}
		return nil
	})
}
