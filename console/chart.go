package console

import (
	"context"
	"fmt"
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

// chart is a server-drawn SVG line chart of the backlog and the publish
// rate over the last hour.
type chart struct {
	W, H                float64
	Backlog, Rate       string // polyline points
	MaxBacklog, MaxRate string
	Points              int
}

// newChart draws samples (oldest first) ending at now. The publish rate
// between two samples is what was inserted, less what the backlog grew
// by, less what was dead-lettered, per second.
func newChart(samples []outboxdriver.Sample, now time.Time) chart {
	c := chart{W: 640, H: 140, Points: len(samples)}
	if len(samples) < 2 {
		return c
	}
	start := now.Add(-chartWindow)
	x := func(at time.Time) float64 { return c.W * float64(at.Sub(start)) / float64(chartWindow) }
	rates := make([]float64, len(samples))
	var maxB, maxR float64 = 1, 1
	for i, sm := range samples {
		maxB = max(maxB, float64(sm.Backlog))
		if i == 0 {
			continue
		}
		p := samples[i-1]
		dt := sm.At.Sub(p.At).Seconds()
		if dt <= 0 {
			continue
		}
		published := float64((sm.LastSeq - p.LastSeq) - (sm.Backlog - p.Backlog) - (sm.DeadLetters - p.DeadLetters))
		rates[i] = max(published/dt, 0)
		maxR = max(maxR, rates[i])
	}
	var b, r strings.Builder
	for i, sm := range samples {
		fmt.Fprintf(&b, "%.1f,%.1f ", x(sm.At), c.H-c.H*float64(sm.Backlog)/maxB)
		if i > 0 {
			fmt.Fprintf(&r, "%.1f,%.1f ", x(sm.At), c.H-c.H*rates[i]/maxR)
		}
	}
	c.Backlog, c.Rate = strings.TrimSpace(b.String()), strings.TrimSpace(r.String())
	c.MaxBacklog, c.MaxRate = fmt.Sprintf("%.0f", maxB), fmt.Sprintf("%.1f/s", maxR)
	return c
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
