package cdc_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxpgx/cdc"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/route"
	"github.com/outboxkit/outbox/sink/stdoutsink"
)

// orderCheck is the "broker" of the large-transaction tests: the lines a
// stdoutsink writes, checked as they come and not kept, so the test's own
// memory stays small. Every event's payload is {"n": <its place>}; per key
// (aggregate) the n must grow.
type orderCheck struct {
	mu    sync.Mutex
	last  map[string]int
	count int
	err   error
	grew  chan struct{}
}

func newOrderCheck() *orderCheck {
	return &orderCheck{last: map[string]int{}, grew: make(chan struct{}, 1)}
}

func (c *orderCheck) Write(p []byte) (int, error) {
	var l struct {
		Key     string `json:"key"`
		Payload struct {
			N int `json:"n"`
		} `json:"payload"`
	}
	err := json.Unmarshal(p, &l)
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case err != nil:
		c.err = fmt.Errorf("line %q: %v", p, err)
	case l.Payload.N <= c.last[l.Key] && c.err == nil:
		c.err = fmt.Errorf("aggregate %s: n=%d published after n=%d", l.Key, l.Payload.N, c.last[l.Key])
	}
	c.last[l.Key] = l.Payload.N
	c.count++
	select {
	case c.grew <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (c *orderCheck) state() (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.count, c.err
}

// waitCount waits until n events were published, failing after d.
func (c *orderCheck) waitCount(t *testing.T, n int, d time.Duration) {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		got, err := c.state()
		if err != nil {
			t.Fatal(err)
		}
		if got >= n {
			return
		}
		select {
		case <-c.grew:
		case <-deadline.C:
			t.Fatalf("%d of %d events published after %s", got, n, d)
		}
	}
}

// heapPeak samples the live heap (runtime/metrics) until stopped and
// returns the largest sample.
func heapPeak() (stop func() uint64) {
	samples := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	done, out := make(chan struct{}), make(chan uint64)
	go func() {
		var peak uint64
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			metrics.Read(samples)
			peak = max(peak, samples[0].Value.Uint64())
			select {
			case <-tick.C:
			case <-done:
				out <- peak
				return
			}
		}
	}()
	return func() uint64 { close(done); return <-out }
}

// stdoutRelay starts a relay over src into a stdoutsink writing to w,
// routed by aggregate type.
func (f *cdcFixture) stdoutRelay(src *cdc.Source, w *orderCheck, cfg relay.Config) func() {
	f.t.Helper()
	router, err := route.New(&route.Config{})
	if err != nil {
		f.t.Fatal(err)
	}
	cfg.Router = router
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = 2 * time.Second
	}
	return f.relayInto(src, stdoutsink.New(w), cfg)
}

// bigRows and bigMessages write events n = $1 .. $2 of aggregates
// big0..big<$3-1> in one statement, as rows or as messages ($4 the prefix).
const (
	bigRows = `INSERT INTO %s (id, aggregatetype, aggregateid, type, payload)
SELECT gen_random_uuid(), 'order', 'big' || (i %% $3), 'Big', json_build_object('n', i)
FROM generate_series($1::int, $2::int) AS i`
	bigMessages = `SELECT count(pg_logical_emit_message(true, $4, json_build_object('v', 1, 'id', gen_random_uuid(),
    'aggregatetype', 'order', 'aggregateid', 'big' || (i % $3), 'type', 'Big', 'payload', json_build_object('n', i))::text))
FROM generate_series($1::int, $2::int) AS i`
)

// bigSQL returns the statement that writes events in mode (bigRows or
// bigMessages) and its arguments after the first three.
func (f *cdcFixture) bigSQL(mode string) (string, []any) {
	switch mode {
	case modeMessage:
		return bigMessages, []any{outboxpgx.MessagePrefix(f.tb)}
	default:
		return fmt.Sprintf(bigRows, f.tb.Qualified("")), nil
	}
}

