package console

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
)

// SampleEvery is how often a console records a sample for the chart.
const SampleEvery = 15 * time.Second

// chartWindow is the time the overview's chart spans.
const chartWindow = time.Hour

// Sample records a sample of the table every SampleEvery until ctx ends;
// failures are logged. `outbox console` runs it beside the server.
func (s *Server) Sample(ctx context.Context) {
	t := time.NewTicker(SampleEvery)
	defer t.Stop()
	for {
		if err := s.SampleOnce(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("console: recording a sample failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// SampleOnce records one sample of the table now.
func (s *Server) SampleOnce(ctx context.Context) error { return s.ops.Sample(ctx) }

// chart is a server-drawn SVG line chart of the backlog (left axis) and
// the publish rate (right axis) over the last hour, with time labels.
type chart struct {
	W, H                   float64 // the drawing
	Left, Right, Top, Base float64 // the plot area's edges
	Backlog, Rate          string  // polyline points
	Times, Counts, Rates   []tick  // the axes' labels
	// PeakRate and LastRate are the highest and the newest publish rate
	// measured; PeakBacklog the highest backlog.
	PeakRate, LastRate, PeakBacklog string
	Points                          int
	Discarded                       int64 // dead letters discarded meanwhile, not counted as published
}

// tick is one label of an axis at Pos (x for time, y for values).
type tick struct {
	Pos   float64
	Label string
}

// newChart draws samples (oldest first) ending at now. The publish rate
// between two samples is the positions handed out (inserts), less what
// the backlog grew by, less what the dead letters grew by, less the dead
// letters discarded (the audit's discard rows), per second. A negative
// remainder (a discard audited before the sample saw it) is carried into
// the next interval rather than drawn.
func newChart(samples []outboxdriver.Sample, now time.Time) chart {
	c := chart{W: 720, H: 200, Left: 64, Right: 656, Top: 10, Base: 172, Points: len(samples)}
	start := now.Add(-chartWindow)
	x := func(at time.Time) float64 {
		return c.Left + (c.Right-c.Left)*float64(at.Sub(start))/float64(chartWindow)
	}
	for t := start.Truncate(15 * time.Minute); !t.After(now); t = t.Add(15 * time.Minute) {
		if !t.Before(start) {
			c.Times = append(c.Times, tick{x(t), t.UTC().Format("15:04")})
		}
	}
	if len(samples) < 2 {
		return c
	}
	rates := make([]float64, len(samples))
	var peakB, peakR, carry float64
	for i, sm := range samples {
		peakB = max(peakB, float64(sm.Backlog))
		if i == 0 {
			continue
		}
		p := samples[i-1]
		dt := sm.At.Sub(p.At).Seconds()
		if dt <= 0 {
			continue
		}
		c.Discarded += sm.Discarded
		published := float64((sm.LastSeq-p.LastSeq)-(sm.Backlog-p.Backlog)-(sm.DeadLetters-p.DeadLetters)-sm.Discarded) + carry
		carry = min(published, 0)
		rates[i] = max(published, 0) / dt
		peakR = max(peakR, rates[i])
	}
	topB, topR := niceCeil(peakB), niceCeil(peakR)
	y := func(v, top float64) float64 { return c.Base - (c.Base-c.Top)*v/top }
	for _, f := range []float64{0, 0.5, 1} {
		c.Counts = append(c.Counts, tick{y(topB*f, topB), countText(topB * f)})
		c.Rates = append(c.Rates, tick{y(topR*f, topR), tickRate(topR * f)})
	}
	var b, r strings.Builder
	for i, sm := range samples {
		fmt.Fprintf(&b, "%.1f,%.1f ", x(sm.At), y(float64(sm.Backlog), topB))
		if i > 0 {
			fmt.Fprintf(&r, "%.1f,%.1f ", x(sm.At), y(rates[i], topR))
		}
	}
	c.Backlog, c.Rate = strings.TrimSpace(b.String()), strings.TrimSpace(r.String())
	c.PeakBacklog, c.PeakRate, c.LastRate = countText(peakB), rateText(peakR), rateText(rates[len(rates)-1])
	return c
}

// niceCeil is the top of an axis that shows v: 1, 2, 2.5 or 5 times a
// power of ten, at least v (1 for nothing to show).
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// countText writes a count or an axis value: 950, 1.25, 12.5k, 1.5M.
func countText(v float64) string {
	switch {
	case v >= 1e6:
		return strconv.FormatFloat(v/1e6, 'g', 3, 64) + "M"
	case v >= 1e4:
		return strconv.FormatFloat(v/1e3, 'g', 3, 64) + "k"
	}
	return strconv.FormatFloat(math.Round(v*1000)/1000, 'f', -1, 64)
}

// tickRate writes an axis value in events per second.
func tickRate(v float64) string { return countText(v) + "/s" }

// rateText writes a measured rate in events per second, to two
// significant digits below 10: 0/s, 0.067/s, 4.1/s, 12/s, 1.2k/s.
func rateText(v float64) string {
	if v < 10 {
		return strconv.FormatFloat(v, 'g', 2, 64) + "/s"
	}
	return strconv.FormatFloat(math.Round(v), 'f', -1, 64) + "/s"
}

// with adds the insight to the overview: the registered relays (also
// those holding no partition) and the chart.
func (ov overview) with(in ops.Insight, now time.Time) overview {
	ov.Insight, ov.Chart = in, newChart(in.Samples, now)
	rows := map[string]int{}
	for i, r := range ov.Relays {
		rows[r.Name] = i
	}
	for i := range in.Relays {
		rel := &in.Relays[i]
		if j, ok := rows[rel.Name]; ok {
			ov.Relays[j].Registered = rel
		} else if rel.ExpiresIn > 0 {
			ov.Relays = append(ov.Relays, relayRow{Name: rel.Name, Registered: rel})
		}
	}
	return ov
}
