package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/outboxkit/outbox/contract"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/relayd"
	"github.com/outboxkit/outbox/relayd/fleet"
	"github.com/outboxkit/outbox/route"
	"github.com/outboxkit/outbox/sink/sinkurl"
)

// fleetFlags are the flags of `outbox relay` that relay several outbox
// tables from one process: --db repeated, or --config.
type fleetFlags struct {
	dbs     []string
	config  string
	turns   int
	quantum int
	duty    float64
	window  time.Duration
}

func (fl *fleetFlags) register(cmd *cobra.Command, f *dbFlags) {
	cmd.Flags().StringArrayVar(&fl.dbs, "db", nil, dbHelp+"; repeat to relay several databases from one process")
	f.registerTable(cmd)
	cmd.Flags().StringVar(&fl.config, "config", "", "relay the sources this YAML file lists (docs/operations.md, One relay for many databases); SIGHUP reloads it")
	cmd.Flags().IntVar(&fl.turns, "publish-turns", fleet.DefaultBudgetTurns, "with several sources: publishes in flight at once across them")
	cmd.Flags().IntVar(&fl.quantum, "publish-quantum", fleet.DefaultBudgetQuantum, "with several sources: most messages one source publishes per turn while another has work")
	cmd.Flags().Float64Var(&fl.duty, "publish-duty", fleet.DefaultBudgetDuty, "with several sources: the share of the time a source of weight 1 may spend publishing while another has work, while it also claims at most 4 quanta at a time, one batch in flight (weight w: w times it; 1: no limit)")
	cmd.Flags().DurationVar(&fl.window, "publish-window", fleet.DefaultBudgetWindow, "with several sources: a source has work for this long after its last publish")
}

// mode sets f.db from a single --db and reports whether the flags ask for
// a fleet (several --db, or --config).
func (fl *fleetFlags) mode(cmd *cobra.Command, f *dbFlags) (bool, error) {
	if fl.config != "" && len(fl.dbs) > 0 {
		return false, errors.New("--config lists the databases: leave out --db")
	}
	fleet := fl.config != "" || len(fl.dbs) > 1
	if len(fl.dbs) == 1 {
		f.db = fl.dbs[0]
	}
	if !fleet {
		for _, name := range []string{"publish-turns", "publish-quantum", "publish-duty", "publish-window"} {
			if cmd.Flags().Changed(name) {
				return false, fmt.Errorf("--%s goes with several --db or --config", name)
			}
		}
		return false, nil
	}
	for _, name := range []string{"cdc-slot", "cdc-publication", "reconcile-every"} {
		if cmd.Flags().Changed(name) {
			return false, fmt.Errorf("--%s goes with a single --db", name)
		}
	}
	if err := firstError(intIn("publish-turns", fl.turns, 1, 1024), intIn("publish-quantum", fl.quantum, 1, 100_000),
		durationIn("publish-window", fl.window, time.Millisecond, 24*time.Hour)); err != nil {
		return false, err
	}
	if !(fl.duty > 0 && fl.duty <= 1) {
		return false, fmt.Errorf("--publish-duty %v: use more than 0 and at most 1", fl.duty)
	}
	return true, nil
}

// fleetRun is what `outbox relay` parsed, the defaults of every source.
type fleetRun struct {
	table outboxdriver.Table
	route route.Config
	sinks *sinkFlags
	// sinkOptions are the broker-specific options of every source's sink.
	sinkOptions sinkurl.Options
	ce          *cloudEventsFlags
	contracts   *contract.Registry
	template    relayd.Options
	ln          net.Listener
	grace       time.Duration
	log         *slog.Logger
}

// fleetFile is the YAML file --config names.
type fleetFile struct {
	// Sink is the sink of every source that names none.
	Sink    string        `yaml:"sink"`
	Sources []fleetSource `yaml:"sources"`
}

// fleetSource is one source of the file: where its table is, and what it
// changes of the command line's settings.
type fleetSource struct {
	Name             string   `yaml:"name"`
	DB               string   `yaml:"db"`
	Schema           string   `yaml:"schema"`
	Table            string   `yaml:"table"`
	Weight           int      `yaml:"weight"`
	Sink             string   `yaml:"sink"`
	Destination      string   `yaml:"destination"`
	RouteBy          string   `yaml:"route-by"`
	RouteRegex       string   `yaml:"route-regex"`
	RouteReplacement string   `yaml:"route-replacement"`
	HeaderColumns    []string `yaml:"header-columns"`
}

