package console

import (
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/outboxdriver"
)

// The publish rate counts publishes only: a dead letter discarded, a
// retry (back with its position) and a replay (new positions, as many in
// the backlog) draw none; events that left the backlog without being
// dead-lettered do. The axes are labelled with what was measured, the
// times with quarter hours.
func TestChartRate(t *testing.T) {
	now := time.Date(2026, 3, 1, 10, 7, 0, 0, time.UTC)
	at := func(min int) time.Time { return now.Add(time.Duration(min-60) * time.Minute) }
	samples := []outboxdriver.Sample{
		{At: at(1), Backlog: 0, DeadLetters: 1000, LastSeq: 5000},
		{At: at(2), Backlog: 0, DeadLetters: 0, LastSeq: 5000, Discarded: 1000}, // a failure group discarded
		{At: at(3), Backlog: 2, DeadLetters: 0, LastSeq: 5002},                  // two inserts, no relay
		{At: at(4), Backlog: 3, DeadLetters: 0, LastSeq: 5004, Discarded: 1},    // two more; one dead-lettered and discarded
		{At: at(5), Backlog: 13, DeadLetters: 0, LastSeq: 5014},                 // a replay of 10
		{At: at(6), Backlog: 0, DeadLetters: 1, LastSeq: 5014},                  // a relay publishes 12, dead-letters 1
		{At: at(7), Backlog: 1, DeadLetters: 0, LastSeq: 5014},                  // a retry: back with its position
		{At: at(8), Backlog: 0, DeadLetters: 1, LastSeq: 5014},                  // dead-lettered again
		{At: at(9), Backlog: 0, DeadLetters: 1, LastSeq: 5014, Discarded: 1},    // discarded, audited before this sample saw it
		{At: at(10), Backlog: 0, DeadLetters: 0, LastSeq: 5014},                 // seen now: carried, not a publish
	}
	c := newChart(samples, now)
	// Published per interval: 0, 0, 0, 0, 12, 0, 0, 0 (-1, carried), 0.
	if c.PeakRate != "0.2/s" || c.LastRate != "0/s" || c.Discarded != 1002 {
		t.Fatalf("peak %s, latest %s, discarded %d; want peak 0.2/s (12 in a minute), latest 0/s, 1002 discarded", c.PeakRate, c.LastRate, c.Discarded)
	}
	if c.PeakBacklog != "13" || len(c.Counts) != 3 || c.Counts[2].Label != "20" || c.Rates[1].Label != "0.1/s" || c.Rates[2].Label != "0.2/s" || c.Rates[0].Label != "0/s" {
		t.Fatalf("axes: backlog peak %s, counts %+v, rates %+v", c.PeakBacklog, c.Counts, c.Rates)
	}
	var times []string
	for _, x := range c.Times {
		times = append(times, x.Label)
		if x.Pos < c.Left || x.Pos > c.Right {
			t.Fatalf("time label %+v outside the plot", x)
		}
	}
	if strings.Join(times, " ") != "09:15 09:30 09:45 10:00" {
		t.Fatalf("time labels %v", times)
	}
	// Nothing published: the peak is 0/s, not a floor.
	idle := newChart([]outboxdriver.Sample{{At: at(1), DeadLetters: 1}, {At: at(2), Discarded: 1}}, now)
	if idle.PeakRate != "0/s" || idle.Rates[2].Label != "1/s" {
		t.Fatalf("an idle outbox: peak %s, rate axis %+v", idle.PeakRate, idle.Rates)
	}
}
