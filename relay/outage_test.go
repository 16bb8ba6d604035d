package relay_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox/internal/faultproxy"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/outboxmysql"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/route"
	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/natssink"
)

// logLine is one line a relay logged.
type logLine struct {
	at    time.Time
	level slog.Level
	msg   string
	attrs string
}

func (l logLine) String() string { return fmt.Sprintf("%s %s %s", l.level, l.msg, l.attrs) }

// logBook records every line of a relay's logger, at every level.
type logBook struct {
	mu    sync.Mutex
	lines []logLine
}

func (b *logBook) logger() *slog.Logger { return slog.New(bookHandler{b}) }

// since returns the lines logged at Info or above from t on.
func (b *logBook) since(t time.Time) []logLine {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []logLine
	for _, l := range b.lines {
		if !l.at.Before(t) && l.level >= slog.LevelInfo {
			out = append(out, l)
		}
	}
	return out
}

// count returns how many of ls say msg.
func count(ls []logLine, msg string) int {
	n := 0
	for _, l := range ls {
		if strings.Contains(l.msg, msg) {
			n++
		}
	}
	return n
}

// logged is a condition for await: a line since t says msg.
func (b *logBook) logged(t time.Time, msg string) func() error {
	return func() error {
		if count(b.since(t), msg) == 0 {
			return fmt.Errorf("no line says %q", msg)
		}
		return nil
	}
}

type bookHandler struct{ b *logBook }

func (h bookHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h bookHandler) Handle(_ context.Context, r slog.Record) error {
	var attrs []string
	r.Attrs(func(a slog.Attr) bool {
		attrs = append(attrs, a.String())
		return true
	})
	h.b.mu.Lock()
	h.b.lines = append(h.b.lines, logLine{time.Now(), r.Level, r.Message, strings.Join(attrs, " ")})
	h.b.mu.Unlock()
	return nil
}

func (h bookHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h bookHandler) WithGroup(string) slog.Handler      { return h }

// proxied starts a fault proxy to the host of rawURL and returns it with
// rawURL through it.
func proxied(t *testing.T, rawURL string) (*faultproxy.Proxy, string) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		t.Fatalf("no host in %q: %v", rawURL, err)
	}
	p, err := faultproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	u.Host = p.Addr()
	return p, u.String()
}

// outageFor is how long the tests below keep a service cut off.
const outageFor = 3 * time.Second

// A relay cut off from its database for a few seconds, by polling and by
// log tailing, logs a handful of lines: one when the outage begins, one
// when it ends (with how long it lasted and how many calls failed), none
// per failed call; then it relays every event, those written during the
// outage included.
func TestDatabaseOutageLogsAHandfulOfLines(t *testing.T) {
	t.Parallel()
	testenv.ForSources(t, func(t *testing.T, source string) {
		e := newEnvFor(t, source)
		proxy, dbURL := proxied(t, e.url)
		pool, err := pgxpool.New(context.Background(), dbURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		var book logBook
		e.startOn(t, pool, nil, relay.Config{Logger: book.logger()})
		testDatabaseOutage(t, proxy, &book, e.stream, func(n int) { e.write(t, true, event(fmt.Sprint("a", n%5), n)) })
	})
	// The relay's calls are the same whatever the database: polling
	// MariaDB too.
	t.Run("mariadb", func(t *testing.T) {
		t.Parallel()
		admin := testenv.MySQL(t, "")
		name := testenv.MySQLDatabase(t, admin, "relay")
		db := testenv.MySQL(t, name)
		tb := outboxdriver.Table{Name: "outbox"}
		drv := outboxmysql.New(db)
		if _, err := drv.Migrate(context.Background(), tb, nil); err != nil {
			t.Fatal(err)
		}
		cfg := testenv.MySQLConfig(t, name)
		proxy, err := faultproxy.Start(cfg.Addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { proxy.Close() })
		cfg.Addr = proxy.Addr()
		conn, err := mysql.NewConnector(cfg)
		if err != nil {
			t.Fatal(err)
		}
		relayDB := sql.OpenDB(conn)
		t.Cleanup(func() { relayDB.Close() })
		src, err := outboxmysql.New(relayDB).NewSource(tb, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, js := testenv.JetStream(t)
		st, prefix := testenv.Stream(t, js)
		snk, err := natssink.New(js, &natssink.Config{Stream: prefix, Subjects: []string{prefix + ".>"}})
		if err != nil {
			t.Fatal(err)
		}
		router, err := route.New(&route.Config{Replacement: prefix + ".${routedByValue}"})
		if err != nil {
			t.Fatal(err)
		}
		var book logBook
		r, err := relay.New(src, snk, &relay.Config{Router: router, PollInterval: 200 * time.Millisecond, Logger: book.logger()})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r.Stop(ctx)
			src.Close()
		})
		w := outboxmysql.New(nil)
		testDatabaseOutage(t, proxy, &book, st, func(n int) {
			if err := testenv.WriteSQL(context.Background(), db, w, tb, true, event(fmt.Sprint("a", n%5), n)); err != nil {
				t.Fatal(err)
			}
		})
	})
}

