package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/faultproxy"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxpgx"
)

// fleetEnv is a set of migrated outbox tables (one schema each), a NATS
// stream, and a core subscription that sees every message the relay
// publishes to it.
type fleetEnv struct {
	pool      *pgxpool.Pool
	tables    []outboxdriver.Table
	sinkFlags []string
	prefix    string

	mu       sync.Mutex
	got      []fleetMsg
	bySource map[string]int
	written  map[string]time.Time // event id -> when its commit returned
	seq      map[int]int          // last trickle sequence number per table
}

// fleetMsg is one message the subscription saw.
type fleetMsg struct {
	source, agg, id string
	seq             int
	at              time.Time
}

func newFleetEnv(t *testing.T, n int) *fleetEnv {
	t.Helper()
	ctx := testenv.Context(t, time.Minute)
	pool := testenv.Pool(t)
	e := &fleetEnv{pool: pool, bySource: map[string]int{}, written: map[string]time.Time{}, seq: map[int]int{}}
	for range n {
		tb := testenv.Table(t, pool)
		ob, err := outbox.New(outboxpgx.New(pool), &outbox.Config{Schema: tb.Schema, Table: tb.Name})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ob.Migrate(ctx, nil); err != nil {
			t.Fatal(err)
		}
		e.tables = append(e.tables, tb)
	}
	_, js := testenv.JetStream(t)
	_, e.prefix = testenv.Stream(t, js)
	e.sinkFlags = []string{"--sink", testenv.NATSURL(), "--nats-stream", e.prefix, "--nats-no-create-stream",
		"--route-replacement", e.prefix + ".${routedByValue}"}
	// A connection per source: a flooded source's messages queue on its
	// own connection, not in front of the others'.
	for i := range n {
		nc, err := nats.Connect(testenv.NATSURL())
		if err != nil {
			t.Fatalf("connect to NATS: %v; %s", err, testenv.NATSHelp)
		}
		t.Cleanup(nc.Close)
		src := e.source(i)
		sub, err := nc.Subscribe(e.prefix+"."+src, func(m *nats.Msg) {
			at := time.Now()
			var p struct {
				Agg string `json:"agg"`
				Seq int    `json:"seq"`
			}
			_ = json.Unmarshal(m.Data, &p)
			e.mu.Lock()
			e.got = append(e.got, fleetMsg{source: src, agg: p.Agg, id: m.Header.Get("id"), seq: p.Seq, at: at})
			e.bySource[src]++
			e.mu.Unlock()
		})
		if err != nil {
			t.Fatal(err)
		}
		sub.SetPendingLimits(-1, -1)
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// source is the name (and aggregate type, and so subject) of table i.
func (e *fleetEnv) source(i int) string { return fmt.Sprintf("src%d", i) }

// config writes a configuration file with the sources i in which.
func (e *fleetEnv) config(t *testing.T, path string, which ...int) {
	t.Helper()
	e.configDB(t, path, map[int]string{}, which...)
}

// configDB is config with the database URLs in dbs for some sources.
func (e *fleetEnv) configDB(t *testing.T, path string, dbs map[int]string, which ...int) {
	t.Helper()
	var b strings.Builder
	b.WriteString("sources:\n")
	for _, i := range which {
		db := dbs[i]
		if db == "" {
			db = dbURL()
		}
		fmt.Fprintf(&b, "  - name: %s\n    db: %s\n    schema: %s\n    table: %s\n", e.source(i), db, e.tables[i].Schema, e.tables[i].Name)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

// write commits one event of aggregate agg with sequence number seq to
// table i, and notes when the commit returned.
func (e *fleetEnv) write(ctx context.Context, i int, agg string, seq int) error {
	id := uuid.Must(uuid.NewV7()).String()
	tb := e.tables[i]
	_, err := e.pool.Exec(ctx, `INSERT INTO `+outboxdriver.QuoteIdent(tb.Schema)+`.`+outboxdriver.QuoteIdent(tb.Name)+
		` (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, 'E', $4)`,
		id, e.source(i), agg, fmt.Sprintf(`{"agg": %q, "seq": %d}`, agg, seq))
	if err != nil {
		return err
	}
	e.mu.Lock()
	e.written[id] = time.Now()
	e.mu.Unlock()
	return nil
}

// flood commits n events to table i in one statement: aggs aggregates,
// sequence numbers 1..n in insertion order.
func (e *fleetEnv) flood(ctx context.Context, t *testing.T, i, n, aggs int) {
	t.Helper()
	tb := e.tables[i]
	_, err := e.pool.Exec(ctx, `INSERT INTO `+outboxdriver.QuoteIdent(tb.Schema)+`.`+outboxdriver.QuoteIdent(tb.Name)+
		` (id, aggregatetype, aggregateid, type, payload)
		SELECT gen_random_uuid(), $1, 'f' || (g % $3), 'E', json_build_object('agg', 'f' || (g % $3), 'seq', g)
		FROM generate_series(1, $2::int) AS g ORDER BY g`, e.source(i), n, aggs)
	if err != nil {
		t.Fatal(err)
	}
}

// count is how many messages of source src arrived.
func (e *fleetEnv) count(src string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.bySource[src]
}

// waitCount waits until source src has at least n messages.
func (e *fleetEnv) waitCount(t *testing.T, src string, n int, timeout time.Duration) {
	t.Helper()
	await.Eventually(t, timeout, func() error {
		if got := e.count(src); got < n {
			return fmt.Errorf("source %s: %d messages, want %d", src, got, n)
		}
		return nil
	})
}

// latencies returns commit-to-arrival latencies of the first copies of
// the events written (not flooded) whose commit returned in [from, to).
func (e *fleetEnv) latencies(from, to time.Time) []time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	seen := map[string]bool{}
	var out []time.Duration
	for _, m := range e.got {
		w, ok := e.written[m.id]
		if !ok || seen[m.id] || w.Before(from) || !w.Before(to) {
			continue
		}
		seen[m.id] = true
		out = append(out, m.at.Sub(w))
	}
	slices.Sort(out)
	return out
}

func p99(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return ds[(len(ds)*99+99)/100-1]
}

// checkOrder fails t unless every written event arrived and, per source
// and aggregate, first copies arrived in increasing sequence order with
// none missing; flooded holds the number of flooded events per source.
func (e *fleetEnv) checkOrder(t *testing.T, flooded map[string]int) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	seen := map[string]bool{}
	last := map[[2]string]int{}
	per := map[string]int{}
	for _, m := range e.got {
		if seen[m.id] {
			continue
		}
		seen[m.id] = true
		k := [2]string{m.source, m.agg}
		if m.seq <= last[k] {
			t.Fatalf("source %s aggregate %s: seq %d arrived after %d", m.source, m.agg, m.seq, last[k])
		}
		last[k] = m.seq
		per[m.source]++
	}
	for id := range e.written {
		if !seen[id] {
			t.Fatalf("event %s was written but never arrived", id)
		}
	}
	for src, n := range flooded {
		if per[src] < n {
			t.Fatalf("source %s: %d distinct events arrived, %d were flooded", src, per[src], n)
		}
	}
}

// trickle writes one event every gap to sources from..to-1 in turn until
// stop says to, or until n were written when n > 0.
func (e *fleetEnv) trickle(ctx context.Context, t *testing.T, from, to int, gap time.Duration, n int, stop func() bool) int {
	t.Helper()
	tick := time.NewTicker(gap)
	defer tick.Stop()
	k := 0
	for ; (n == 0 || k < n) && !stop(); k++ {
		i := from + k%(to-from)
		e.seq[i]++
		if err := e.write(ctx, i, "t", e.seq[i]); err != nil {
			t.Fatal(err)
		}
		<-tick.C
	}
	return k
}

// One relay process drains ten schemas; one of them is flooded with
// 15,000 events while the other nine get a trickle. The flood does not
// queue the others behind it: every trickle event committed while the
// first half of the flood was still to arrive is published before the
// flood's last event (without fairness they would wait behind the flood's
// queued publishes; how long they wait is measured by `outbox bench
// --scenario fleet`, not here, and the budget's bound by
// TestBudgetServesWaitingSourcesInWeightedRoundRobin). Then nothing is
// lost and every aggregate's events arrived in order, per source.
func TestFleetFloodedSourceDoesNotDelayTheOthers(t *testing.T) {
	ctx := testenv.Context(t, 5*time.Minute)
	e := newFleetEnv(t, 10)
	cfg := filepath.Join(t.TempDir(), "fleet.yaml")
	e.config(t, cfg, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9)
	addr := freeAddr(t)
	startRelay(t, append([]string{"--config", cfg, "--metrics-addr", addr}, e.sinkFlags...)...)
	waitHTTP(t, "http://"+addr+"/readyz", http.StatusOK, 60*time.Second)
	// Warm up every source (connections, wake-up registrations).
	for i := range 10 {
		if err := e.write(ctx, i, "w", 1); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 {
		e.waitCount(t, e.source(i), 1, 30*time.Second)
	}
	const gap = 10 * time.Millisecond
	from := time.Now()
	e.trickle(ctx, t, 1, 10, gap, 90, func() bool { return false })
	quietEnd := time.Now()
	for i := 1; i < 10; i++ {
		e.waitCount(t, e.source(i), 1+90/9, 30*time.Second)
	}
	quiet := e.latencies(from, quietEnd)

	const floodN = 15_000
	e.flood(ctx, t, 0, floodN, 1000)
	floodFrom := time.Now()
	src0 := e.source(0)
	var half time.Time // when the first half of the flood had arrived
	e.trickle(ctx, t, 1, 10, gap, 0, func() bool {
		n := e.count(src0)
		if half.IsZero() && n >= 1+floodN/2 {
			half = time.Now()
		}
		return n >= 1+floodN
	})
	e.waitCount(t, src0, 1+floodN, 2*time.Minute)
	floodEnd := e.lastArrival(src0)
	loaded := e.latencies(floodFrom, floodEnd)
	t.Logf("trickle without the flood: %d events, p99 %s; during the flood (%s): %d events, p99 %s",
		len(quiet), p99(quiet), floodEnd.Sub(floodFrom).Round(time.Millisecond), len(loaded), p99(loaded))
	e.checkOrderEventually(t, map[string]int{src0: 1 + floodN})
	if half.IsZero() {
		t.Fatal("the flood's first half was never seen arriving")
	}
	early, late := e.arrivedBefore(floodFrom, half, floodEnd)
	if early == 0 {
		t.Fatalf("no trickle event was committed during the flood's first half (%s): nothing to judge", half.Sub(floodFrom))
	}
	if late > 0 {
		t.Fatalf("%d of the %d trickle events committed during the flood's first half arrived only after the flood's last event", late, early+late)
	}
}

// lastArrival is when the last first copy of source src arrived.
func (e *fleetEnv) lastArrival(src string) time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	var last time.Time
	for _, m := range e.got {
		if m.source == src && m.at.After(last) {
			last = m.at
		}
	}
	return last
}

// arrivedBefore counts the written events committed in [from, to) that
// arrived before deadline (early) and after it (late).
func (e *fleetEnv) arrivedBefore(from, to, deadline time.Time) (early, late int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	first := map[string]time.Time{}
	for _, m := range e.got {
		if _, ok := first[m.id]; !ok {
			first[m.id] = m.at
		}
	}
	for id, w := range e.written {
		if w.Before(from) || !w.Before(to) {
			continue
		}
		if first[id].Before(deadline) {
			early++
		} else {
			late++
		}
	}
	return early, late
}

// checkOrderEventually waits for every written event, then checks order.
func (e *fleetEnv) checkOrderEventually(t *testing.T, flooded map[string]int) {
	t.Helper()
	// Up to 60s; checkOrder reports what is missing.
	_ = await.Poll(60*time.Second, func() error {
		e.mu.Lock()
		defer e.mu.Unlock()
		seen := map[string]bool{}
		for _, m := range e.got {
			seen[m.id] = true
		}
		missing := 0
		for id := range e.written {
			if !seen[id] {
				missing++
			}
		}
		if missing > 0 {
			return fmt.Errorf("%d written events missing", missing)
		}
		return nil
	})
	e.checkOrder(t, flooded)
}

// waitHTTP polls url until it answers with status code want.
func waitHTTP(t *testing.T, url string, want int, timeout time.Duration) string {
	t.Helper()
	var body string
	await.Eventually(t, timeout, func() error {
		resp, err := http.Get(url)
		if err != nil {
			return fmt.Errorf("%s: no status %d; last: %w", url, want, err)
		}
		body = readAll(resp)
		if resp.StatusCode != want {
			return fmt.Errorf("%s: no status %d; last: %d %s", url, want, resp.StatusCode, body)
		}
		return nil
	})
	return body
}

func readAll(resp *http.Response) string {
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String()
		}
	}
}