// streamedTxns is how many transactions the slot streamed before their
// commit (pg_stat_replication_slots).
func (f *cdcFixture) streamedTxns() int64 {
	f.t.Helper()
	var n int64
	err := f.pool.QueryRow(f.ctx, `SELECT coalesce((SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = $1), 0)`, f.slot()).Scan(&n)
	if err != nil {
		f.t.Fatal(err)
	}
	return n
}

// A transaction of 1,000,000 events (largeTxEvents; 200,000 under the race
// detector; half of them rows of the table, half logical decoding
// messages, of the same aggregates) is streamed by
// PostgreSQL before its commit, published only after it, whole and in
// order (each aggregate's events in the order written, the transaction
// committed before it ahead of it and the one after behind it), while the
// relay's live heap stays far below what the transaction's events take in
// memory. (Insert+delete rows take the same path; the streamed tests below
// cover them.)
//
// Not parallel: the live heap is the whole test process's, and the other
// tests of the package running beside it added 10–40 MiB to it.
func TestCDCMillionEventTransaction(t *testing.T) {
	const n, aggs = largeTxEvents, 64
	f := newCDC(t)
	f.ctx = testenv.Context(t, 8*time.Minute)
	f.setup()
	check := newOrderCheck()
	// logical_decoding_work_mem at its minimum: the server streams the
	// transaction whatever its size (at the default 64MB, a transaction
	// of 200,000 small events may be decoded whole at its commit).
	f.stdoutRelay(f.smallWorkMemSource("r1", ""), check, relay.Config{})
	f.streaming()
	streamedBefore := f.streamedTxns()
	rows, _ := f.bigSQL(modeTable)
	msgs, prefix := f.bigSQL(modeMessage)

	// One event before, in a transaction of its own, of every aggregate:
	// n = 1 .. aggs. The large transaction's are aggs+1 .. aggs+n.
	f.exec(rows, 1, aggs, aggs)
	check.waitCount(t, aggs, 30*time.Second)

	peak := heapPeak()
	started := time.Now()
	tx, err := f.pool.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(f.ctx, rows, aggs+1, aggs+n/2, aggs); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(f.ctx, msgs, aggs+n/2+1, aggs+n, aggs, prefix[0]); err != nil {
		t.Fatal(err)
	}
	f.eventually("the transaction is streamed before its commit", func() bool { return f.streamedTxns() > streamedBefore })
	if got, _ := check.state(); got != aggs {
		t.Fatalf("%d events published before the commit, want %d", got, aggs)
	}
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	wrote := time.Since(started)
	// And one more of every aggregate after it.
	f.exec(rows, aggs+n+1, aggs+n+aggs, aggs)
	check.waitCount(t, n+2*aggs, 6*time.Minute)
	heap := peak()
	if got, err := check.state(); err != nil || got != n+2*aggs {
		t.Fatalf("published %d events (%v), want %d exactly", got, err, n+2*aggs)
	}
	t.Logf("written in %s, published %s after the commit; live heap peak %d MiB",
		wrote.Round(time.Millisecond), (time.Since(started) - wrote).Round(time.Millisecond), heap>>20)
	// The transaction's events take far more than this in memory: with
	// the parts turned off the relay's heap reached about 1 GiB for
	// 1,000,000 events (about 200 MiB for 200,000).
	const bound = 64 << 20
	if heap > bound {
		t.Fatalf("live heap reached %d MiB while relaying the transaction, want at most %d MiB", heap>>20, bound>>20)
	}
	f.eventually("published rows are deleted", func() bool { return f.count("") == 0 })
}

// smallWorkMem returns a CDC source whose replication connection sets
// logical_decoding_work_mem to its minimum (64kB): PostgreSQL streams
// every transaction larger than that before its commit.
func (f *cdcFixture) smallWorkMemSource(name, spillDir string) *cdc.Source {
	f.t.Helper()
	cfg := f.pool.Config().Copy()
	cfg.ConnConfig.RuntimeParams["logical_decoding_work_mem"] = "64kB"
	pool, err := pgxpool.NewWithConfig(f.ctx, cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(pool.Close)
	c := cdc.Config{SpillDir: spillDir}
	c.RelayName, c.Logger = name, f.log
	src, err := cdc.NewSource(pool, f.tb, &c)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { src.Close() })
	return src
}

