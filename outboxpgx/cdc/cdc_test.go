package cdc_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
	"github.com/outboxkit/outbox/outboxpgx/cdc"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/route"
	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/natssink"
)

// cdcFixture is an outbox table of its own, relayed by log tailing into a
// JetStream stream of its own. Its replication slot and publication are
// dropped when the test ends: an orphaned slot would keep WAL for every
// later test.
type cdcFixture struct {
	t      *testing.T
	ctx    context.Context
	pool   *pgxpool.Pool
	tb     outboxdriver.Table
	drv    *outboxpgx.Driver
	js     jetstream.JetStream
	st     jetstream.Stream
	prefix string
	log    *slog.Logger
}

func newCDC(t *testing.T) *cdcFixture {
	t.Helper()
	f := &cdcFixture{t: t, ctx: testenv.Context(t, 2*time.Minute), pool: testenv.CDCPool(t)}
	f.tb = outboxdriver.Table{Schema: testenv.Name("t"), Name: "outbox"}
	f.drv = outboxpgx.New(f.pool)
	f.ddl(func() {
		if _, err := f.drv.Migrate(f.ctx, f.tb, nil); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(f.drop)
	_, f.js = testenv.JetStream(t)
	f.st, f.prefix = testenv.Stream(t, f.js)
	f.log = slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return f
}

// acquire leases the slot for src as the relay does: every partition the
// source's Heartbeat names, all under the slot's one lease.
func (f *cdcFixture) acquire(src *cdc.Source, ttl time.Duration) []outboxdriver.Lease {
	f.t.Helper()
	_, n, err := src.Heartbeat(f.ctx, ttl)
	if err != nil {
		f.t.Fatal(err)
	}
	leases, err := src.Acquire(f.ctx, n, ttl)
	if err != nil || len(leases) != n || n == 0 {
		f.t.Fatalf("acquire %d partitions = %v, %v", n, leases, err)
	}
	for _, l := range leases[1:] {
		if l.Epoch != leases[0].Epoch {
			f.t.Fatalf("acquire = %v: the slot's partitions under different epochs", leases)
		}
	}
	return leases
}

// ddl runs fn while no other log-tailing test runs DDL or creates a slot
// (testenv.CDCTurn).
func (f *cdcFixture) ddl(fn func()) { testenv.CDCTurn(f.t, f.pool, fn) }

// setup creates the table's publication and slot, as `outbox migrate
// --cdc` does.
func (f *cdcFixture) setup() {
	f.t.Helper()
	src := f.source("setup", nil)
	f.ddl(func() {
		if err := src.Setup(f.ctx); err != nil {
			f.t.Fatal(err)
		}
	})
}

type testLog struct{ t testing.TB }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func (f *cdcFixture) slot() string { return cdc.DefaultSlot(f.tb) }

// drop reverts the table's migrations, which drops its slot and
// publication (should that fail, it drops them by name), and drops the
// test's schema.
func (f *cdcFixture) drop() { f.ddl(f.dropNow) }

func (f *cdcFixture) dropNow() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	defer func() {
		if _, err := f.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+outboxdriver.QuoteIdent(f.tb.Schema)+` CASCADE`); err != nil {
			f.t.Logf("drop schema %s: %v", f.tb.Schema, err)
		}
	}()
	if _, err := f.drv.MigrateDown(ctx, f.tb, 0); err == nil {
		return
	} else {
		f.t.Logf("migrate down: %v; dropping slot %s by name", err, f.slot())
	}
	_, _ = f.pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active`, f.slot())
	for range 100 {
		_, err := f.pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, f.slot())
		if err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, _ = f.pool.Exec(ctx, `DROP PUBLICATION IF EXISTS `+outboxdriver.QuoteIdent(f.slot()))
}

// source returns a CDC source of the table under relay name name.
func (f *cdcFixture) source(name string, cfg *cdc.Config) *cdc.Source {
	f.t.Helper()
	c := cdc.Config{}
	if cfg != nil {
		c = *cfg
	}
	c.RelayName, c.Logger = name, f.log
	src, err := cdc.NewSource(f.pool, f.tb, &c)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { src.Close() })
	return src
}

// relay starts a relay over src into the fixture's stream; the returned
// func stops it (also run when the test ends).
func (f *cdcFixture) relay(src outboxdriver.Source, cfg relay.Config) func() {
	f.t.Helper()
	return f.relayInto(src, f.natsSink(), cfg)
}

// natsSink returns a sink into the fixture's stream.
func (f *cdcFixture) natsSink() *natssink.Sink {
	f.t.Helper()
	snk, err := natssink.New(f.js, &natssink.Config{Stream: f.prefix, NoCreateStream: true, Logger: f.log})
	if err != nil {
		f.t.Fatal(err)
	}
	return snk
}

// router routes every aggregate type into the fixture's stream.
func (f *cdcFixture) router() *route.Router {
	f.t.Helper()
	router, err := route.New(&route.Config{Replacement: f.prefix + ".${routedByValue}"})
	if err != nil {
		f.t.Fatal(err)
	}
	return router
}

// relayInto starts a relay over src into snk (routed by cfg.Router, by
// default into the fixture's stream); the returned func stops it and
// closes snk (also run when the test ends).
func (f *cdcFixture) relayInto(src outboxdriver.Source, snk sink.Sink, cfg relay.Config) func() {
	f.t.Helper()
	_, stop := f.startRelay(src, snk, cfg)
	return stop
}

// startRelay starts a relay over src into snk as relayInto does, logging
// to cfg.Logger when set (else the fixture's log), and returns it and
// its stop.
func (f *cdcFixture) startRelay(src outboxdriver.Source, snk sink.Sink, cfg relay.Config) (*relay.Relay, func()) {
	f.t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = f.log
	}
	if cfg.Router == nil {
		cfg.Router = f.router()
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = time.Second
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 200 * time.Millisecond
	}
	if cfg.RetryBase == 0 {
		cfg.RetryBase, cfg.RetryMax = 10*time.Millisecond, 50*time.Millisecond
	}
	rl, err := relay.New(src, snk, &cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	if err := rl.Start(f.ctx); err != nil {
		f.t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rl.Stop(ctx); err != nil {
			f.t.Errorf("stop relay: %v", err)
		}
		snk.Close()
	}
	f.t.Cleanup(stop)
	return rl, stop
}

// The write modes: rows, logical decoding messages, rows deleted again at
// once.
const (
	modeTable        = "table"
	modeMessage      = "message"
	modeInsertDelete = "insert+delete"
)

var modes = []string{modeTable, modeMessage, modeInsertDelete}

// writer returns an outbox writing in mode.
func (f *cdcFixture) writer(mode string) *outbox.Outbox[pgx.Tx] {
	f.t.Helper()
	ob, _ := f.writerAndDriver(mode)
	return ob
}

// writerAndDriver returns an outbox writing in mode, and its driver (on
// the fixture's pool).
func (f *cdcFixture) writerAndDriver(mode string) (*outbox.Outbox[pgx.Tx], *outboxpgx.Driver) {
	f.t.Helper()
	var opts []outboxpgx.Option
	switch mode {
	case modeMessage:
		opts = append(opts, outboxpgx.WithMessages())
	case modeInsertDelete:
		opts = append(opts, outboxpgx.WithInsertDelete())
	}
	drv := outboxpgx.New(f.pool, opts...)
	ob, err := outbox.New(drv, &outbox.Config{Schema: f.tb.Schema, Table: f.tb.Name})
	if err != nil {
		f.t.Fatal(err)
	}
	return ob, drv
}

// begin starts a transaction that writes events with ob.
func (f *cdcFixture) begin(ob *outbox.Outbox[pgx.Tx], events ...outbox.Event) pgx.Tx {
	f.t.Helper()
	tx, err := f.pool.Begin(f.ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { tx.Rollback(context.Background()) })
	if err := ob.WriteTx(f.ctx, tx, events...); err != nil {
		f.t.Fatal(err)
	}
	return tx
}

func (f *cdcFixture) commit(tx pgx.Tx) {
	f.t.Helper()
	if err := tx.Commit(f.ctx); err != nil {
		f.t.Fatal(err)
	}
}

// write commits events in one transaction of ob.
func (f *cdcFixture) write(ob *outbox.Outbox[pgx.Tx], events ...outbox.Event) {
	f.t.Helper()
	f.commit(f.begin(ob, events...))
}

func (f *cdcFixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.pool.Exec(f.ctx, sql, args...); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
}

// cdcEvent is an event with a fresh id.
func cdcEvent(agg string, n int) outbox.Event {
	return outbox.Event{ID: uuid.NewString(), AggregateType: "order", AggregateID: agg, Type: "Placed", Payload: fmt.Appendf(nil, `{"n": %d}`, n)}
}

// delivered returns the ids in the stream, in stream order.
func (f *cdcFixture) delivered() []string {
	f.t.Helper()
	var ids []string
	for _, m := range testenv.StreamMessages(f.t, f.st) {
		ids = append(ids, m.Header.Get("id"))
	}
	return ids
}

// waitFor waits until every id is in the stream and returns the stream's
// ids.
func (f *cdcFixture) waitFor(ids ...string) []string {
	f.t.Helper()
	var got []string
	await.Eventually(f.t, 30*time.Second, func() error {
		got = f.delivered()
		missing := 0
		for _, id := range ids {
			if !slices.Contains(got, id) {
				missing++
			}
		}
		if missing > 0 {
			return fmt.Errorf("%d of %d events not published", missing, len(ids))
		}
		return nil
	})
	return got
}

// eventually waits, for the fixture's 30s, until cond holds; what says
// what cond waits for.
func (f *cdcFixture) eventually(what string, cond func() bool) {
	f.t.Helper()
	await.Eventually(f.t, 30*time.Second, func() error {
		if !cond() {
			return errors.New("not so: " + what)
		}
		return nil
	})
}

// streamingRelay creates the publication and slot, starts relay r1 with
// the default configuration and waits until it streams the slot. It
// returns the relay's stop.
func (f *cdcFixture) streamingRelay() (stop func()) {
	f.t.Helper()
	f.setup()
	stop = f.relay(f.source("r1", nil), relay.Config{})
	f.streaming()
	return stop
}

// streaming waits until a relay streams the slot.
func (f *cdcFixture) streaming() {
	f.t.Helper()
	f.eventually("the slot is streamed", func() bool { return f.streamed() })
}

// streamed reports whether a walsender streams the slot: one that has
// started replication (catchup or streaming). A slot being created is
// active too, in the walsender of the creating session, which is in
// pg_stat_replication as well (in state startup).
func (f *cdcFixture) streamed() bool {
	var ok bool
	err := f.pool.QueryRow(f.ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots s
		JOIN pg_stat_replication r ON r.pid = s.active_pid WHERE s.slot_name = $1 AND r.state IN ('catchup', 'streaming'))`, f.slot()).Scan(&ok)
	return err == nil && ok
}