// A source whose database is unreachable, from the start and again later,
// does not stop the others: they relay throughout, /readyz names the
// source that is not ready, and once its database is back it relays what
// was written meanwhile.
func TestFleetSourceWithDatabaseDownDoesNotStopTheOthers(t *testing.T) {
	ctx := testenv.Context(t, 3*time.Minute)
	e := newFleetEnv(t, 3)
	proxy, err := faultproxy.Start("127.0.0.1:5432")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	downURL := strings.Replace(dbURL(), "127.0.0.1:5432", proxy.Addr(), 1)
	if downURL == dbURL() {
		t.Fatalf("the database URL %s does not name 127.0.0.1:5432", dbURL())
	}
	downURL += map[bool]string{true: "&", false: "?"}[strings.Contains(downURL, "?")] + "connect_timeout=2"
	proxy.Cut()
	cfg := filepath.Join(t.TempDir(), "fleet.yaml")
	e.configDB(t, cfg, map[int]string{2: downURL}, 0, 1, 2)
	addr := freeAddr(t)
	p := startRelay(t, append([]string{"--config", cfg, "--metrics-addr", addr, "--lease-ttl", "1s", "--poll-interval", "100ms"}, e.sinkFlags...)...)
	waitHTTP(t, "http://"+addr+"/readyz?source=src0", http.StatusOK, 60*time.Second)
	waitHTTP(t, "http://"+addr+"/readyz?source=src1", http.StatusOK, 60*time.Second)
	if body := waitHTTP(t, "http://"+addr+"/readyz", http.StatusServiceUnavailable, 10*time.Second); !strings.Contains(body, "source src2 starting") {
		t.Fatalf("/readyz = %q, want src2 starting", body)
	}
	for k := 1; k <= 20; k++ {
		for i := range 3 {
			if err := e.write(ctx, i, "a", k); err != nil {
				t.Fatal(err)
			}
		}
	}
	e.waitCount(t, "src0", 20, 30*time.Second)
	e.waitCount(t, "src1", 20, 30*time.Second)
	proxy.Restore()
	e.waitCount(t, "src2", 20, 60*time.Second)
	waitHTTP(t, "http://"+addr+"/readyz", http.StatusOK, 30*time.Second)

	// Down again while running.
	proxy.Cut()
	for k := 21; k <= 40; k++ {
		for i := range 3 {
			if err := e.write(ctx, i, "a", k); err != nil {
				t.Fatal(err)
			}
		}
	}
	e.waitCount(t, "src0", 40, 30*time.Second)
	e.waitCount(t, "src1", 40, 30*time.Second)
	if body := waitHTTP(t, "http://"+addr+"/readyz", http.StatusServiceUnavailable, 30*time.Second); !strings.Contains(body, "source src2 not-ready") {
		t.Fatalf("/readyz = %q, want src2 not-ready", body)
	}
	proxy.Restore()
	e.waitCount(t, "src2", 40, 60*time.Second)
	e.checkOrderEventually(t, nil)
	if !strings.Contains(p.stderr.String(), "source=src2") {
		t.Fatalf("the relay's log names no trouble of src2:\n%s", p.stderr.String())
	}
}