// spillingRelay returns a fixture with its table set up and a relay
// streaming its slot whose replication connection streams every
// transaction over 64kB before its commit (smallWorkMemSource); the relay
// spills those to dir and publishes to check. stop stops the relay.
func spillingRelay(t *testing.T) (f *cdcFixture, check *orderCheck, dir string, stop func()) {
	f = newCDC(t)
	f.setup()
	check = newOrderCheck()
	dir = t.TempDir()
	stop = f.stdoutRelay(f.smallWorkMemSource("r1", dir), check, relay.Config{})
	f.streaming()
	return f, check, dir, stop
}

// waitSpilled waits until the relay holds a spill file in dir: a
// transaction still open was streamed to it.
func (f *cdcFixture) waitSpilled(dir, what string) {
	f.t.Helper()
	f.eventually(what, func() bool {
		spills, _ := os.ReadDir(dir)
		return len(spills) > 0
	})
}

// published reports whether an event of aggregate key was published.
func (c *orderCheck) published(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.last[key]
	return ok
}

// Streamed transactions in all three write modes: one rolled back after
// PostgreSQL streamed it is never published; in one that commits, the
// events of a subtransaction rolled back after it was streamed are not
// published, and the others are, in order.
func TestCDCStreamedRollbacks(t *testing.T) {
	t.Parallel()
	const n = 2000 // far more than 64kB of changes
	f, check, dir, _ := spillingRelay(t)
	write := func(tx pgx.Tx, mode, agg string, from int) {
		t.Helper()
		sql, extra := f.bigSQL(mode)
		sql = strings.ReplaceAll(sql, `'big' || (i % $3)`, `$3::text`)
		if _, err := tx.Exec(f.ctx, sql, append([]any{from, from + n - 1, agg}, extra...)...); err != nil {
			t.Fatal(err)
		}
		if mode == modeInsertDelete {
			if _, err := tx.Exec(f.ctx, `DELETE FROM `+f.tb.Qualified("")+` WHERE aggregateid = $1`, agg); err != nil {
				t.Fatal(err)
			}
		}
	}
	streamed := func(before int64) {
		t.Helper()
		f.waitSpilled(dir, "the transaction is streamed before its end")
	}
	want := 0
	for _, mode := range modes {
		// Rolled back as a whole.
		before := f.streamedTxns()
		whole, err := f.pool.Begin(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { whole.Rollback(context.Background()) })
		write(whole, mode, "rolledback-"+mode, 1)
		streamed(before)
		if err := whole.Rollback(f.ctx); err != nil {
			t.Fatal(err)
		}
		// A subtransaction rolled back in one that commits.
		before = f.streamedTxns()
		tx, err := f.pool.Begin(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background())
		write(tx, mode, "kept-"+mode, 1)
		if _, err := tx.Exec(f.ctx, `SAVEPOINT s`); err != nil {
			t.Fatal(err)
		}
		write(tx, mode, "savepoint-"+mode, 1)
		streamed(before)
		if _, err := tx.Exec(f.ctx, `ROLLBACK TO SAVEPOINT s`); err != nil {
			t.Fatal(err)
		}
		write(tx, mode, "kept-"+mode, n+1)
		if err := tx.Commit(f.ctx); err != nil {
			t.Fatal(err)
		}
		want += 2 * n
		check.waitCount(t, want, 60*time.Second)
		if got, err := check.state(); err != nil || got != want {
			t.Fatalf("%s mode: published %d events (%v), want %d", mode, got, err, want)
		}
		for _, agg := range []string{"rolledback-" + mode, "savepoint-" + mode} {
			if check.published(agg) {
				t.Errorf("%s mode: published an event of a rolled-back (sub)transaction (%s)", mode, agg)
			}
		}
	}
}

// lockedLog is a log that a test reads back.
type lockedLog struct {
	mu  sync.Mutex
	buf strings.Builder
	t   testing.TB
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.t.Log(strings.TrimSpace(string(p)))
	return l.buf.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// lines counts the lines that contain s.
func (l *lockedLog) lines(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.buf.String(), s)
}