// readFleetFile reads and strictly decodes path: unknown keys are errors.
func readFleetFile(path string) (*fleetFile, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	var ff fleetFile
	if err := dec.Decode(&ff); err != nil {
		// One line: the decoder lists its complaints a line each.
		msg := strings.TrimPrefix(err.Error(), "yaml: unmarshal errors:\n")
		var parts []string
		for _, l := range strings.Split(msg, "\n") {
			if l = strings.TrimSpace(l); l != "" {
				parts = append(parts, l)
			}
		}
		return nil, fmt.Errorf("%s: %s", path, strings.Join(parts, "; "))
	}
	if len(ff.Sources) == 0 {
		return nil, fmt.Errorf("%s: no sources", path)
	}
	return &ff, nil
}

// sources builds the fleet's sources from --config, or from the --db
// flags.
func (fl *fleetFlags) sources(r *fleetRun) ([]fleet.Source, error) {
	if fl.config == "" {
		out := make([]fleet.Source, 0, len(fl.dbs))
		names := map[string]int{}
		for _, db := range fl.dbs {
			name := nameOfDB(db)
			if names[name]++; names[name] > 1 {
				name = fmt.Sprintf("%s-%d", name, names[name])
			}
			s, err := r.source(fleetSource{Name: name, DB: db})
			if err != nil {
				return nil, fmt.Errorf("--db %s: %w", redact(db), err)
			}
			out = append(out, s)
		}
		return out, nil
	}
	ff, err := readFleetFile(fl.config)
	if err != nil {
		return nil, err
	}
	out := make([]fleet.Source, 0, len(ff.Sources))
	for i, fs := range ff.Sources {
		if fs.Sink == "" {
			fs.Sink = ff.Sink
		}
		s, err := r.source(fs)
		if err != nil {
			return nil, fmt.Errorf("%s: source %d (%q): %w", fl.config, i+1, fs.Name, err)
		}
		out = append(out, s)
	}
	if err := fleet.CheckSources(out); err != nil {
		return nil, fmt.Errorf("%s: %w", fl.config, err)
	}
	return out, nil
}

// source builds one source: the command line's settings with fs's
// changes.
func (r *fleetRun) source(fs fleetSource) (fleet.Source, error) {
	o := r.template
	if fs.DB == "" {
		return fleet.Source{}, errors.New("no db")
	}
	t := r.table
	if fs.Schema != "" {
		t.Schema = fs.Schema
	}
	if fs.Table != "" {
		t.Name = fs.Table
	}
	check := t.WithDefaults()
	if err := check.Validate(); err != nil {
		return fleet.Source{}, err
	}
	o.Schema, o.Table = t.Schema, t.Name
	sf := *r.sinks
	if fs.Sink != "" {
		sf.url = fs.Sink
	}
	sinkURL, err := sf.sinkURL()
	if err != nil {
		return fleet.Source{}, err
	}
	rc := r.route
	if fs.Destination != "" {
		rc.Destination, rc.RouteBy, rc.Regex, rc.Replacement = fs.Destination, "", "", ""
	}
	if fs.RouteBy != "" || fs.RouteRegex != "" || fs.RouteReplacement != "" {
		if fs.Destination != "" {
			return fleet.Source{}, errors.New("destination sends every event to one destination: leave out route-by, route-regex and route-replacement")
		}
		rc.Destination = ""
		if rc.RouteBy == "" && rc.Regex == "" && rc.Replacement == "" {
			rc.RouteBy, rc.Regex, rc.Replacement = route.DefaultRouteBy, route.DefaultRegex, route.DefaultReplacement
		}
		if fs.RouteBy != "" {
			rc.RouteBy = fs.RouteBy
		}
		if fs.RouteRegex != "" {
			rc.Regex = fs.RouteRegex
		}
		if fs.RouteReplacement != "" {
			rc.Replacement = fs.RouteReplacement
		}
	}
	if fs.HeaderColumns != nil {
		rc.HeaderColumns = fs.HeaderColumns
	}
	if rc.CloudEvents, err = r.ce.config(&sf, t, r.contracts); err != nil {
		return fleet.Source{}, err
	}
	if o.Relay.Router, err = route.New(&rc); err != nil {
		return fleet.Source{}, fmt.Errorf("routing: %w", err)
	}
	if fs.Weight == 0 {
		fs.Weight = 1
	}
	// What the source was configured from, to tell a changed source on
	// reload; the weight changes in place.
	cfg := fs
	cfg.Weight = 0
	fingerprint, err := yaml.Marshal(cfg)
	if err != nil {
		return fleet.Source{}, err
	}
	return fleet.Source{Name: fs.Name, DB: fs.DB, Sink: sinkURL, SinkOptions: r.sinkOptions, Weight: fs.Weight, Options: o, Config: string(fingerprint)}, nil
}