// SIGHUP makes the running sources those the file lists now: a removed
// source stops and releases its partitions at once, an added one starts,
// the kept one relays on; a malformed file is refused with a clear log
// line and the running set is kept.
func TestFleetSIGHUPAddsAndRemovesSources(t *testing.T) {
	ctx := testenv.Context(t, 3*time.Minute)
	e := newFleetEnv(t, 3)
	cfg := filepath.Join(t.TempDir(), "fleet.yaml")
	e.config(t, cfg, 0, 1)
	addr := freeAddr(t)
	p := startRelay(t, append([]string{"--config", cfg, "--metrics-addr", addr, "--poll-interval", "100ms"}, e.sinkFlags...)...)
	waitHTTP(t, "http://"+addr+"/readyz", http.StatusOK, 60*time.Second)
	for i := range 2 {
		if err := e.write(ctx, i, "a", 1); err != nil {
			t.Fatal(err)
		}
		e.waitCount(t, e.source(i), 1, 30*time.Second)
	}
	metrics := get(t, "http://"+addr+"/metrics")
	for _, want := range []string{`source="src0"`, `source="src1"`} {
		if !strings.Contains(metrics, want) {
			t.Fatalf("/metrics lacks %s", want)
		}
	}

	e.config(t, cfg, 1, 2)
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	body := waitHTTP(t, "http://"+addr+"/readyz?source=src2", http.StatusOK, 60*time.Second)
	if !strings.Contains(body, "source src2 ready") {
		t.Fatalf("/readyz?source=src2 = %q", body)
	}
	if resp, err := http.Get("http://" + addr + "/readyz?source=src0"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("/readyz?source=src0 after its removal: %v %v", resp, err)
	}
	// The removed source released its leases: nobody owns its partitions.
	owned := 0
	tb := e.tables[0]
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+outboxdriver.QuoteIdent(tb.Schema)+`.`+outboxdriver.QuoteIdent(tb.Name+"_leases")+
		` WHERE owner IS NOT NULL AND expires_at > now()`).Scan(&owned); err != nil {
		t.Fatal(err)
	}
	if owned != 0 {
		t.Fatalf("%d partitions of the removed source are still leased", owned)
	}
	for _, i := range []int{1, 2} {
		if err := e.write(ctx, i, "a", 2); err != nil {
			t.Fatal(err)
		}
	}
	e.waitCount(t, "src1", 2, 30*time.Second)
	e.waitCount(t, "src2", 1, 30*time.Second)

	// A malformed file: refused, the running set kept.
	if err := os.WriteFile(cfg, []byte("sources:\n  - name: src1\n    db: "+dbURL()+"\n    wieght: 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	await.Eventually(t, 30*time.Second, func() error {
		if stderr := p.stderr.String(); !strings.Contains(stderr, "reload refused; the running sources are kept") {
			return fmt.Errorf("no refusal logged:\n%s", stderr)
		}
		return nil
	})
	if !strings.Contains(p.stderr.String(), "wieght") {
		t.Fatalf("the refusal does not name the bad key:\n%s", p.stderr.String())
	}
	// An event for the removed source, written before the kept sources'
	// next ones: it stays unpublished while theirs arrive.
	if _, err := e.pool.Exec(ctx, `INSERT INTO `+outboxdriver.QuoteIdent(tb.Schema)+`.`+outboxdriver.QuoteIdent(tb.Name)+
		` (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'src0', 'a', 'E', '{"agg": "a", "seq": 2}')`); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{1, 2} {
		if err := e.write(ctx, i, "a", 3); err != nil {
			t.Fatal(err)
		}
	}
	e.waitCount(t, "src1", 3, 30*time.Second)
	e.waitCount(t, "src2", 2, 30*time.Second)
	if e.count("src0") != 1 {
		t.Fatalf("src0 has %d messages after its removal, want the 1 from before", e.count("src0"))
	}
	e.checkOrderEventually(t, nil)

	// outbox status --config reports every source of the file.
	e.config(t, cfg, 0, 1, 2)
	out, stderr, code := run(t, nil, "status", "--config", cfg, "--json")
	if code != 0 {
		t.Fatalf("status --config: %d %s", code, stderr)
	}
	for i := range 3 {
		if !strings.Contains(out, fmt.Sprintf(`"source":"src%d"`, i)) {
			t.Fatalf("status --config --json lacks src%d:\n%s", i, out)
		}
	}
}