// A TRUNCATE of the outbox table and a change of its columns (DDL) are
// ignored with one log line each: events before and after them are
// published.
func TestCDCTruncateAndDDLAreLoggedAndIgnored(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	logged := &lockedLog{t: t}
	f.log = slog.New(slog.NewTextHandler(logged, &slog.HandlerOptions{Level: slog.LevelWarn}))
	f.streamingRelay()
	ob := f.writer(modeTable)
	before := cdcEvent("a", 1)
	f.write(ob, before)
	f.waitFor(before.ID)
	f.exec(`TRUNCATE ` + f.tb.Qualified(""))
	f.ddl(func() { f.exec(`ALTER TABLE ` + f.tb.Qualified("") + ` ADD COLUMN note text`) })
	after := []string{}
	for i := range 3 {
		e := cdcEvent("a", 2+i)
		f.write(ob, e)
		after = append(after, e.ID)
	}
	got := f.waitFor(after...)
	if !slices.Equal(got, append([]string{before.ID}, after...)) {
		t.Fatalf("published %v", got)
	}
	const truncated, changed = "ignored a TRUNCATE of the outbox table", "the outbox table's columns changed (DDL)"
	f.eventually("the TRUNCATE is logged", func() bool { return logged.lines(truncated) > 0 })
	if n, m := logged.lines(truncated), logged.lines(changed); n != 1 || m != 1 {
		t.Fatalf("logged the TRUNCATE %d times and the DDL %d times, want once each", n, m)
	}
}

// A relay restarted while a long transaction is open (it began, and was
// partly streamed, before the restart, and commits after it) publishes
// it once, whole, in commit order: behind a transaction that began after
// it and committed before it, ahead of one after it. The stopped relay's
// spill file is gone.
func TestCDCRelayRestartedDuringAnOpenTransaction(t *testing.T) {
	t.Parallel()
	const n = 2000
	f, check, dir, stop := spillingRelay(t)
	rows, _ := f.bigSQL(modeTable)
	msgs, prefix := f.bigSQL(modeMessage)
	one := strings.ReplaceAll(rows, `'big' || (i % $3)`, `$3::text`)
	oneMsg := strings.ReplaceAll(msgs, `'big' || (i % $3)`, `$3::text`)

	long, err := f.pool.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer long.Rollback(context.Background())
	if _, err := long.Exec(f.ctx, one, 2, n+1, "long"); err != nil {
		t.Fatal(err)
	}
	if _, err := long.Exec(f.ctx, oneMsg, n+2, 2*n+1, "long", prefix[0]); err != nil {
		t.Fatal(err)
	}
	f.waitSpilled(dir, "the open transaction is streamed to the relay")
	f.exec(one, 1, 1, "long") // begins after it, commits before it
	check.waitCount(t, 1, 30*time.Second)
	stop()
	if spills, _ := os.ReadDir(dir); len(spills) != 0 {
		t.Fatalf("%d spill files left after the relay stopped", len(spills))
	}
	f.stdoutRelay(f.smallWorkMemSource("r2", dir), check, relay.Config{})
	f.streaming()
	if err := long.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	f.exec(one, 2*n+2, 2*n+2, "long")
	check.waitCount(t, 2*n+2, 60*time.Second)
	f.eventually("the spill file is removed", func() bool {
		spills, _ := os.ReadDir(dir)
		return len(spills) == 0
	})
	if got, err := check.state(); err != nil || got != 2*n+2 {
		t.Fatalf("published %d events (%v), want %d, each once, in commit order", got, err, 2*n+2)
	}
}

