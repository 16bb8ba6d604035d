package bench

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxmysql"
	binlog "github.com/outboxkit/outbox/outboxmysql/cdc"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/route"
	"github.com/outboxkit/outbox/sink"
)

// Binlog is the binlog scenario, on MySQL/MariaDB (Config.MySQL): one
// relay draining a committed backlog of Config.Events events, by polling
// and then by tailing the binary log, and the commit-to-publish latency
// of each at a steady 200 events/s for Config.Duration, in one run on one
// table of its own, so that the binary log's figures come as ratios over
// polling's. The sink is a null one (it records the time of each
// publish): the figures are the database's and the relay's.
func Binlog(ctx context.Context, cfg Config) ([]Result, error) {
	if cfg.MySQL == nil || cfg.MySQLDSN == "" {
		return nil, errors.New("bench: the binlog scenario runs on MySQL/MariaDB: give --db mysql://user@host:3306/db")
	}
	if cfg.Events < 1 || cfg.Events > MaxEvents {
		return nil, fmt.Errorf("bench: events %d: use 1 to %d", cfg.Events, MaxEvents)
	}
	if cfg.Duration <= 0 {
		cfg.Duration = DefaultDuration
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	var sfx [4]byte
	rand.Read(sfx[:])
	tb := outboxdriver.Table{Name: "outbox_bench_" + hex.EncodeToString(sfx[:])}
	if err := cfg.MySQL.QueryRowContext(ctx, `SELECT DATABASE()`).Scan(&tb.Schema); err != nil {
		return nil, err
	}
	drv := outboxmysql.New(cfg.MySQL)
	if _, err := drv.Migrate(ctx, tb, nil); err != nil {
		return nil, err
	}
	defer drv.MigrateDown(context.WithoutCancel(ctx), tb, 0)
	b := &binlogBench{db: cfg.MySQL, dsn: cfg.MySQLDSN, tb: tb, cfg: cfg}
	ob, err := outbox.New(drv, &outbox.Config{Schema: tb.Schema, Table: tb.Name})
	if err != nil {
		return nil, err
	}
	b.ob = ob

	var out []Result
	var base Result
	for _, src := range []string{SourcePoll, "binlog"} {
		// Drain: the binary log relay streams from the position before the
		// backlog was written (a relay that was running), not from a
		// snapshot of the table.
		var s outboxdriver.Source
		if s, err = b.source(ctx, src, "drain"); err != nil {
			return nil, err
		}
		if err := b.fill(ctx, cfg.Events); err != nil {
			s.Close()
			return nil, err
		}
		fmt.Fprintf(cfg.Progress, "binlog: draining %d events by %s\n", cfg.Events, src)
		d, _, err := b.run(ctx, s, cfg.Events, nil)
		s.Close()
		if err != nil {
			return nil, err
		}
		r := Result{Scenario: "binlog", Case: "drain_" + src, Workers: 1, Unit: "event", Ops: int64(cfg.Events),
			Seconds: d.Seconds(), PerSecond: float64(cfg.Events) / d.Seconds()}
		if src == SourcePoll {
			base = r
		} else {
			r.VsBaseline = &Comparison{Case: base.Case, Ratio: r.PerSecond / base.PerSecond}
		}
		out = append(out, r)
	}
	var latBase Result
	for _, src := range []string{SourcePoll, "binlog"} {
		s, err := b.source(ctx, src, "latency")
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(cfg.Progress, "binlog: latency at 200 events/s for %s by %s\n", cfg.Duration, src)
		n := int(cfg.Duration.Seconds() * 200)
		d, rec, err := b.run(ctx, s, n, func(ctx context.Context, commits map[string]time.Time, mu *sync.Mutex) error {
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			for i := 0; i < n; i++ {
				<-tick.C
				e := outbox.Event{ID: uuid.Must(uuid.NewV7()).String(), AggregateType: "order", AggregateID: fmt.Sprint("a", i%50), Type: "Placed", Payload: []byte(`{"n":1}`)}
				tx, err := b.db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				if err := b.ob.WriteTx(ctx, tx, e); err != nil {
					tx.Rollback()
					return err
				}
				mu.Lock()
				commits[e.ID] = time.Now() // as the commit begins: nothing is published before
				mu.Unlock()
				if err := tx.Commit(); err != nil {
					return err
				}
			}
			return nil
		})
		s.Close()
		if err != nil {
			return nil, err
		}
		r := Result{Scenario: "binlog", Case: "latency_" + src, Workers: 1, Unit: "event", Ops: int64(n),
			Seconds: d.Seconds(), PerSecond: float64(n) / d.Seconds(), Latency: rec.Summary()}
		if src == SourcePoll {
			latBase = r
		} else {
			r.VsBaseline = &Comparison{Case: latBase.Case, Ratio: r.PerSecond / latBase.PerSecond,
				AddedP50: r.Latency.P50 - latBase.Latency.P50, AddedP99: r.Latency.P99 - latBase.Latency.P99}
		}
		out = append(out, r)
	}
	return out, nil
}

type binlogBench struct {
	db  *sql.DB
	dsn string
	tb  outboxdriver.Table
	cfg Config
	ob  *outbox.Outbox[*sql.Tx]
}

// source opens the relay's source: polling, or the binary log from the
// server's position now, as the streamer called name (one per phase, so
// that a phase does not read the events of the one before).
func (b *binlogBench) source(ctx context.Context, src, name string) (outboxdriver.Source, error) {
	sc := outboxdriver.SourceConfig{RelayName: "bench-" + src, Logger: slog.New(slog.DiscardHandler)}
	if src == SourcePoll {
		return outboxmysql.New(b.db).NewSource(b.tb, &sc)
	}
	s, err := binlog.NewSource(b.db, b.tb, &binlog.Config{DSN: b.dsn, Name: name, SourceConfig: sc})
	if err != nil {
		return nil, err
	}
	if err := s.Setup(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// fill commits n events, 500 a transaction.
func (b *binlogBench) fill(ctx context.Context, n int) error {
	for done := 0; done < n; {
		k := min(500, n-done)
		evs := make([]outbox.Event, k)
		for i := range evs {
			evs[i] = outbox.Event{AggregateType: "order", AggregateID: fmt.Sprint("a", (done+i)%50), Type: "Placed", Payload: []byte(`{"n":1}`)}
		}
		tx, err := b.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := b.ob.WriteTx(ctx, tx, evs...); err != nil {
			tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		done += k
	}
	return nil
}

// run runs a relay on src into a null sink until n events were published
// (at least once each), with write running beside it when given (its
// commit times give the latency); it returns the time from the start to
// the last publish.
func (b *binlogBench) run(ctx context.Context, src outboxdriver.Source, n int,
	write func(context.Context, map[string]time.Time, *sync.Mutex) error) (time.Duration, *Recorder, error) {
	snk := &timingSink{at: map[string]time.Time{}, done: make(chan struct{}), want: n}
	router, err := route.New(&route.Config{})
	if err != nil {
		return 0, nil, err
	}
	rl, err := relay.New(src, snk, &relay.Config{Router: router, PollInterval: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return 0, nil, err
	}
	t0 := time.Now()
	if err := rl.Start(ctx); err != nil {
		return 0, nil, err
	}
	defer rl.Stop(context.WithoutCancel(ctx))
	var mu sync.Mutex
	commits := map[string]time.Time{}
	werr := make(chan error, 1)
	if write != nil {
		go func() { werr <- write(ctx, commits, &mu) }()
	}
	written := write == nil
	select {
	case <-snk.done:
	case err := <-werr:
		written = true
		if err != nil {
			return 0, nil, err
		}
		select {
		case <-snk.done:
		case <-time.After(5 * time.Minute):
			return 0, nil, fmt.Errorf("bench: %d of %d events published within 5 minutes", snk.count(), n)
		}
	case <-time.After(10 * time.Minute):
		return 0, nil, fmt.Errorf("bench: %d of %d events published within 10 minutes", snk.count(), n)
	}
	d := snk.last.Sub(t0)
	rec := &Recorder{}
	if !written {
		if err := <-werr; err != nil {
			return 0, nil, err
		}
	}
	if write != nil {
		mu.Lock()
		snk.mu.Lock()
		for id, c := range commits {
			if p, ok := snk.at[id]; ok {
				rec.Record(p.Sub(c))
			}
		}
		snk.mu.Unlock()
		mu.Unlock()
	}
	return d, rec, nil
}

// timingSink acknowledges every message at once and records when it
// first saw each.
type timingSink struct {
	mu   sync.Mutex
	at   map[string]time.Time
	last time.Time
	want int
	done chan struct{}
}

func (s *timingSink) Publish(_ context.Context, msgs []sink.Message) []error {
	now := time.Now()
	s.mu.Lock()
	for _, m := range msgs {
		if _, ok := s.at[m.ID]; !ok {
			s.at[m.ID] = now
		}
	}
	if len(s.at) >= s.want && s.last.IsZero() {
		s.last = now
		close(s.done)
	}
	s.mu.Unlock()
	return make([]error, len(msgs))
}

func (s *timingSink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.at)
}

func (s *timingSink) Close() error { return nil }