// A configuration the relay cannot use is refused at start with one clear
// line: unknown keys, a missing database, duplicate names or tables, bad
// identifiers and weights, too many sources, --config with --db.
func TestFleetConfigErrorsAreClear(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := dbURL()
	many := "sources:\n"
	for i := range 65 {
		many += fmt.Sprintf("  - name: s%d\n    db: %s\n    schema: s%d\n", i, db, i)
	}
	cases := []struct {
		name, file, want string
		extra            []string
	}{
		{"unknown key", "sources:\n  - name: a\n    db: " + db + "\n    wieght: 2\n", "field wieght not found", nil},
		{"no sources", "sink: 'stdout:'\n", "no sources", nil},
		{"no db", "sources:\n  - name: a\n", "no db", nil},
		{"duplicate name", "sources:\n  - name: a\n    db: " + db + "\n    schema: x\n  - name: a\n    db: " + db + "\n    schema: y\n", `source "a": named twice`, nil},
		{"same table", "sources:\n  - name: a\n    db: " + db + "\n  - name: b\n    db: " + db + "\n", "relay the same table", nil},
		{"bad name", "sources:\n  - name: 'a b'\n    db: " + db + "\n", `source name "a b"`, nil},
		{"hostile schema", "sources:\n  - name: a\n    db: " + db + "\n    schema: 'x\"; DROP'\n", "not a valid identifier", nil},
		{"bad weight", "sources:\n  - name: a\n    db: " + db + "\n    weight: 101\n", "weight 101", nil},
		{"bad route", "sources:\n  - name: a\n    db: " + db + "\n    route-by: payload\n", "cannot route by", nil},
		{"too many", many, "at most 64", nil},
		{"config and db", "sources:\n  - name: a\n    db: " + db + "\n", "leave out --db", []string{"--db", db}},
		{"duty zero", "sources:\n  - name: a\n    db: " + db + "\n", "--publish-duty 0: use more than 0", []string{"--publish-duty", "0"}},
		{"duty above one", "sources:\n  - name: a\n    db: " + db + "\n", "--publish-duty 1.5", []string{"--publish-duty", "1.5"}},
		{"window zero", "sources:\n  - name: a\n    db: " + db + "\n", "--publish-window 0s", []string{"--publish-window", "0s"}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(dir, fmt.Sprintf("f%d.yaml", i))
			if err := os.WriteFile(path, []byte(c.file), 0o600); err != nil {
				t.Fatal(err)
			}
			failsWithOneLine(t, []string{"OUTBOX_DB=", "OUTBOX_SINK="}, c.want, append([]string{"relay", "--config", path, "--sink", "stdout:"}, c.extra...)...)
		})
	}
}