// dropSlotWhileStreamed drops the table's slot under the relay that
// streams it: its walsender is terminated, and the slot dropped before the
// relay connects again. Both happen in one statement on the server (a
// loop that retries while the relay, reconnecting every few tens of
// milliseconds, got there first), so a busy machine's round trips cannot
// lose the race every time.
func (f *cdcFixture) dropSlotWhileStreamed() {
	f.t.Helper()
	f.eventually("the slot is dropped", func() bool {
		_, err := f.pool.Exec(f.ctx, `DO $$
DECLARE
	slot text := `+pgschema.QuoteLiteral(f.slot())+`;
BEGIN
	FOR i IN 1..200 LOOP
		-- Gone already: an earlier try dropped it, and the relay, seeing
		-- the slot active under another process, ended that try's
		-- session before it could answer.
		IF NOT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = slot) THEN
			RETURN;
		END IF;
		PERFORM pg_terminate_backend(active_pid, 5000) FROM pg_replication_slots WHERE slot_name = slot AND active;
		BEGIN
			PERFORM pg_drop_replication_slot(slot);
			RETURN;
		EXCEPTION WHEN object_in_use THEN
			PERFORM pg_sleep(0.005);
		END;
	END LOOP;
	RAISE EXCEPTION 'slot % stayed in use', slot;
END $$`)
		if err != nil {
			f.t.Logf("drop the slot: %v", err)
		}
		return err == nil
	})
}

// A slot dropped while it is streamed: in table mode the relay reports it,
// relays the rows still in the table, makes the slot again and streams on,
// losing nothing and keeping each aggregate's order, while writers write
// on; in message and insert+delete mode the writers are refused
// (outboxpgx.ErrNoSlot) once the slot is gone, and the relay stops with an
// error that names the LSN range at risk, and makes no slot.
func TestCDCSlotDroppedWhileStreaming(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			f := newCDC(t)
			logged := &lockedLog{t: t}
			f.log = slog.New(slog.NewTextHandler(logged, &slog.HandlerOptions{Level: slog.LevelWarn}))
			f.setup()
			cdcMode := map[string]cdc.Mode{modeTable: cdc.ModeTable, modeMessage: cdc.ModeMessages,
				modeInsertDelete: cdc.ModeInsertDelete}[mode]
			f.ddl(func() { // the relay may make the slot again
				f.relay(f.source("r1", &cdc.Config{Mode: cdcMode}), relay.Config{})
				f.streaming()
			})
			ob := f.writer(mode)
			first := cdcEvent("a", 0)
			f.write(ob, first)
			f.waitFor(first.ID)

			// Writers write on while the slot is dropped; in message and
			// insert+delete mode they are refused once it is gone.
			var mu sync.Mutex
			written := map[string][]string{}
			var refused atomic.Bool
			stop, done := make(chan struct{}), make(chan struct{})
			var stopOnce sync.Once
			halt := func() { stopOnce.Do(func() { close(stop) }); <-done }
			t.Cleanup(halt) // the writer ends before the test does, even when it fails
			go func() {
				defer close(done)
				for i := 1; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					agg := []string{"a", "b"}[i%2]
					e := cdcEvent(agg, i)
					tx, err := f.pool.Begin(f.ctx)
					if err == nil {
						err = ob.WriteTx(f.ctx, tx, e)
					}
					if err == nil {
						err = tx.Commit(f.ctx)
					}
					if err != nil {
						if tx != nil {
							tx.Rollback(context.Background())
						}
						if mode != modeTable && errors.Is(err, outboxpgx.ErrNoSlot) {
							refused.Store(true)
							return
						}
						t.Errorf("write: %v", err)
						return
					}
					mu.Lock()
					written[agg] = append(written[agg], e.ID)
					mu.Unlock()
					time.Sleep(5 * time.Millisecond) // a steady trickle
				}
			}()
			f.ddl(func() {
				time.Sleep(100 * time.Millisecond) // some streamed before the drop
				f.dropSlotWhileStreamed()
				if mode == modeTable {
					f.streaming() // made again
				}
			})
			if mode == modeTable {
				time.Sleep(100 * time.Millisecond) // some written after it
			} else {
				f.eventually("the writer is refused", refused.Load)
			}
			halt()

			if mode != modeTable {
				want := "was dropped: events written as"
				f.eventually("the relay stops with an error naming the LSN range", func() bool {
					return logged.lines(want) > 0
				})
				if !strings.Contains(logged.String(), "(the WAL is at ") {
					t.Fatalf("the error does not name the end of the range:\n%s", logged.String())
				}
				var slots int
				if err := f.pool.QueryRow(f.ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, f.slot()).Scan(&slots); err != nil {
					t.Fatal(err)
				}
				if slots != 0 {
					t.Fatalf("%s mode: the relay made a new slot without the operator accepting the loss", mode)
				}
				return
			}
			var all []string
			for _, ids := range written {
				all = append(all, ids...)
			}
			got := f.waitFor(all...)
			for agg, ids := range written {
				// The first copy of each, in the order written.
				seen, order := map[string]bool{}, []string{}
				for _, id := range got {
					if slices.Contains(ids, id) && !seen[id] {
						seen[id] = true
						order = append(order, id)
					}
				}
				if !slices.Equal(order, ids) {
					t.Fatalf("aggregate %s published out of order", agg)
				}
			}
			if logged.lines("replication slot lost") != 1 {
				t.Fatalf("the lost slot was reported %d times, want once", logged.lines("replication slot lost"))
			}
			f.eventually("published rows are deleted", func() bool { return f.count("") == 0 })
			t.Logf("%d events written around the drop, all published", len(all))
		})
	}
}

