// Package deploy_test checks the shipped alert rules and dashboard against
// the metrics a real relay exports. promtool (Debian's prometheus package)
// checks and unit-tests the rules themselves: .ci/test runs it.
package deploy_test

import (
	"encoding/json"
	"io"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/contract"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/inboxprom"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxpgx/cdc"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/relayd"
	"github.com/outboxkit/outbox/sink/stdoutsink"
)

// exported opens a relay of each source (polling, and log tailing, whose
// slot gauges only it exports), and a polling one on a table partitioned
// by time (whose gauges only it exports), on a migrated table holding one unpublished
// event (so that the gauges by destination have a series) with a
// registry and a contract registry, as `outbox relay --metrics-addr
// --contracts` does, and returns the names of the series they export (a
// histogram's _bucket, _sum and _count). The relays are opened, not
// started: their registries hold every series already, and the
// log-tailing one makes no replication slot. It adds the series a
// consumer's inbox metrics export (inbox/inboxprom).
func exported(t *testing.T) map[string]bool {
	t.Helper()
	ctx := testenv.Context(t, time.Minute)
	pool := testenv.Pool(t)
	tb := testenv.Table(t, pool)
	drv := outboxpgx.New(pool)
	if _, err := drv.Migrate(ctx, tb, nil); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(drv, &outbox.Config{Schema: tb.Schema, Table: tb.Name})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Write(ctx, outbox.Event{AggregateType: "order", AggregateID: "1", Type: "Placed"}); err != nil {
		t.Fatal(err)
	}
	contracts, err := contract.Load("../contract/testdata/orders")
	if err != nil {
		t.Fatal(err)
	}
	if err := contracts.SetMissing(contract.MissingAllow); err != nil { // the event above has none
		t.Fatal(err)
	}
	// A table partitioned by time, whose gauges only a relay on it exports.
	byTime := outboxdriver.Table{Schema: tb.Schema, Name: "outbox_by_day"}
	if _, err := drv.Migrate(ctx, byTime, &outboxdriver.MigrateOptions{TimePartitions: outboxdriver.TimePartitionsDay}); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, c := range []struct {
		source string
		table  outboxdriver.Table
	}{{relayd.SourcePoll, tb}, {relayd.SourceCDC, tb}, {relayd.SourcePoll, byTime}} {
		source := c.source
		reg := prometheus.NewRegistry()
		rl, err := relayd.Open(ctx, testenv.DatabaseURL(), stdoutsink.New(io.Discard), &relayd.Options{Schema: c.table.Schema, Table: c.table.Name, Source: source, Registerer: reg,
			CDC:   cdc.Config{NoCreate: true}, // no slot on the shared database: the gauges exist without one
			Relay: relay.Config{Contracts: contracts}})
		if err != nil {
			t.Fatalf("open a relay with source %s: %v", source, err)
		}
		fams, err := reg.Gather()
		rl.Stop(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			names[f.GetName()] = true
			if f.GetType() == dto.MetricType_HISTOGRAM {
				for _, s := range []string{"_bucket", "_sum", "_count"} {
					names[f.GetName()+s] = true
				}
			}
		}
	}
	// A consumer's inbox metrics (inbox/inboxprom), after its first message.
	reg := prometheus.NewRegistry()
	im, err := inboxprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	im.Handled("billing", inbox.Processed, time.Millisecond)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		names[f.GetName()] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[f.GetName()+s] = true
			}
		}
	}
	for _, want := range []string{"inbox_dead_letters_total", "inbox_handle_seconds_bucket", "outbox_status_up", "outbox_drain_eta_seconds", "outbox_cdc_slot_lag_bytes", "outbox_time_partitions_kept"} {
		if !names[want] {
			t.Fatalf("the relays' registries lack %s: %v", want, slices.Sorted(maps.Keys(names)))
		}
	}
	return names
}