// nameOfDB names a source given by --db after its database's host, port
// and name, without user or password.
func nameOfDB(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" && u.Path == "" {
		return "db"
	}
	name := strings.TrimPrefix(u.Host+u.Path, "/")
	var b strings.Builder
	for _, c := range name {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', strings.ContainsRune("_.:-", c):
			b.WriteRune(c)
		default:
			b.WriteByte('_')
		}
	}
	name = strings.TrimLeft(b.String(), "_.:-")
	if len(name) > 60 {
		name = name[:60]
	}
	if name == "" {
		return "db"
	}
	return name
}

// run relays the fleet until ctx ends; SIGHUP reloads --config.
func (fl *fleetFlags) run(ctx context.Context, cmd *cobra.Command, r fleetRun) error {
	srcs, err := fl.sources(&r)
	if err != nil {
		return err
	}
	if err := fleet.CheckSources(srcs); err != nil {
		return err
	}
	budget, err := fleet.NewBudget(fl.turns, fl.quantum)
	if err != nil {
		return err
	}
	if err := budget.Pace(fl.duty, fl.window); err != nil {
		return err
	}
	flt, err := fleet.New(&fleet.Options{Budget: budget, Metrics: r.ln != nil, Grace: r.grace, Logger: r.log})
	if err != nil {
		return err
	}
	// SIGHUP would end the process: take it before the fleet runs.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if r.ln != nil {
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		srv := serveHTTP(r.ln, prometheus.Gatherers{reg, flt}, r.log,
			fleetHealth(flt, false), fleetHealth(flt, true))
		defer srv.Close()
	}
	if err := flt.Start(ctx, srcs); err != nil {
		return err
	}
	names := make([]string, len(srcs))
	for i, s := range srcs {
		names[i] = s.Name
	}
	r.log.Info("relay starting", "sources", names, "publish_turns", fl.turns, "publish_quantum", fl.quantum)
	for {
		select {
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.Background(), r.grace)
			defer cancel()
			return flt.Stop(sctx)
		case <-hup:
			if fl.config == "" {
				r.log.Warn("relay fleet: SIGHUP ignored: the sources come from --db flags; use --config to reload them")
				continue
			}
			srcs, err := fl.sources(&r)
			if err == nil {
				err = flt.Reload(ctx, srcs)
			}
			if err != nil {
				r.log.Error("relay fleet: reload refused; the running sources are kept", "config", fl.config, "err", err)
			}
		}
	}
}

// fleetHealth serves /healthz (always 200 while the process runs) or
// /readyz (200 when every source is ready, 503 otherwise), one line per
// source; ?source=NAME reports that source alone.
func fleetHealth(flt *fleet.Fleet, readiness bool) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		hs := flt.Health()
		if name := req.URL.Query().Get("source"); name != "" {
			var one []fleet.SourceHealth
			for _, h := range hs {
				if h.Name == name {
					one = append(one, h)
				}
			}
			if len(one) == 0 {
				http.Error(w, "no source "+name, http.StatusNotFound)
				return
			}
			hs = one
		}
		var b strings.Builder
		ready := len(hs) > 0
		for _, h := range hs {
			fmt.Fprintf(&b, "source %s %s", h.Name, strings.ReplaceAll(h.State, " ", "-"))
			if h.Table != "" {
				fmt.Fprintf(&b, " table=%s", h.Table)
			}
			if h.Err != "" && h.State == fleet.SourceStarting {
				fmt.Fprintf(&b, " err=%q", h.Err)
			}
			b.WriteByte('\n')
			ready = ready && h.State == fleet.SourceReady
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if readiness && !ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprint(w, b.String())
	}
}

// fleetStatus prints the status of every source the configuration file
// at path lists. A source that cannot be read is reported as such and the
// others still are; the command then fails.
func fleetStatus(cmd *cobra.Command, f *dbFlags, path string, asJSON bool) error {
	ff, err := readFleetFile(path)
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	var failed []string
	for i, fs := range ff.Sources {
		if i > 0 && !asJSON {
			fmt.Fprintln(out)
		}
		sf := dbFlags{db: fs.DB, schema: f.schema, table: f.table}
		if fs.Schema != "" {
			sf.schema = fs.Schema
		}
		if fs.Table != "" {
			sf.table = fs.Table
		}
		err := errors.New("no db")
		if fs.DB != "" {
			err = sf.withDB(cmd, func(ctx context.Context, t outboxdriver.Table, db outboxdriver.Store) error {
				return printStatus(ctx, out, fs.Name, t, db, asJSON)
			})
		}
		if err != nil {
			failed = append(failed, fs.Name)
			if asJSON {
				line, _ := json.Marshal(map[string]string{"source": fs.Name, "error": err.Error()})
				fmt.Fprintf(out, "%s\n", line)
			} else {
				fmt.Fprintf(out, "source                    %s\nerror                     %s\n", fs.Name, err)
			}
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%s: cannot read the status of source(s) %s", path, strings.Join(failed, ", "))
	}
	return nil
}