// Two relay processes with the same sources share every source's
// partitions, as two relays of one table do: each leases part of each
// table, and together they relay everything, in order.
func TestFleetProcessesShareEachSourcesPartitions(t *testing.T) {
	ctx := testenv.Context(t, 3*time.Minute)
	e := newFleetEnv(t, 2)
	cfg := filepath.Join(t.TempDir(), "fleet.yaml")
	e.config(t, cfg, 0, 1)
	args := append([]string{"--config", cfg, "--lease-ttl", "1s", "--poll-interval", "100ms"}, e.sinkFlags...)
	startRelay(t, args...)
	startRelay(t, args...)
	for _, tb := range e.tables {
		await.Eventually(t, 60*time.Second, func() error {
			var owners, owned int
			if err := e.pool.QueryRow(ctx, `SELECT count(DISTINCT owner), count(owner) FROM `+outboxdriver.QuoteIdent(tb.Schema)+`.`+
				outboxdriver.QuoteIdent(tb.Name+"_leases")+` WHERE owner IS NOT NULL AND expires_at > now()`).Scan(&owners, &owned); err != nil {
				t.Fatal(err)
			}
			if owners != 2 || owned != 64 {
				return fmt.Errorf("table %s: %d partitions leased by %d relays, want 64 by 2", tb, owned, owners)
			}
			return nil
		})
	}
	for k := 1; k <= 20; k++ {
		for i := range 2 {
			for a := range 10 {
				if err := e.write(ctx, i, fmt.Sprintf("a%d", a), k); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	e.waitCount(t, "src0", 200, 60*time.Second)
	e.waitCount(t, "src1", 200, 60*time.Second)
	e.checkOrderEventually(t, nil)
}