// count counts the rows of the table's companion with suffix.
func (f *cdcFixture) count(suffix string) int {
	f.t.Helper()
	var n int
	if err := f.pool.QueryRow(f.ctx, `SELECT count(*) FROM `+f.tb.Qualified(suffix)).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// Rows and messages of committed transactions are published, in commit
// order, and published rows are deleted; nothing of a rolled-back
// transaction is ever published. The committed marker written after the
// rollback is the proof: the stream is in commit order, so once the
// marker is out, a rolled-back event would have been out before it.
func TestCDCPublishesCommitsAndNeverRollbacks(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	f.streamingRelay()
	for _, mode := range modes {
		ob := f.writer(mode)
		kept, dropped, marker := cdcEvent("a", 1), cdcEvent("a", 2), cdcEvent("b", 3)
		f.write(ob, kept)
		tx := f.begin(ob, dropped)
		if err := tx.Rollback(f.ctx); err != nil {
			t.Fatal(err)
		}
		f.write(ob, marker)
		got := f.waitFor(kept.ID, marker.ID)
		if slices.Contains(got, dropped.ID) {
			t.Fatalf("%s mode: an event of a rolled-back transaction was published", mode)
		}
	}
	f.eventually("published rows are deleted", func() bool { return f.count("") == 0 })
}

// Each write path of each mode reaches the stream: an event queued in the
// pgx.Batch of the business statement (Outbox.Queue), and one sent with
// the COMMIT of an outboxpgx.Tx (Driver.Begin), as well as WriteTx.
func TestCDCWritePathsOfEveryMode(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	f.streamingRelay()
	for _, mode := range modes {
		ob, drv := f.writerAndDriver(mode)
		queued, withCommit, written := cdcEvent("q-"+mode, 1), cdcEvent("c-"+mode, 2), cdcEvent("w-"+mode, 3)

		tx, err := f.pool.Begin(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tx.Rollback(context.Background()) })
		var b pgx.Batch
		b.Queue(`SELECT 1`)
		if err := ob.Queue(f.ctx, &b, queued); err != nil {
			t.Fatal(err)
		}
		if err := tx.SendBatch(f.ctx, &b).Close(); err != nil {
			t.Fatalf("%s mode: the batch: %v", mode, err)
		}
		f.commit(tx)

		otx, err := drv.Begin(f.ctx, pgx.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { otx.Rollback(context.Background()) })
		if err := ob.WriteTx(f.ctx, otx, withCommit); err != nil {
			t.Fatal(err)
		}
		f.commit(otx)

		f.write(ob, written)
		got := f.waitFor(queued.ID, withCommit.ID, written.ID)
		if i, j, k := slices.Index(got, queued.ID), slices.Index(got, withCommit.ID), slices.Index(got, written.ID); i > j || j > k {
			t.Fatalf("%s mode: published out of commit order: %v", mode, got)
		}
	}
	f.eventually("published rows are deleted", func() bool { return f.count("") == 0 })
}