// A delayed row inside a transaction large enough for PostgreSQL to
// stream it before its commit (so its events wait in a spill file) is
// not published before its deliver_at, and its aggregate's later event
// waits behind it; the transaction's other events go out at once.
func TestCDCStreamedTransactionKeepsDelays(t *testing.T) {
	t.Parallel()
	const n = 2000 // far more than 64kB of changes
	f, check, dir, _ := spillingRelay(t)
	table := f.tb.Qualified("")
	const delay = 6 * time.Second
	var due time.Time
	err := pgx.BeginFunc(f.ctx, f.pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(f.ctx, `INSERT INTO `+table+` (id, aggregatetype, aggregateid, type, payload, deliver_at)
VALUES (gen_random_uuid(), 'order', 'delayed', 'Placed', '{"n": 1}', clock_timestamp() + $1 * interval '1 millisecond')
RETURNING deliver_at`, delay.Milliseconds()).Scan(&due); err != nil {
			return err
		}
		sql, extra := f.bigSQL(modeTable)
		if _, err := tx.Exec(f.ctx, sql, append([]any{1, n, 10}, extra...)...); err != nil {
			return err
		}
		if _, err := tx.Exec(f.ctx, `INSERT INTO `+table+` (id, aggregatetype, aggregateid, type, payload)
VALUES (gen_random_uuid(), 'order', 'delayed', 'Paid', '{"n": 2}')`); err != nil {
			return err
		}
		f.waitSpilled(dir, "the transaction is streamed before its end")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	check.waitCount(t, n, 60*time.Second)
	if time.Now().Before(due) && check.published("delayed") {
		t.Fatalf("an event of the delayed aggregate was published before its deliver_at %s", due.Format(time.RFC3339Nano))
	}
	check.waitCount(t, n+2, 60*time.Second)
	if now := time.Now(); now.Before(due) {
		t.Fatalf("the delayed aggregate's events were published at %s, before their deliver_at %s", now.Format(time.RFC3339Nano), due.Format(time.RFC3339Nano))
	}
	if _, err := check.state(); err != nil {
		t.Fatal(err) // also: n=2 published before n=1
	}
}

// The warning that the server keeps WAL for slots without bound is logged
// once per source, however often the source checks the server, and only
// when the setting is unbounded.
func TestCDCUnboundedSlotWarningOncePerSource(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	logged := &lockedLog{t: t}
	f.log = slog.New(slog.NewTextHandler(logged, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var keep string
	if err := f.pool.QueryRow(f.ctx, `SELECT current_setting('max_slot_wal_keep_size')`).Scan(&keep); err != nil {
		t.Fatal(err)
	}
	src := f.source("checker", nil)
	for range 5 {
		if err := src.Check(f.ctx); err != nil {
			t.Fatal(err)
		}
	}
	want := 0
	if keep == "-1" {
		want = 1
	}
	if n := logged.lines("max_slot_wal_keep_size is unbounded"); n != want {
		t.Fatalf("max_slot_wal_keep_size = %s: the warning was logged %d times in five checks, want %d:\n%s", keep, n, want, logged)
	}
}
