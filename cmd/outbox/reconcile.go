package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/reconcile"
)

// reconcileFile is the --config file: the business checks and the
// consumers' inboxes.
type reconcileFile struct {
	Checks  []reconcile.Check `json:"checks"`
	Inboxes []reconcile.Inbox `json:"inboxes"`
}

func newReconcile() *cobra.Command {
	var (
		f      dbFlags
		cfg    reconcile.Config
		file   string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "reconcile",
		Short: "Find what the guarantees cannot: stuck events, held aggregates, old dead letters, business rows without their event, events without their effect (PostgreSQL; exit 0 clean, 1 findings, 2 error)",
		Long: `Read the outbox and report (PostgreSQL only: the checks, and those of
--config, are PostgreSQL queries):
  pending         events unpublished for longer than --pending-after, per aggregate type
  held            aggregates held for longer than --held-after
  dead-letter     dead letters older than --dead-letter-after
  missing-event   business rows without their event (the checks of --config)
  missing-effect  published events a consumer's inbox has not recorded after
                  --grace (the inboxes of --config; needs --retention keep)
  version-gap     a jump in an aggregate's version header (--version-header)
It changes nothing. Exit status 0: clean; 1: findings; 2: an error (a query
that fails or runs longer than --timeout). docs/operations.md#reconciliation
says what to do with each finding.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := firstError(
				durationIn("pending-after", cfg.PendingAfter, time.Second, 0),
				durationIn("held-after", cfg.HeldAfter, time.Second, 0),
				durationIn("dead-letter-after", cfg.DeadLetterAfter, time.Second, 0),
				durationIn("window", cfg.Window, time.Second, 0),
				durationIn("grace", cfg.Grace, 0, 0),
				durationIn("timeout", cfg.Timeout, time.Millisecond, 0),
			); err != nil {
				return &exitError{2, err}
			}
			if err := loadReconcileFile(file, &cfg); err != nil {
				return &exitError{2, err}
			}
			t, err := f.tableName()
			if err != nil {
				return &exitError{2, err}
			}
			raw, err := f.dbURL()
			if err == nil {
				err = postgresOnly(raw, "reconcile reads PostgreSQL only (its checks, and those of --config, are PostgreSQL queries)")
			}
			if err != nil {
				return &exitError{2, err}
			}
			ctx := cmd.Context()
			pool, err := connectPostgres(ctx, raw, 2)
			if err != nil {
				return &exitError{2, err}
			}
			defer pool.Close()
			if t.Schema == "" {
				t.Schema = "public"
			}
			if err := pgMigrated(ctx, pool, t); err != nil {
				return &exitError{2, err}
			}
			rep, err := reconcile.Run(ctx, pool, t, &cfg)
			if err != nil {
				return &exitError{2, err}
			}
			out := cmd.OutOrStdout()
			if asJSON {
				if err := json.NewEncoder(out).Encode(rep); err != nil {
					return &exitError{2, err}
				}
			} else if len(rep.Findings) == 0 {
				fmt.Fprintln(out, "clean: nothing found")
			} else {
				for _, fd := range rep.Findings {
					scope := fd.AggregateType
					if fd.Check != "" {
						scope = fd.Check
					}
					fmt.Fprintf(out, "%-14s %-12s %s\n", fd.Kind, scope, fd.Detail)
					if len(fd.IDs) > 0 {
						fmt.Fprintf(out, "%-14s %-12s ids: %s\n", "", "", strings.Join(fd.IDs, ", "))
					}
				}
			}
			if len(rep.Findings) > 0 {
				return &exitError{1, fmt.Errorf("%d finding(s)", len(rep.Findings))}
			}
			return nil
		},
	}
	f.registerPostgres(cmd)
	fl := cmd.Flags()
	fl.DurationVar(&cfg.PendingAfter, "pending-after", 5*time.Minute, "an event unpublished for longer is a finding")
	fl.DurationVar(&cfg.HeldAfter, "held-after", 15*time.Minute, "an aggregate held for longer is a finding")
	fl.DurationVar(&cfg.DeadLetterAfter, "dead-letter-after", time.Hour, "a dead letter older than this is a finding")
	fl.DurationVar(&cfg.Window, "window", 24*time.Hour, "how far back the checks, inboxes and version gaps look")
	fl.DurationVar(&cfg.Grace, "grace", 5*time.Minute, "how long a consumer may take to record a published event")
	fl.DurationVar(&cfg.Timeout, "timeout", 30*time.Second, "longest any one query may run")
	fl.StringVar(&cfg.VersionHeader, "version-header", "", "header holding each event's per-aggregate version; report jumps (off when empty)")
	fl.StringVar(&file, "config", "", `JSON file: {"checks": [{"name", "business", "events"}], "inboxes": [{"table", "consumer", "aggregate_types"}]}`)
	fl.BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}

// pgMigrated returns the error every command gives for a table that
// does not exist (outboxdriver.ErrNotMigrated) when t is not migrated.
func pgMigrated(ctx context.Context, pool *pgxpool.Pool, t outboxdriver.Table) error {
	var ok bool
	if err := pool.QueryRow(ctx, pgschema.MigratedSQL, pgschema.MigratedArgs(t)...).Scan(&ok); err != nil {
		return fmt.Errorf("reconcile: %s: %w", t, err)
	}
	if !ok {
		return driverkit.NotMigrated("outboxpgx", t)
	}
	return nil
}

// loadReconcileFile reads the checks and inboxes of a --config file into
// cfg; an empty path reads nothing.
func loadReconcileFile(path string, cfg *reconcile.Config) error {
	if path == "" {
		return nil
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	var rf reconcileFile
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rf); err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	for i, c := range rf.Checks {
		if c.Name == "" || strings.TrimSpace(c.Business) == "" || strings.TrimSpace(c.Events) == "" {
			return fmt.Errorf("--config %s: check %d needs a name, a business query and an events query", path, i)
		}
	}
	cfg.Checks, cfg.Inboxes = rf.Checks, rf.Inboxes
	return nil
}

// relayReconcile is `outbox relay --reconcile-every`: reconcile on a
// schedule inside the relay and export the findings as metrics.
type relayReconcile struct {
	every         time.Duration
	file          string
	versionHeader string
}

func (r *relayReconcile) register(cmd *cobra.Command) {
	cmd.Flags().DurationVar(&r.every, "reconcile-every", 0, "run outbox reconcile's checks this often inside the relay (PostgreSQL) and export the findings as metrics (off when 0)")
	cmd.Flags().StringVar(&r.file, "reconcile-config", "", "with --reconcile-every: the checks and inboxes file of outbox reconcile --config")
	cmd.Flags().StringVar(&r.versionHeader, "reconcile-version-header", "", "with --reconcile-every: as outbox reconcile --version-header")
}

// start checks the flags and, with --reconcile-every, starts reconciling
// in the background until ctx ends or stop is called; stop waits for it.
func (r *relayReconcile) start(ctx context.Context, cmd *cobra.Command, dbURL string, t outboxdriver.Table, reg prometheus.Registerer, log *slog.Logger) (stop func(), err error) {
	if r.every == 0 {
		for _, name := range []string{"reconcile-config", "reconcile-version-header"} {
			if cmd.Flags().Changed(name) {
				return nil, fmt.Errorf("--%s goes with --reconcile-every", name)
			}
		}
		return func() {}, nil
	}
	if err := durationIn("reconcile-every", r.every, time.Second, 0); err != nil {
		return nil, err
	}
	cfg := reconcile.Config{VersionHeader: r.versionHeader}
	if err := loadReconcileFile(r.file, &cfg); err != nil {
		return nil, fmt.Errorf("--reconcile-config: %w", err)
	}
	if u, err := url.Parse(dbURL); err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, errors.New("--reconcile-every reads PostgreSQL only")
	}
	pool, err := connectPostgres(ctx, dbURL, 2)
	if err != nil {
		return nil, err
	}
	if t.Schema == "" {
		t.Schema = "public"
	}
	findings := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "outbox_reconcile_findings",
		Help: "Findings of the last reconciliation, by kind and aggregate type or check (outbox reconcile)."}, []string{"kind", "scope"})
	lastRun := prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_reconcile_last_success_timestamp_seconds",
		Help: "When the last reconciliation completed."})
	failures := prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_reconcile_errors_total",
		Help: "Reconciliations that failed (a query that failed or ran too long)."})
	if reg != nil {
		reg.MustRegister(findings, lastRun, failures)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer pool.Close()
		tick := time.NewTicker(r.every)
		defer tick.Stop()
		for {
			rep, err := reconcile.Run(ctx, pool, t, &cfg)
			switch {
			case ctx.Err() != nil:
				return
			case err != nil:
				failures.Inc()
				log.Error("reconcile failed", "err", err)
			default:
				findings.Reset()
				for _, f := range rep.Findings {
					scope := f.AggregateType
					if f.Check != "" {
						scope = f.Check
					}
					findings.WithLabelValues(f.Kind, scope).Add(float64(f.Count))
					log.Warn("reconcile finding", "kind", f.Kind, "scope", scope, "count", f.Count, "detail", f.Detail)
				}
				lastRun.SetToCurrentTime()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() { cancel(); <-done }, nil
}