// testDatabaseOutage writes events, cuts the relay off from its database
// with proxy while writing more (writeOne writes event n), restores it,
// and checks what book logged meanwhile and that stream received every
// event.
func testDatabaseOutage(t *testing.T, proxy *faultproxy.Proxy, book *logBook, stream jetstream.Stream, writeOne func(n int)) {
	t.Helper()
	n := 0
	write := func(k int) {
		for range k {
			writeOne(n)
			n++
		}
	}
	write(20)
	testenv.WaitStreamMsgs(t, stream, 20, 30*time.Second)

	cut := time.Now()
	proxy.Cut()
	await.Eventually(t, 10*time.Second, book.logged(cut, "the database fails"))
	for range 6 { // writers go on meanwhile: their database is up
		write(5)
		time.Sleep(outageFor / 6) // the outage
	}
	proxy.Restore()
	write(20)
	testenv.WaitStreamMsgs(t, stream, uint64(n), 30*time.Second)
	await.Eventually(t, 10*time.Second, book.logged(cut, "recovered: the database answers again"))

	seen := map[int]bool{}
	for _, p := range decode(t, testenv.StreamMessages(t, stream)) {
		seen[p.N] = true
	}
	if len(seen) != n {
		t.Fatalf("%d distinct events published, want %d", len(seen), n)
	}
	lines := book.since(cut)
	var all []string
	for _, l := range lines {
		all = append(all, l.String())
	}
	t.Logf("%d lines through the outage:\n%s", len(lines), strings.Join(all, "\n"))
	if d, r := count(lines, "the database fails"), count(lines, "recovered: the database"); d != 1 || r != 1 {
		t.Errorf("%d down and %d recovered lines, want one each", d, r)
	}
	if s := count(lines, "still fails"); s != 0 {
		t.Errorf("%d summary lines for an outage of %v, want none (one per 30 s)", s, outageFor)
	}
	if len(lines) > 5 {
		t.Errorf("%d lines through an outage of %v, want a handful (at most 5)", len(lines), outageFor)
	}
	for _, l := range lines {
		if !strings.Contains(l.msg, "recovered: the database") {
			continue
		}
		var downFor time.Duration
		var failures int
		for _, kv := range strings.Fields(l.attrs) {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "down_for":
				downFor, _ = time.ParseDuration(v)
			case "failures":
				failures, _ = strconv.Atoi(v)
			}
		}
		if downFor < outageFor || failures < 2 {
			t.Errorf("the recovered line says down_for=%v failures=%d, want at least the outage's %v and several failed calls: %s", downFor, failures, outageFor, l)
		}
	}
}

// ackClock records when its sink's publishes were acknowledged.
type ackClock struct {
	sink.Sink
	mu   sync.Mutex
	acks []time.Time
}

