package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// CPUTime is the CPU time of the whole machine, in clock ticks, as
// /proc/stat counts it.
type CPUTime struct {
	// Busy is user, system, interrupt time; Total adds idle, iowait and
	// steal.
	Busy, Total int64
}

// Sub returns c - o.
func (c CPUTime) Sub(o CPUTime) CPUTime { return CPUTime{c.Busy - o.Busy, c.Total - o.Total} }

// Add returns c + o.
func (c CPUTime) Add(o CPUTime) CPUTime { return CPUTime{c.Busy + o.Busy, c.Total + o.Total} }

// Fraction is Busy / Total, or 0 when nothing was measured.
func (c CPUTime) Fraction() float64 {
	if c.Total <= 0 {
		return 0
	}
	return float64(c.Busy) / float64(c.Total)
}

// readCPU reads the machine's CPU time, and false where there is no
// /proc/stat.
func readCPU() (CPUTime, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return CPUTime{}, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return CPUTime{}, false
	}
	var v [8]int64 // user nice system idle iowait irq softirq steal
	for i := range v {
		if v[i], err = strconv.ParseInt(f[i+1], 10, 64); err != nil {
			return CPUTime{}, false
		}
	}
	busy := v[0] + v[1] + v[2] + v[5] + v[6]
	return CPUTime{Busy: busy, Total: busy + v[3] + v[4] + v[7]}, true
}

// WaitSampler samples what a set of PostgreSQL backends (a scenario's
// workers) spend their time on: every interval, the wait event of each
// tracked backend that is running a statement, as "type:event" ("IO:WALSync",
// "Lock:object"), or "CPU" when it waits on nothing. Backends idle or idle
// in a transaction (waiting for the client) are not counted. It queries
// pg_stat_activity on a connection of its own.
type WaitSampler struct {
	conn     *pgx.Conn
	interval time.Duration
	pids     sync.Map // uint32 → struct{}

	mu     sync.Mutex
	counts map[string]int64
	err    error
}

// NewWaitSampler opens the sampler's connection with the pool's settings.
func NewWaitSampler(ctx context.Context, pool *pgxpool.Pool, interval time.Duration) (*WaitSampler, error) {
	if interval <= 0 {
		return nil, fmt.Errorf("bench: wait sampling interval %s must be positive", interval)
	}
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
	if err != nil {
		return nil, fmt.Errorf("bench: wait sampler connection: %w", err)
	}
	return &WaitSampler{conn: conn, interval: interval, counts: map[string]int64{}}, nil
}

// Track adds the backend pid to the sampled ones. It is cheap once pid is
// known, so a worker may call it on every operation.
func (s *WaitSampler) Track(pid uint32) {
	if _, ok := s.pids.Load(pid); !ok {
		s.pids.Store(pid, struct{}{})
	}
}

// Run samples until ctx ends. A query in flight then is finished, not
// cancelled, so the connection stays usable.
func (s *WaitSampler) Run(ctx context.Context) {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	var pids []int32
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pids = pids[:0]
		s.pids.Range(func(k, _ any) bool {
			pids = append(pids, int32(k.(uint32)))
			return true
		})
		if len(pids) == 0 {
			continue
		}
		if err := s.sample(context.WithoutCancel(ctx), pids); err != nil {
			s.mu.Lock()
			if s.err == nil {
				s.err = err
			}
			s.mu.Unlock()
			return
		}
	}
}

func (s *WaitSampler) sample(ctx context.Context, pids []int32) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rows, err := s.conn.Query(ctx, `SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU')
FROM pg_stat_activity WHERE pid = ANY($1) AND state = 'active'`, pids)
	if err != nil {
		return err
	}
	var ev string
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err = pgx.ForEachRow(rows, []any{&ev}, func() error {
		s.counts[ev]++
		return nil
	})
	return err
}

// Take returns the samples counted since the last Take, or the error that
// stopped sampling.
func (s *WaitSampler) Take() (map[string]int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, fmt.Errorf("bench: sample wait events: %w", s.err)
	}
	c := s.counts
	s.counts = map[string]int64{}
	return c, nil
}

// Close closes the sampler's connection.
func (s *WaitSampler) Close() { s.conn.Close(context.Background()) }

// TopWait returns the most frequent entry of waits and its share of all
// samples, or "" when there are none.
func TopWait(waits map[string]int64) (string, float64) {
	var top string
	var n, total int64
	for k, v := range waits {
		total += v
		if v > n || (v == n && k < top) {
			top, n = k, v
		}
	}
	if total == 0 {
		return "", 0
	}
	return top, float64(n) / float64(total)
}