// A transaction that began first and commits last is published last:
// commit order, not insertion order, and not before its commit.
func TestCDCCommitOrderAcrossInterleavedTransactions(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	f.streamingRelay()
	for _, mode := range modes {
		ob := f.writer(mode)
		early, late := cdcEvent("k", 1), cdcEvent("k", 2)
		first := f.begin(ob, early) // begins first, commits last
		second := f.begin(ob, late)
		f.commit(second)
		got := f.waitFor(late.ID)
		if slices.Contains(got, early.ID) {
			t.Fatalf("%s mode: published before its transaction committed", mode)
		}
		f.commit(first)
		got = f.waitFor(early.ID)
		if slices.Index(got, late.ID) > slices.Index(got, early.ID) {
			t.Fatalf("%s mode: published %v, want the later commit last", mode, got)
		}
	}
}

// Prepared transactions are published at COMMIT PREPARED, never at
// PREPARE, and never after ROLLBACK PREPARED.
func TestCDCPreparedTransactions(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	f.streamingRelay()
	for _, mode := range modes {
		ob := f.writer(mode)
		committed, rolledBack := cdcEvent("p", 1), cdcEvent("q", 1)
		gids := [2]string{testenv.Name("gid"), testenv.Name("gid")}
		for i, e := range []outbox.Event{committed, rolledBack} {
			conn, err := f.pool.Acquire(f.ctx)
			if err != nil {
				t.Fatal(err)
			}
			// Released with its transaction open, a connection is closed,
			// which ends the transaction.
			t.Cleanup(conn.Release)
			tx, err := conn.Begin(f.ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := ob.WriteTx(f.ctx, tx, e); err != nil {
				t.Fatal(err)
			}
			// Before PREPARE: it may prepare on the server and still fail here.
			gid := gids[i]
			t.Cleanup(func() { f.pool.Exec(context.Background(), `ROLLBACK PREPARED '`+gid+`'`) })
			if _, err := conn.Exec(f.ctx, `PREPARE TRANSACTION '`+gid+`'`); err != nil {
				t.Fatalf("prepare: %v (max_prepared_transactions must be > 0)", err)
			}
			conn.Release()
		}
		marker := cdcEvent("m", 1)
		f.write(ob, marker)
		if got := f.waitFor(marker.ID); slices.Contains(got, committed.ID) || slices.Contains(got, rolledBack.ID) {
			t.Fatalf("%s mode: a prepared transaction was published before COMMIT PREPARED", mode)
		}
		f.exec(`ROLLBACK PREPARED '` + gids[1] + `'`)
		f.exec(`COMMIT PREPARED '` + gids[0] + `'`)
		marker2 := cdcEvent("m", 2)
		f.write(ob, marker2)
		if got := f.waitFor(committed.ID, marker2.ID); slices.Contains(got, rolledBack.ID) {
			t.Fatalf("%s mode: published an event after ROLLBACK PREPARED", mode)
		}
	}
}

// Rows written before the slot existed are not in its stream: the first
// start drains them from the table, then streams. Dropping the table's
// schema objects (migrate --down 0) drops the slot and the publication.
func TestCDCDrainsRowsWrittenBeforeTheSlotAndMigrateDownDropsIt(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	ob := f.writer(modeTable)
	var before []string
	for i := range 5 {
		e := cdcEvent(fmt.Sprint("d", i%2), i)
		f.write(ob, e)
		before = append(before, e.ID)
	}
	var stop func()
	f.ddl(func() { // the relay creates the slot
		stop = f.relay(f.source("r1", nil), relay.Config{})
		f.streaming()
	})
	after := cdcEvent("d0", 9)
	f.write(ob, after)
	got := f.waitFor(append(before, after.ID)...)
	if !slices.Equal(got[:len(before)], before) {
		t.Fatalf("drained %v, want %v first, in order", got[:len(before)], before)
	}
	f.eventually("published rows are deleted", func() bool { return f.count("") == 0 })
	f.eventually("the slot is recorded as drained", func() bool {
		var drained bool
		err := f.pool.QueryRow(f.ctx, `SELECT drained FROM `+f.tb.Qualified("_cdc")+` WHERE slot = $1`, f.slot()).Scan(&drained)
		return err == nil && drained
	})
	stop()
	f.ddl(func() {
		if _, err := f.drv.MigrateDown(f.ctx, f.tb, 0); err != nil {
			t.Fatal(err)
		}
	})
	var slots, pubs int
	if err := f.pool.QueryRow(f.ctx, `SELECT (SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1),
		(SELECT count(*) FROM pg_publication WHERE pubname = $1)`, f.slot()).Scan(&slots, &pubs); err != nil {
		t.Fatal(err)
	}
	if slots != 0 || pubs != 0 {
		t.Fatalf("after migrate --down 0: %d slot(s), %d publication(s) left", slots, pubs)
	}
}

// A message that does not follow the format is dead-lettered with its
// content, never dropped and never blocking the events behind it.
func TestCDCMalformedMessageIsDeadLettered(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	f.streamingRelay()
	f.exec(`SELECT pg_logical_emit_message(true, $1, 'not an event')`, outboxpgx.MessagePrefix(f.tb))
	marker := cdcEvent("m", 1)
	f.write(f.writer(modeMessage), marker)
	f.waitFor(marker.ID)
	f.eventually("the malformed message is dead-lettered", func() bool { return f.count("_dead_letter") == 1 })
	var raw []byte
	var lastErr string
	if err := f.pool.QueryRow(f.ctx, `SELECT payload_raw, last_error FROM `+f.tb.Qualified("_dead_letter")).Scan(&raw, &lastErr); err != nil {
		t.Fatal(err)
	}
	if string(raw) != "not an event" || !strings.Contains(lastErr, "not an outbox event message") {
		t.Fatalf("dead letter holds %q, %q", raw, lastErr)
	}
}

// A source closed without confirming (a relay that crashed before
// recording its batch) loses nothing: the next one streams the same events
// again from the slot's confirmed LSN.
func TestCDCResumesFromTheConfirmedLSN(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	// Nothing renews the lease: it must outlast a slow claim on a loaded
	// machine. The test ends it itself for the second relay.
	ttl := 30 * time.Second
	leased := map[*cdc.Source][]outboxdriver.Lease{}
	claimAll := func(src *cdc.Source, want int) (outboxdriver.Batch, []string) {
		t.Helper()
		leases, err := leased[src], error(nil)
		if leases == nil {
			leases = f.acquire(src, ttl)
			leased[src] = leases
		}
		var ids []string
		var b outboxdriver.Batch
		f.eventually(fmt.Sprintf("%d events claimed", want), func() bool {
			b, err = src.Claim(f.ctx, leases, 100)
			if err != nil {
				t.Logf("claim: %v", err)
				return false
			}
			ids = nil
			for _, r := range b.Records() {
				ids = append(ids, r.ID)
			}
			if len(ids) < want {
				b.Release(f.ctx)
				return false
			}
			return true
		})
		return b, ids
	}
	f.setup()
	src1 := f.source("r1", nil)
	first, _ := claimAll(src1, 0) // starts the stream: creates the slot
	first.Release(f.ctx)
	f.streaming()
	ob := f.writer(modeMessage)
	a, b := cdcEvent("a", 1), cdcEvent("b", 1)
	f.write(ob, a)
	f.write(ob, b)
	batch, ids := claimAll(src1, 2)
	if !slices.Equal(ids, []string{a.ID, b.ID}) {
		t.Fatalf("claimed %v, want %v", ids, []string{a.ID, b.ID})
	}
	// The first is published; the relay dies before recording the second.
	if err := batch.Finish(f.ctx, outboxdriver.Outcome{Published: []string{a.ID}}); err != nil {
		t.Fatal(err)
	}
	src1.Close() // without releasing the lease: as after a crash
	f.exec(`UPDATE `+f.tb.Qualified("_cdc")+` SET expires_at = now() WHERE slot = $1`, f.slot())
	src2 := f.source("r2", nil)
	batch, ids = claimAll(src2, 1)
	defer batch.Release(f.ctx)
	if !slices.Contains(ids, b.ID) {
		t.Fatalf("after the restart claimed %v: the unrecorded event is lost", ids)
	}
}

// A streamer that lost its lease cannot record or confirm: the new owner
// stops its connection to the slot, and its Finish fails with
// ErrLeaseLost, recording nothing.
func TestCDCStaleStreamerIsFenced(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	ttl := time.Second
	f.setup()
	src1, src2 := f.source("r1", nil), f.source("r2", nil)
	l1 := f.acquire(src1, ttl)
	if l, err := src2.Acquire(f.ctx, 1, ttl); err != nil || len(l) != 0 {
		t.Fatalf("a second relay acquired a held lease: %v, %v", l, err)
	}
	var b outboxdriver.Batch
	var err error
	e := cdcEvent("a", 1)
	wrote := false
	f.eventually("the event is claimed", func() bool {
		b, err = src1.Claim(f.ctx, l1, 10)
		if err != nil {
			t.Logf("claim: %v", err)
			return false
		}
		if !wrote {
			if len(b.Records()) == 0 {
				if f.streamed() {
					f.write(f.writer(modeTable), e)
					wrote = true
				}
			}
		}
		if len(b.Records()) == 0 {
			b.Release(f.ctx)
			return false
		}
		return true
	})
	var before string
	f.pool.QueryRow(f.ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, f.slot()).Scan(&before)
	// The lease expires (the relay paused); another relay takes the slot.
	f.exec(`UPDATE `+f.tb.Qualified("_cdc")+` SET expires_at = now() WHERE slot = $1`, f.slot())
	l2 := f.acquire(src2, ttl)
	if l2[0].Epoch <= l1[0].Epoch {
		t.Fatalf("takeover acquired %v after %v: no higher epoch", l2, l1)
	}
	var b2 outboxdriver.Batch
	f.eventually("the new owner claims the event", func() bool {
		b2, err = src2.Claim(f.ctx, l2, 10)
		if err != nil {
			t.Logf("claim: %v", err)
			return false
		}
		if len(b2.Records()) == 0 {
			b2.Release(f.ctx)
			return false
		}
		return true
	})
	defer b2.Release(f.ctx)
	if err := b.Finish(f.ctx, outboxdriver.Outcome{Published: []string{e.ID}}); !errors.Is(err, outboxdriver.ErrLeaseLost) {
		t.Fatalf("stale Finish = %v, want ErrLeaseLost", err)
	}
	if n := f.count(""); n != 1 {
		t.Fatalf("the stale streamer's Finish deleted the row (%d left)", n)
	}
	var after string
	f.pool.QueryRow(f.ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, f.slot()).Scan(&after)
	if after != before {
		t.Fatalf("the slot confirmed %s after the lease was lost (was %s)", after, before)
	}
}

// helperEnv makes the test binary run TestCDCHelperRelay as a relay
// process: "schema table stream relayname".
const helperEnv = "OUTBOX_TEST_CDC_RELAY"

// TestCDCHelperRelay is a relay process for the tests that kill one: run
// with helperEnv set, it relays a table by log tailing into a stream
// until it is killed. Without it, it does nothing.
func TestCDCHelperRelay(t *testing.T) {
	spec := strings.Fields(os.Getenv(helperEnv))
	if len(spec) != 4 && len(spec) != 5 {
		return
	}
	pool := testenv.CDCPool(t)
	_, js := testenv.JetStream(t)
	tb := outboxdriver.Table{Schema: spec[0], Name: spec[1]}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	src, err := cdc.NewSource(pool, tb, &cdc.Config{SourceConfig: outboxdriver.SourceConfig{RelayName: spec[3], Logger: log}})
	if err != nil {
		t.Fatal(err)
	}
	snk, err := natssink.New(js, &natssink.Config{Stream: spec[2], NoCreateStream: true, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	router, err := route.New(&route.Config{Replacement: spec[2] + ".${routedByValue}"})
	if err != nil {
		t.Fatal(err)
	}
	var through sink.Sink = snk
	if len(spec) == 5 && spec[4] == "poison" { // refuses "poison" for good
		through = &faultySink{Sink: snk, tried: map[string]bool{}}
	}
	rl, err := relay.New(src, through, &relay.Config{Router: router, Logger: log, LeaseTTL: time.Second, PollInterval: 200 * time.Millisecond, BatchSize: 20})
	if err != nil {
		t.Fatal(err)
	}
	if err := rl.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {} // until killed
}

// relayProcess is a relay in a process of its own (TestCDCHelperRelay).
type relayProcess struct {
	cmd *exec.Cmd
	out *testenv.Buffer
}

// startProcess starts a relay process named name; with "poison" in
// opts, its sink refuses events that say "poison" for good.
func (f *cdcFixture) startProcess(name string, opts ...string) *relayProcess {
	f.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCDCHelperRelay$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"="+strings.Join(append([]string{f.tb.Schema, f.tb.Name, f.prefix, name}, opts...), " "))
	p := &relayProcess{cmd: cmd, out: &testenv.Buffer{}}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() {
		p.kill()
		if f.t.Failed() {
			f.t.Logf("relay %s:\n%s", name, p.out.String())
		}
	})
	return p
}

// kill sends SIGKILL and reaps the process.
func (p *relayProcess) kill() {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Wait()
}

// owner returns the relay that holds the slot's lease (by the database
// clock), or "".
func (f *cdcFixture) owner() string {
	var owner string
	_ = f.pool.QueryRow(f.ctx, `SELECT coalesce(owner, '') FROM `+f.tb.Qualified("_cdc")+`
		WHERE slot = $1 AND expires_at > clock_timestamp()`, f.slot()).Scan(&owner)
	return owner
}

// The streamer is killed (SIGKILL) while writers commit rows and messages;
// the standby takes the slot over once the lease expired and resumes from
// the confirmed LSN: every committed event reaches the broker, each
// aggregate's events first in commit order, copies only with the same id.
func TestCDCKilledStreamerLosesNothingAndAStandbyTakesOver(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	f.ddl(func() {
		f.exec(`CREATE TABLE ` + f.tb.Qualified("_agg") + ` (id text PRIMARY KEY, v integer NOT NULL)`)
	})
	const aggregates, total = 8, 240
	for i := range aggregates {
		f.exec(`INSERT INTO `+f.tb.Qualified("_agg")+` VALUES ($1, 0)`, fmt.Sprint("agg", i))
	}
	f.setup()
	a := f.startProcess("a")
	f.eventually("relay a streams", func() bool { return f.owner() == "a" && f.streamed() })
	f.startProcess("b")

	// Writers: each transaction bumps its aggregate's version under the
	// row's lock, so versions are the aggregate's commit order, and writes
	// the event as a row or as a message.
	written := make(chan string, total)
	write := func(from, to int) {
		const writers = 4
		var wg sync.WaitGroup
		for w := range writers {
			wg.Go(func() {
				obs := []*outbox.Outbox[pgx.Tx]{f.writer(modeTable), f.writer(modeMessage), f.writer(modeInsertDelete)}
				for i := from + w; i < to; i += writers {
					agg := fmt.Sprint("agg", (i*7)%aggregates)
					err := pgx.BeginFunc(f.ctx, f.pool, func(tx pgx.Tx) error {
						var v int
						if err := tx.QueryRow(f.ctx, `UPDATE `+f.tb.Qualified("_agg")+` SET v = v + 1 WHERE id = $1 RETURNING v`, agg).Scan(&v); err != nil {
							return err
						}
						e := outbox.Event{ID: uuid.NewString(), AggregateType: "order", AggregateID: agg, Type: "Bumped", Payload: fmt.Appendf(nil, `{"v": %d}`, v)}
						written <- e.ID
						return obs[i%len(obs)].WriteTx(f.ctx, tx, e)
					})
					if err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
	}
	write(0, total/2)
	f.eventually("a sixth of the events published", func() bool {
		info, err := f.st.Info(f.ctx)
		return err == nil && info.State.Msgs >= total/6
	})
	a.kill() // mid-stream: the first half is not all published yet
	killed := time.Now()
	done := make(chan struct{})
	go func() { defer close(done); write(total/2, total) }() // while b takes over
	f.eventually("relay b takes the slot over", func() bool { return f.owner() == "b" && f.streamed() })
	if d := time.Since(killed); d > 5*time.Second {
		t.Errorf("relay b took over %s after relay a died; the lease TTL is 1s", d)
	}
	<-done
	close(written)
	var ids []string
	for id := range written {
		ids = append(ids, id)
	}
	f.waitFor(ids...)
	last := map[string]int{}
	seen := map[string]bool{}
	for _, m := range testenv.StreamMessages(t, f.st) {
		id := m.Header.Get("id")
		if seen[id] {
			continue // a copy: the same id
		}
		seen[id] = true
		var body struct{ V int }
		if err := json.Unmarshal(m.Data, &body); err != nil {
			t.Fatal(err)
		}
		key := m.Header.Get(natssink.KeyHeader)
		if body.V <= last[key] {
			t.Fatalf("aggregate %s: version %d published after %d", key, body.V, last[key])
		}
		last[key] = body.V
	}
	// Rows published by a and not yet recorded came again to b, which
	// recorded them: none is left behind.
	f.eventually("published rows are deleted", func() bool { return f.count("") == 0 })
}

// PostgreSQL sends a transaction to the stream once its commit is in the
// WAL, a moment before other sessions see it. Recording a published row
// of a transaction not visible yet is refused (and tried again by the
// streamer) rather than skipped, which would leave the row in the table
// for good; a row that is gone (insert+delete) is fine.
func TestCDCMarkWaitsForVisibility(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	mark := `SELECT ` + f.tb.Qualified("_cdc_mark") + `($1::uuid[], $2::bigint[], false)`
	e := cdcEvent("a", 1)
	tx := f.begin(f.writer(modeTable), e)
	var xid int64
	if err := tx.QueryRow(f.ctx, `SELECT pg_current_xact_id()::text::bigint & 4294967295`).Scan(&xid); err != nil {
		t.Fatal(err)
	}
	_, err := f.pool.Exec(f.ctx, mark, []string{e.ID}, []int64{xid})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Hint != "outbox-not-visible" {
		t.Fatalf("mark of a row not visible yet = %v, want a refusal", err)
	}
	f.commit(tx)
	f.exec(mark, []string{e.ID, uuid.NewString()}, []int64{xid, xid})
	if n := f.count(""); n != 0 {
		t.Fatalf("%d rows left after mark", n)
	}
}

// faultySink fails, through a real sink, the events whose payload says
// so: "flaky" ones at their first attempt (a transient error), "poison"
// ones for good until cured.
type faultySink struct {
	sink.Sink
	mu    sync.Mutex
	tried map[string]bool
	cured atomic.Bool
}

func (s *faultySink) Publish(ctx context.Context, msgs []sink.Message) []error {
	errs := make([]error, len(msgs))
	var pass []sink.Message
	var at []int
	s.mu.Lock()
	for i, m := range msgs {
		switch {
		case strings.Contains(string(m.Value), "poison") && !s.cured.Load():
			errs[i] = sink.Permanent(errors.New("poison"))
		case strings.Contains(string(m.Value), "flaky") && !s.tried[m.ID]:
			s.tried[m.ID] = true
			errs[i] = errors.New("flaky")
		default:
			pass, at = append(pass, m), append(at, i)
		}
	}
	s.mu.Unlock()
	for j, err := range s.Sink.Publish(ctx, pass) {
		errs[at[j]] = err
	}
	return errs
}

// A failed event is retried before the later events of its aggregate; a
// poison event is dead-lettered and holds its aggregate (policy hold)
// while the others flow; retried by an operator, it comes back through
// the stream with its id and goes out first. Nothing is pinned once all
// is done: the slot confirms up to the last commit.
func TestCDCRetriesAndDeadLettersKeepAggregateOrder(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	f.setup()
	snk := &faultySink{Sink: f.natsSink(), tried: map[string]bool{}}
	rl, err := relay.New(f.source("r1", nil), snk, &relay.Config{Router: f.router(), Logger: f.log, LeaseTTL: time.Second,
		PollInterval: 100 * time.Millisecond, RetryBase: 10 * time.Millisecond, RetryMax: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := rl.Start(f.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rl.Stop(context.Background()) })
	f.streaming()
	ev := func(agg, body string) outbox.Event {
		return outbox.Event{ID: uuid.NewString(), AggregateType: "order", AggregateID: agg, Type: "T", Payload: []byte(`{"say": "` + body + `"}`)}
	}
	a1, a2, a3 := ev("a", "flaky"), ev("a", "2"), ev("a", "3")
	p1, p2, p3 := ev("p", "poison"), ev("p", "2"), ev("p", "3")
	b1, b2 := ev("b", "1"), ev("b", "2")
	table, message := f.writer(modeTable), f.writer(modeMessage)
	f.write(table, a1, p1, b1)
	f.write(message, a2, p2)
	f.write(table, a3, p3, b2)
	got := f.waitFor(a1.ID, a2.ID, a3.ID, b1.ID, b2.ID)
	before := func(x, y string) bool { return slices.Index(got, x) < slices.Index(got, y) }
	if !before(a1.ID, a2.ID) || !before(a2.ID, a3.ID) {
		t.Fatalf("aggregate a published out of order: %v", got)
	}
	f.eventually("p1 is dead-lettered and holds its aggregate", func() bool {
		return f.count("_dead_letter") == 1 && f.count("_held") == 1
	})
	if got := f.delivered(); slices.Contains(got, p1.ID) || slices.Contains(got, p2.ID) || slices.Contains(got, p3.ID) {
		t.Fatalf("an event of the held aggregate was published: %v", got)
	}
	snk.cured.Store(true)
	if ids, err := f.drv.RetryDeadLetters(f.ctx, f.tb, nil, outboxdriver.Acting{Name: "test"}); err != nil || len(ids) != 1 {
		t.Fatalf("retry dead letters = %v, %v", ids, err)
	}
	got = f.waitFor(p1.ID, p2.ID, p3.ID)
	if i1, i2, i3 := slices.Index(got, p1.ID), slices.Index(got, p2.ID), slices.Index(got, p3.ID); !(i1 < i2 && i2 < i3) {
		t.Fatalf("aggregate p published out of order after the retry: %v", got)
	}
	var last string
	if err := f.pool.QueryRow(f.ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&last); err != nil {
		t.Fatal(err)
	}
	f.eventually("the slot confirms up to the last commit", func() bool {
		var ok bool
		err := f.pool.QueryRow(f.ctx, `SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`, f.slot(), last).Scan(&ok)
		return err == nil && ok
	})
	f.eventually("nothing left in the table or held", func() bool { return f.count("") == 0 && f.count("_held") == 0 })
}

// A lost slot (dropped while no relay streamed it): in table mode the relay
// makes a new one and relays the rows still in the table first, so the
// rows committed meanwhile are not lost; in message mode, whose events
// lived only in the WAL, it refuses to go on and names the LSN.
func TestCDCLostSlot(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	stop := f.streamingRelay()
	first := cdcEvent("a", 1)
	f.write(f.writer(modeTable), first)
	f.waitFor(first.ID)
	stop()
	meanwhile := cdcEvent("a", 2)
	f.write(f.writer(modeTable), meanwhile)
	f.exec(`SELECT pg_drop_replication_slot($1)`, f.slot())

	src := f.source("r2", &cdc.Config{Mode: cdc.ModeMessages})
	leases := f.acquire(src, time.Second)
	f.eventually("message mode refuses the lost slot", func() bool {
		b, err := src.Claim(f.ctx, leases, 10)
		if err == nil {
			b.Release(f.ctx)
			return false
		}
		if !strings.Contains(err.Error(), "was dropped") || !strings.Contains(err.Error(), "after LSN") {
			t.Fatalf("claim = %v, want the lost slot named", err)
		}
		return true
	})
	if err := src.Release(f.ctx, leases, true); err != nil {
		t.Fatal(err)
	}

	f.ddl(func() { // the relay makes the slot again
		f.relay(f.source("r3", nil), relay.Config{})
		f.streaming()
	})
	after := cdcEvent("a", 3)
	f.write(f.writer(modeTable), after)
	got := f.waitFor(meanwhile.ID, after.ID)
	if slices.Index(got, meanwhile.ID) > slices.Index(got, after.ID) {
		t.Fatalf("published %v: the drained row after the streamed one", got)
	}
}