func (a *ackClock) Publish(ctx context.Context, msgs []sink.Message) []error {
	errs := a.Sink.Publish(ctx, msgs)
	now := time.Now()
	for _, err := range errs {
		if err == nil {
			a.mu.Lock()
			a.acks = append(a.acks, now)
			a.mu.Unlock()
			break
		}
	}
	return errs
}

// firstAfter returns the first acknowledgement at or after t.
func (a *ackClock) firstAfter(t time.Time) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, at := range a.acks {
		if !at.Before(t) {
			return at, true
		}
	}
	return time.Time{}, false
}

// brokerBackWithin bounds the time from the broker's return to the next
// acknowledged publish. The relay tries a broker that is down every 0.5 to
// 1 s and the NATS client reconnects every 250 ms (plus up to 100 ms), so
// it is under about 1.4 s by design and about 0.6 s typically; the rest is
// margin for a loaded machine.
const brokerBackWithin = 2 * time.Second

// A relay cut off from NATS for a while, long enough for its backoff to
// reach its cap, publishes again within about a second of the broker's
// return, logs the outage once and its end once, and loses nothing.
func TestBrokerOutageEndsWithinASecond(t *testing.T) {
	t.Parallel()
	testenv.ForSources(t, testBrokerOutageEndsWithinASecond)
}

func testBrokerOutageEndsWithinASecond(t *testing.T, source string) {
	e := newEnvFor(t, source)
	proxy, natsURL := proxied(t, testenv.NATSURL())
	snk, err := natssink.DialStream(context.Background(), natsURL, &natssink.Config{Stream: e.prefix, NoCreateStream: true, Logger: discardLog})
	if err != nil {
		t.Fatal(err)
	}
	clock := &ackClock{Sink: snk}
	var book logBook
	e.start(t, func(sink.Sink) sink.Sink { return clock }, relay.Config{Logger: book.logger()})
	n := 0
	write := func(k int) {
		for range k {
			e.write(t, true, event(fmt.Sprint("b", n%5), n))
			n++
		}
	}
	write(10)
	testenv.WaitStreamMsgs(t, e.stream, 10, 30*time.Second)

	cut := time.Now()
	proxy.Cut()
	write(10)
	await.Eventually(t, 10*time.Second, book.logged(cut, "the broker is unreachable"))
	time.Sleep(2 * outageFor) // the outage: the relay's backoff reaches its cap
	proxy.Restore()
	back := time.Now()
	var acked time.Time
	await.Eventually(t, 30*time.Second, func() error {
		var ok bool
		if acked, ok = clock.firstAfter(back); !ok {
			return fmt.Errorf("no publish acknowledged since the broker returned")
		}
		return nil
	})
	took := acked.Sub(back)
	t.Logf("first acknowledgement %v after the broker's return", took)
	if took > brokerBackWithin {
		t.Errorf("the first acknowledgement came %v after the broker's return, want within %v", took, brokerBackWithin)
	}
	write(10)
	testenv.WaitStreamMsgs(t, e.stream, uint64(n), 30*time.Second)
	await.Eventually(t, 10*time.Second, book.logged(cut, "recovered: the broker takes messages again"))
	seen := map[int]bool{}
	for _, p := range decode(t, testenv.StreamMessages(t, e.stream)) {
		seen[p.N] = true
	}
	if len(seen) != n {
		t.Fatalf("%d distinct events published, want %d", len(seen), n)
	}
	lines := book.since(cut)
	if d, r := count(lines, "the broker is unreachable"), count(lines, "recovered: the broker"); d != 1 || r != 1 {
		var all []string
		for _, l := range lines {
			all = append(all, l.String())
		}
		t.Errorf("%d down and %d recovered lines, want one each:\n%s", d, r, strings.Join(all, "\n"))
	}
}

var discardLog = slog.New(slog.DiscardHandler)
