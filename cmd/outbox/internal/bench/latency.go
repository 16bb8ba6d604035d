package bench

import (
	"encoding/json"
	"math"
	"slices"
	"time"
)

// Recorder collects latency samples and summarises them with exact
// percentiles. It keeps every sample (8 bytes each: a million operations
// take 8 MB). It is not safe for concurrent use: give each worker its own
// and Merge them.
type Recorder struct {
	samples []time.Duration
}

// Record adds one sample.
func (r *Recorder) Record(d time.Duration) { r.samples = append(r.samples, d) }

// Merge adds every sample of o.
func (r *Recorder) Merge(o *Recorder) { r.samples = append(r.samples, o.samples...) }

// Len is the number of samples.
func (r *Recorder) Len() int { return len(r.samples) }

// Summary sorts the samples and summarises them.
func (r *Recorder) Summary() Latency {
	s := r.samples
	if len(s) == 0 {
		return Latency{}
	}
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return Latency{
		Count: int64(len(s)),
		Mean:  sum / time.Duration(len(s)),
		P50:   percentile(s, 0.50),
		P90:   percentile(s, 0.90),
		P99:   percentile(s, 0.99),
		Max:   s[len(s)-1],
	}
}

// percentile returns the nearest-rank p-quantile of the sorted samples s:
// the smallest sample that at least p of all samples do not exceed.
func percentile(s []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// Latency summarises the latencies of a cell's measured operations. In
// JSON every duration is a number of milliseconds.
type Latency struct {
	Count               int64
	Mean, P50, P90, P99 time.Duration
	Max                 time.Duration
}

type latencyJSON struct {
	Count  int64   `json:"count"`
	MeanMs float64 `json:"mean_ms"`
	P50Ms  float64 `json:"p50_ms"`
	P90Ms  float64 `json:"p90_ms"`
	P99Ms  float64 `json:"p99_ms"`
	MaxMs  float64 `json:"max_ms"`
}

// MarshalJSON writes the durations as milliseconds.
func (l Latency) MarshalJSON() ([]byte, error) {
	return json.Marshal(latencyJSON{l.Count, ms(l.Mean), ms(l.P50), ms(l.P90), ms(l.P99), ms(l.Max)})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (l *Latency) UnmarshalJSON(b []byte) error {
	var j latencyJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*l = Latency{Count: j.Count, Mean: fromMs(j.MeanMs), P50: fromMs(j.P50Ms), P90: fromMs(j.P90Ms), P99: fromMs(j.P99Ms), Max: fromMs(j.MaxMs)}
	return nil
}

// ms is d in milliseconds, rounded to the microsecond.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func fromMs(f float64) time.Duration { return time.Duration(math.Round(f * float64(time.Millisecond))) }
