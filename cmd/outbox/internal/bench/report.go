package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteJSON writes every result as one JSON object on its own line.
func WriteJSON(w io.Writer, results []Result) error {
	enc := json.NewEncoder(w)
	for i := range results {
		if err := enc.Encode(&results[i]); err != nil {
			return err
		}
	}
	return nil
}

// WriteTable prints results as an aligned table: a header describing the
// run (from the first result's Env), one row per result in the given order
// with the comparison to the baseline and every counter, then a legend of
// the cases.
func WriteTable(w io.Writer, results []Result) error {
	if len(results) == 0 {
		_, err := fmt.Fprintln(w, "no results")
		return err
	}
	first := results[0]
	if first.Retention != nil {
		return writeRetentionTable(w, results)
	}
	if first.Delivery != nil {
		return writeDeliveryTable(w, results)
	}
	if first.Console != nil {
		return writeConsoleTable(w, results)
	}
	var b strings.Builder
	if e := first.Env; e != nil {
		rounds := "in one round"
		if e.Rounds > 1 {
			rounds = fmt.Sprintf("in %d interleaved rounds of %s (alternating order), pooled", e.Rounds, seconds(e.DurationSeconds/float64(e.Rounds)))
		}
		fmt.Fprintf(&b, "scenario %s: %s measured per cell %s; %s warm-up before each round\n",
			first.Scenario, seconds(e.DurationSeconds), rounds, seconds(e.WarmupSeconds))
		fmt.Fprintf(&b, "PostgreSQL %s at %s: %s\n", e.ServerVersion, e.Host, e.SettingsLine())
		if e.SchemaVersion > 0 {
			fmt.Fprintf(&b, "outbox schema version %d\n", e.SchemaVersion)
		}
		clientLine(&b, e, "measurement")
		b.WriteString("\n")
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	return writeCellTable(w, results)
}

// clientLine describes the client machine, and whether every measurement
// began with a CHECKPOINT.
func clientLine(b *strings.Builder, e *Env, what string) {
	fmt.Fprintf(b, "client: %d CPUs (GOMAXPROCS %d), %s", e.CPUs, e.GOMAXPROCS, e.GoVersion)
	if e.LoadAvg != "" {
		fmt.Fprintf(b, ", load average %s at start", e.LoadAvg)
	}
	if e.Checkpoint {
		b.WriteString("; CHECKPOINT before every " + what)
	}
	b.WriteString("\n")
}

// writeCellTable prints the rows and legend of WriteTable for scenarios
// made of cells.
func writeCellTable(w io.Writer, results []Result) error {
	first := results[0]
	var b strings.Builder
	var counters []string
	for _, r := range results {
		for k := range r.Counters {
			if !slices.Contains(counters, k) {
				counters = append(counters, k)
			}
		}
	}
	slices.Sort(counters)

	// Numbers align right; the case column is padded so it reads left.
	width := len("case")
	for _, r := range results {
		width = max(width, len(r.Case))
	}
	left := func(s string) string { return s + strings.Repeat(" ", width-len(s)) }
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := []string{left("case"), "workers", first.Unit + "/s", "vs base", "p50 ms", "p99 ms", "max ms", "+p50 ms", "+p99 ms", "ratio IQR", "cpu", "top wait"}
	head = append(head, counters...)
	fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
	for _, r := range results {
		row := []string{left(r.Case), fmt.Sprint(r.Workers), fmt.Sprintf("%.0f", r.PerSecond)}
		if c := r.VsBaseline; c != nil {
			row = append(row, fmt.Sprintf("%.2f", c.Ratio))
		} else {
			row = append(row, "-")
		}
		row = append(row, fmtMs(r.Latency.P50), fmtMs(r.Latency.P99), fmtMs(r.Latency.Max))
		if c := r.VsBaseline; c != nil {
			row = append(row, signedMs(c.AddedP50), signedMs(c.AddedP99))
		} else {
			row = append(row, "-", "-")
		}
		if c := r.VsBaseline; c != nil && c.Case != r.Case {
			if lo, hi, ok := c.RatioQuartiles(); ok {
				row = append(row, fmt.Sprintf("%.2f-%.2f", lo, hi))
			} else {
				row = append(row, "-")
			}
		} else {
			row = append(row, "-")
		}
		if r.CPUBusy > 0 {
			row = append(row, fmt.Sprintf("%.0f%%", 100*r.CPUBusy))
		} else {
			row = append(row, "-")
		}
		if ev, share := TopWait(r.Waits); ev != "" {
			row = append(row, fmt.Sprintf("%s %.0f%%", ev, 100*share))
		} else {
			row = append(row, "-")
		}
		for _, k := range counters {
			if v, ok := r.Counters[k]; ok {
				row = append(row, fmt.Sprint(v))
			} else {
				row = append(row, "-")
			}
		}
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	b.Reset()
	b.WriteString("\n")
	writeDescriptions(&b, results)
	b.WriteString("  vs base: throughput over the baseline's at the same workers; +p50/+p99: latency added to the baseline's;\n")
	b.WriteString("  ratio IQR: quartiles of the per-round ratios to the baseline (half the rounds fell between);\n")
	b.WriteString("  cpu: busy share of the machine's CPUs; top wait: what the workers' backends were most often\n")
	b.WriteString("  doing while running a statement (pg_stat_activity samples; CPU = no wait event)\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// fmtMs renders d in milliseconds with three significant figures or so.
func fmtMs(d time.Duration) string {
	m := float64(d) / float64(time.Millisecond)
	switch a := max(m, -m); {
	case a < 10:
		return fmt.Sprintf("%.2f", m)
	case a < 100:
		return fmt.Sprintf("%.1f", m)
	default:
		return fmt.Sprintf("%.0f", m)
	}
}

func signedMs(d time.Duration) string {
	if d >= 0 {
		return "+" + fmtMs(d)
	}
	return fmtMs(d)
}

func seconds(s float64) string {
	return (time.Duration(s * float64(time.Second))).String()
}

// writeRetentionTable prints the retention scenario's results: a header
// describing the method, one row per mode, then a legend.
func writeRetentionTable(w io.Writer, results []Result) error {
	first := results[0]
	var b strings.Builder
	if e := first.Env; e != nil {
		fmt.Fprintf(&b, "scenario retention: a backlog of %d events drained per mode by one relay's SQL path (Claim + Finish as published, no broker), batches of %d",
			e.Events, e.Batch)
		if p := first.Retention.Partitions; p > 0 {
			fmt.Fprintf(&b, ", all %d partitions leased", p)
		}
		fmt.Fprintf(&b, "; kept rows cleaned up %d a call\n", e.CleanupLimit)
		switch e.Rounds {
		case 1:
			b.WriteString("one round: every mode in turn, each on a fresh backlog\n")
		default:
			fmt.Fprintf(&b, "%d rounds, each draining every mode on fresh backlogs in alternating order (delete first in odd rounds); figures are the median of the rounds", e.Rounds)
			if e.Rounds == 2 {
				b.WriteString(" (with two, their mean)")
			}
			b.WriteString(", every round's drain in \"rounds\"\n")
		}
		fmt.Fprintf(&b, "PostgreSQL %s at %s: %s\n", e.ServerVersion, e.Host, e.SettingsLine())
		if e.SchemaVersion > 0 {
			fmt.Fprintf(&b, "outbox schema version %d; autovacuum off for the scenario's tables, no VACUUM but one after the cleanup\n", e.SchemaVersion)
		}
		clientLine(&b, e, "drain and cleanup")
		b.WriteString("\n")
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}

	width := len("mode")
	for _, r := range results {
		width = max(width, len(r.Case))
	}
	left := func(s string) string { return s + strings.Repeat(" ", width-len(s)) }
	dash := func(ok bool, s string) string {
		if !ok {
			return "-"
		}
		return s
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := []string{left("mode"), first.Unit + "s/s", "rounds", "vs delete", "batch p50 ms", "batch p99 ms", "cpu",
		"filled MiB", "drained MiB", "dead after drain", "cleanup rows/s", "cleanup s", "cleaned MiB", "dead after cleanup", "vacuumed MiB", "dead after vacuum"}
	fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
	for _, r := range results {
		f := r.Retention
		if f == nil {
			f = &RetentionFigures{}
		}
		rounds := make([]string, len(r.RoundsPerSecond))
		for i, v := range r.RoundsPerSecond {
			rounds[i] = fmt.Sprintf("%.0f", v)
		}
		cleaned := f.CleanupRows > 0
		vs := "-"
		if c := r.VsBaseline; c != nil {
			vs = fmt.Sprintf("%.2f", c.Ratio)
		}
		row := []string{
			left(r.Case), fmt.Sprintf("%.0f", r.PerSecond), strings.Join(rounds, "/"),
			vs,
			fmtMs(r.Latency.P50), fmtMs(r.Latency.P99),
			dash(r.CPUBusy > 0, fmt.Sprintf("%.0f%%", 100*r.CPUBusy)),
			mibs(f.FilledBytes), mibs(f.BytesAfterDrain), fmt.Sprint(f.DeadTuplesAfterDrain),
			dash(cleaned, fmt.Sprintf("%.0f", f.CleanupPerSecond)), dash(cleaned, fmt.Sprintf("%.2f", f.CleanupSeconds)),
			dash(cleaned, mibs(f.BytesAfterCleanup)), dash(cleaned, fmt.Sprint(f.DeadTuplesAfterCleanup)),
			dash(cleaned, mibs(f.BytesAfterVacuum)), dash(cleaned, fmt.Sprint(f.DeadTuplesAfterVacuum)),
		}
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	b.Reset()
	b.WriteString("\n")
	for _, r := range results {
		if r.Description != "" {
			fmt.Fprintf(&b, "  %-*s  %s\n", width, r.Case, r.Description)
		}
	}
	b.WriteString("  events/s: events drained per second, from the first claim to the empty one; rounds: each round's;\n")
	b.WriteString("  vs delete: over delete's; batch p50/p99: one Claim + Finish; cpu: busy share of the machine's CPUs while draining;\n")
	b.WriteString("  MiB: pg_total_relation_size of the outbox table (heap, indexes, TOAST) once filled, drained, cleaned up;\n")
	b.WriteString("  MiB of a partitioned table: the sum over its partitions; vacuumed: after a VACUUM that follows the cleanup;\n")
	b.WriteString("  dead after drain/cleanup/vacuum: n_dead_tup of pg_stat_user_tables, all backends' statistics flushed\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// mibs renders a byte count in MiB, without the unit.
func mibs(b int64) string {
	return fmt.Sprintf("%.1f", float64(b)/(1<<20))
}

// writeDescriptions writes each case of results once, in order, with its
// description, the descriptions aligned after the longest case name.
func writeDescriptions(w io.Writer, results []Result) {
	width := 18
	for _, r := range results {
		width = max(width, len(r.Case))
	}
	var seen []string
	for _, r := range results {
		if r.Description == "" || slices.Contains(seen, r.Case) {
			continue
		}
		seen = append(seen, r.Case)
		fmt.Fprintf(w, "  %-*s %s\n", width, r.Case, r.Description)
	}
}