// metricsOf parses a PromQL expression and returns the metric names its
// selectors name.
func metricsOf(t *testing.T, where, expr string) []string {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		t.Fatalf("%s: %q does not parse: %v", where, expr, err)
	}
	var names []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			names = append(names, vs.Name)
		}
		return nil
	})
	if len(names) == 0 {
		t.Fatalf("%s: %q names no metric", where, expr)
	}
	return names
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

type dashboard struct {
	Panels []struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

// Every metric the alert rules and the dashboard use is one a relay
// exports, and every alert carries a severity, a summary and a runbook
// link to a section that exists.
func TestRulesAndDashboardUseExportedMetrics(t *testing.T) {
	names := exported(t)
	used := map[string][]string{} // metric -> where
	check := func(where, expr string) {
		for _, n := range metricsOf(t, where, expr) {
			used[n] = append(used[n], where)
		}
	}

	raw, err := os.ReadFile("prometheus/outbox-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules ruleFile
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatal(err)
	}
	runbooks, err := os.ReadFile("../docs/runbooks.md")
	if err != nil {
		t.Fatal(err)
	}
	var alerts int
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			alerts++
			check("alert "+r.Alert, r.Expr)
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("alert %s: severity %q, want critical or warning", r.Alert, s)
			}
			if r.Annotations["summary"] == "" {
				t.Errorf("alert %s has no summary", r.Alert)
			}
			anchor := "#" + strings.ToLower(r.Alert)
			if u := r.Annotations["runbook_url"]; !strings.HasSuffix(u, "/docs/runbooks.md"+anchor) {
				t.Errorf("alert %s: runbook_url %q, want one ending in docs/runbooks.md%s", r.Alert, u, anchor)
			}
			if !strings.Contains(string(runbooks), "\n## "+r.Alert+"\n") {
				t.Errorf("alert %s: docs/runbooks.md has no section \"## %s\"", r.Alert, r.Alert)
			}
		}
	}
	if alerts < 7 {
		t.Fatalf("read %d alerts from the rules, want the 7 shipped at least", alerts)
	}

	raw, err = os.ReadFile("grafana/outbox-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash dashboard
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	var targets int
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			targets++
			check("panel "+p.Title, tg.Expr)
		}
	}
	if targets == 0 {
		t.Fatal("the dashboard has no query")
	}
	labelValues := regexp.MustCompile(`^label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*),`)
	for _, v := range dash.Templating.List {
		if m := labelValues.FindStringSubmatch(v.Definition); m != nil {
			used[m[1]] = append(used[m[1]], "variable "+v.Name)
		}
	}

	for n, where := range used {
		if names[n] {
			continue
		}
		t.Errorf("%s is used by %s but no relay or consumer exports it", n, strings.Join(where, ", "))
	}
}

// The metrics table of docs/operations.md lists every outbox_ metric a
// polling relay with contracts exports, and nothing it does not.
func TestOperationsDocListsTheExportedMetrics(t *testing.T) {
	names := exported(t)
	raw, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	start := strings.Index(doc, "\n## Metrics\n")
	if start < 0 {
		t.Fatal(`docs/operations.md has no "## Metrics" section`)
	}
	section := doc[start+1:]
	if end := strings.Index(section[1:], "\n## "); end >= 0 {
		section = section[:end+1]
	}
	row := regexp.MustCompile("(?m)^\\| `(outbox_[a-z0-9_]+)` \\|")
	documented := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		documented[m[1]] = true
	}
	if len(documented) < 20 {
		t.Fatalf("read %d metrics from the table of docs/operations.md, want the 20 shipped at least", len(documented))
	}
	for n := range documented {
		if !names[n] {
			t.Errorf("docs/operations.md lists %s, which the relay does not export", n)
		}
	}
	for n := range names {
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")
		if strings.HasPrefix(n, "outbox_") && !documented[n] && !documented[base] {
			t.Errorf("the relay exports %s, which the metrics table of docs/operations.md does not list", n)
		}
	}
}
