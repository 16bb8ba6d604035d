package redissink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/outboxkit/outbox/internal/faultproxy"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/sink"
)

// envURL overrides the Redis server the tests use.
const envURL = "OUTBOX_TEST_REDIS_URL"

const startHint = `start it with: redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log`

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func serverURL() string {
	if u := os.Getenv(envURL); u != "" {
		return u
	}
	return "redis://127.0.0.1:6379/0"
}

// env is one test's client and key prefix; every key under the prefix is
// deleted when the test ends.
type env struct {
	rdb    *redis.Client
	prefix string
}

// connect returns a client on the test server or fails the test saying how
// to start it.
func connect(t testing.TB) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(serverURL())
	if err != nil {
		t.Fatalf("%s: %v", envURL, err)
	}
	rdb := redis.NewClient(opt)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		t.Fatalf("Redis is not reachable at %s (set %s to use another server): %v; %s", serverURL(), envURL, err, startHint)
	}
	return rdb
}

func newEnv(t testing.TB) *env {
	t.Helper()
	rdb := connect(t)
	e := &env{rdb: rdb, prefix: "t:" + testenv.Hex(t) + ":"}
	t.Cleanup(func() {
		defer rdb.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		keys, err := rdb.Keys(ctx, e.prefix+"*").Result()
		if err != nil {
			t.Errorf("list keys %s*: %v", e.prefix, err)
			return
		}
		if len(keys) > 0 {
			if err := rdb.Del(ctx, keys...).Err(); err != nil {
				t.Errorf("delete keys: %v", err)
			}
		}
	})
	return e
}

func (e *env) newSink(t testing.TB, cfg *Config) *Sink {
	t.Helper()
	if cfg == nil {
		cfg = &Config{StreamPrefix: e.prefix}
	}
	s, err := Dial(testenv.Context(t, 30*time.Second), serverURL(), cfg)
	if err != nil {
		t.Fatalf("%v; %s", err, startHint)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// rawEntry is a stream entry with its fields in stored order.
type rawEntry struct {
	id     string
	fields []string // name, value, name, value...
}

func (r rawEntry) field(name string) (string, bool) {
	for k := 0; k+1 < len(r.fields); k += 2 {
		if r.fields[k] == name {
			return r.fields[k+1], true
		}
	}
	return "", false
}

// xrange returns every entry of stream, fields in stored order.
func (e *env) xrange(t testing.TB, stream string) []rawEntry {
	t.Helper()
	res, err := e.rdb.Do(testenv.Context(t, 30*time.Second), "XRANGE", stream, "-", "+").Slice()
	if err != nil {
		t.Fatalf("XRANGE %s: %v", stream, err)
	}
	out := make([]rawEntry, 0, len(res))
	for _, x := range res {
		pair := x.([]any)
		r := rawEntry{id: pair[0].(string)}
		for _, f := range pair[1].([]any) {
			r.fields = append(r.fields, f.(string))
		}
		out = append(out, r)
	}
	return out
}

func requireNoErrors(t testing.TB, errs []error, n int) {
	t.Helper()
	if len(errs) != n {
		t.Fatalf("got %d results, want %d", len(errs), n)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
}

func TestFieldsAndOrderPerStream(t *testing.T) {
	e := newEnv(t)
	s := e.newSink(t, nil)
	var msgs []sink.Message
	for i := range 30 {
		dest := "orders"
		if i%3 == 0 {
			dest = "payments"
		}
		msgs = append(msgs, sink.Message{
			ID: fmt.Sprint("e", i), Destination: dest, Key: fmt.Appendf(nil, "agg-%d", i%4),
			Type:    fmt.Sprint("Type", i%2),
			Value:   fmt.Appendf(nil, `{"i":%d}`, i),
			Headers: []sink.Header{{Key: "id", Value: fmt.Sprint("e", i)}, {Key: "type", Value: "order.created"}},
		})
	}
	msgs[1].Value = []byte("binary \x00\xff\r\n")
	msgs[2].Value = nil
	msgs[2].Key = nil
	msgs[4].Headers = []sink.Header{{Key: "trace", Value: "t1"}, {Key: "x-empty", Value: ""}, {Key: "trace", Value: "t2 <&>"}}
	requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), msgs), len(msgs))

	for _, dest := range []string{"orders", "payments"} {
		got := e.xrange(t, e.prefix+dest)
		var want []sink.Message
		for _, m := range msgs {
			if m.Destination == dest {
				want = append(want, m)
			}
		}
		if len(got) != len(want) {
			t.Fatalf("stream %s holds %d entries, want %d", dest, len(got), len(want))
		}
		for k, r := range got {
			m := want[k]
			var names []string
			for f := 0; f < len(r.fields); f += 2 {
				names = append(names, r.fields[f])
			}
			if !slices.Equal(names, []string{"id", "key", "type", "headers", "payload"}) {
				t.Fatalf("entry %s has fields %v, want id key type headers payload", r.id, names)
			}
			if typ, _ := r.field("type"); typ != m.Type {
				t.Errorf("stream %s entry %d: type %q, want %q", dest, k, typ, m.Type)
			}
			id, _ := r.field("id")
			key, _ := r.field("key")
			payload, _ := r.field("payload")
			if id != m.ID || key != string(m.Key) || payload != string(m.Value) {
				t.Errorf("stream %s entry %d: id %q key %q payload %q; want %q %q %q", dest, k, id, key, payload, m.ID, m.Key, m.Value)
			}
		}
	}
	h := e.xrange(t, e.prefix+"orders")
	for _, r := range h {
		if id, _ := r.field("id"); id == "e4" {
			hj, _ := r.field("headers")
			if hj != `{"id":["e4"],"trace":["t1","t2 <&>"],"x-empty":[""]}` {
				t.Errorf("headers of e4 = %s", hj)
			}
		}
		if id, _ := r.field("id"); id == "e1" {
			hj, _ := r.field("headers")
			var m map[string][]string
			if err := json.Unmarshal([]byte(hj), &m); err != nil || !slices.Equal(m["type"], []string{"order.created"}) || !slices.Equal(m["id"], []string{"e1"}) {
				t.Errorf("headers of e1 = %s (%v)", hj, err)
			}
		}
	}
}

func TestMaxLenTrimsApproximately(t *testing.T) {
	e := newEnv(t)
	s := e.newSink(t, &Config{StreamPrefix: e.prefix, MaxLen: 100})
	for b := range 10 {
		msgs := make([]sink.Message, 100)
		for i := range msgs {
			msgs[i] = sink.Message{ID: fmt.Sprint(b, "-", i), Destination: "capped", Value: []byte(`{}`)}
		}
		requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), msgs), len(msgs))
	}
	n, err := e.rdb.XLen(testenv.Context(t, 30*time.Second), e.prefix+"capped").Result()
	if err != nil {
		t.Fatal(err)
	}
	node := int64(100)
	if cfg, err := e.rdb.ConfigGet(testenv.Context(t, 30*time.Second), "stream-node-max-entries").Result(); err == nil {
		if v, err := strconv.ParseInt(cfg["stream-node-max-entries"], 10, 64); err == nil && v > 0 {
			node = v
		}
	}
	if n < 100 || n >= 100+node {
		t.Errorf("stream holds %d entries after 1000 appends with MaxLen 100; want at least 100 and fewer than %d", n, 100+node)
	}
	// The newest entry is the last one appended.
	last, err := e.rdb.XRevRangeN(testenv.Context(t, 30*time.Second), e.prefix+"capped", "+", "-", 1).Result()
	if err != nil || len(last) != 1 || last[0].Values["id"] != "9-99" {
		t.Errorf("newest entry %v (%v), want id 9-99", last, err)
	}
}

func TestWrongTypeIsPermanentOthersSucceed(t *testing.T) {
	e := newEnv(t)
	if err := e.rdb.Set(testenv.Context(t, 30*time.Second), e.prefix+"not-a-stream", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s := e.newSink(t, nil)
	msgs := []sink.Message{
		{ID: "w1", Destination: "ok"},
		{ID: "w2", Destination: "not-a-stream"},
		{ID: "w3", Destination: "ok"},
		{ID: "w4", Destination: ""},
	}
	errs := s.Publish(testenv.Context(t, 30*time.Second), msgs)
	if errs[0] != nil || errs[2] != nil {
		t.Fatalf("messages to a stream: %v, %v", errs[0], errs[2])
	}
	if !sink.IsPermanent(errs[1]) || sink.IsUnavailable(errs[1]) || !strings.Contains(errs[1].Error(), "WRONGTYPE") || !strings.Contains(errs[1].Error(), e.prefix+"not-a-stream") {
		t.Errorf("message to a string key: %v; want a permanent WRONGTYPE error naming the key", errs[1])
	}
	if !sink.IsPermanent(errs[3]) {
		t.Errorf("message without destination: %v; want permanent", errs[3])
	}
	if got := e.xrange(t, e.prefix+"ok"); len(got) != 2 {
		t.Errorf("stream holds %d entries, want 2", len(got))
	}
}

func TestOOMIsTransient(t *testing.T) {
	e := newEnv(t)
	s := e.newSink(t, nil)
	requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), []sink.Message{{ID: "before", Destination: "s"}}), 1)

	// maxmemory below what Redis uses makes every write fail with OOM
	// (under the noeviction policy). Restore both settings afterwards.
	old, err := e.rdb.ConfigGet(testenv.Context(t, 30*time.Second), "maxmemory*").Result()
	if err != nil {
		t.Fatal(err)
	}
	restore := func() {
		for _, k := range []string{"maxmemory", "maxmemory-policy"} {
			if err := e.rdb.ConfigSet(context.Background(), k, old[k]).Err(); err != nil {
				t.Errorf("restore %s: %v", k, err)
			}
		}
	}
	defer restore()
	if err := e.rdb.ConfigSet(testenv.Context(t, 30*time.Second), "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.ConfigSet(testenv.Context(t, 30*time.Second), "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	errs := s.Publish(testenv.Context(t, 30*time.Second), []sink.Message{{ID: "o1", Destination: "s"}, {ID: "o2", Destination: "s"}})
	restore()
	for i, err := range errs {
		if err == nil || !redis.IsOOMError(err) || sink.IsPermanent(err) || sink.IsUnavailable(err) {
			t.Errorf("message %d under OOM: %v; want a transient OOM error", i, err)
		}
	}
	requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), []sink.Message{{ID: "after", Destination: "s"}}), 1)
}

func TestTooLargeAndInvalidHeaders(t *testing.T) {
	e := newEnv(t)
	s := e.newSink(t, &Config{StreamPrefix: e.prefix, MaxMessageSize: 16})
	errs := s.Publish(testenv.Context(t, 30*time.Second), []sink.Message{
		{ID: "ok", Destination: "s", Value: []byte("0123456789abcdef")},
		{ID: "big", Destination: "s", Value: []byte("0123456789abcdefg")},
		{ID: "bad-header", Destination: "s", Headers: []sink.Header{{Key: "h", Value: "\xff"}}},
		{ID: "ok2", Destination: "s"},
	})
	if errs[0] != nil || errs[3] != nil {
		t.Fatalf("valid messages: %v, %v", errs[0], errs[3])
	}
	if !sink.IsPermanent(errs[1]) || !strings.Contains(errs[1].Error(), "MaxMessageSize") {
		t.Errorf("too large: %v", errs[1])
	}
	if !sink.IsPermanent(errs[2]) || !strings.Contains(errs[2].Error(), "UTF-8") {
		t.Errorf("invalid header: %v", errs[2])
	}
	if got := e.xrange(t, e.prefix+"s"); len(got) != 2 {
		t.Errorf("stream holds %d entries, want 2", len(got))
	}
}

func TestCancelledContextAndDeadline(t *testing.T) {
	e := newEnv(t)
	s := e.newSink(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	msgs := []sink.Message{{ID: "c1", Destination: "s"}, {ID: "c2", Destination: "s"}}
	for i, err := range s.Publish(ctx, msgs) {
		if !errors.Is(err, context.Canceled) || sink.IsPermanent(err) {
			t.Errorf("message %d: %v", i, err)
		}
	}
	if got := e.xrange(t, e.prefix+"s"); len(got) != 0 {
		t.Errorf("a cancelled Publish appended %d entries", len(got))
	}

	// A deadline that ends during a large pipeline.
	big := make([]sink.Message, 20000)
	for i := range big {
		big[i] = sink.Message{ID: fmt.Sprint("d", i), Destination: "s", Value: []byte(strings.Repeat("v", 200))}
	}
	dctx, dcancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer dcancel()
	start := time.Now()
	errs := s.Publish(dctx, big)
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("Publish returned %v after a 1ms deadline", el)
	}
	failed := 0
	for i, err := range errs {
		if err != nil {
			failed++
			if !errors.Is(err, context.DeadlineExceeded) || sink.IsPermanent(err) {
				t.Fatalf("message %d: %v; want a transient deadline error", i, err)
			}
		}
	}
	t.Logf("%d of %d failed with the deadline", failed, len(big))
	requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), msgs), 2) // the sink still works
}

// TestOutageAndRecovery cuts the connection between the sink and Redis:
// publishes fail as Unavailable, and after the cut ends the client
// reconnects by itself.
func TestOutageAndRecovery(t *testing.T) {
	e := newEnv(t)
	u, err := url.Parse(serverURL())
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	u.Host = p.Addr()
	s, err := Dial(testenv.Context(t, 30*time.Second), u.String(), &Config{StreamPrefix: e.prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	batch := func(tag string) []sink.Message {
		return []sink.Message{{ID: tag + "a", Destination: "s"}, {ID: tag + "b", Destination: "s"}}
	}
	requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), batch("before")), 2)

	p.Cut()
	for round := range 3 {
		start := time.Now()
		errs := s.Publish(testenv.Context(t, 30*time.Second), batch(fmt.Sprint("cut", round)))
		if el := time.Since(start); el > 10*time.Second {
			t.Errorf("round %d: Publish during the outage took %v", round, el)
		}
		for i, err := range errs {
			if !sink.IsUnavailable(err) || sink.IsPermanent(err) {
				t.Errorf("round %d message %d: %v; want Unavailable", round, i, err)
			}
		}
		t.Logf("round %d: %v", round, errs[0])
	}
	p.Restore()
	requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), batch("after")), 2)
	var ids []string
	for _, r := range e.xrange(t, e.prefix+"s") {
		id, _ := r.field("id")
		ids = append(ids, id)
	}
	if !slices.Equal(ids, []string{"beforea", "beforeb", "aftera", "afterb"}) {
		t.Errorf("stream holds %v", ids)
	}
}

func TestNewLeavesClientOpen(t *testing.T) {
	e := newEnv(t)
	client := connect(t)
	defer client.Close()
	s, err := New(client, &Config{StreamPrefix: e.prefix})
	if err != nil {
		t.Fatal(err)
	}
	requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), []sink.Message{{ID: "n1", Destination: "s"}}), 1)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := client.Ping(testenv.Context(t, 30*time.Second)).Err(); err != nil {
		t.Fatalf("Close closed the caller's client: %v", err)
	}
	for _, err := range s.Publish(testenv.Context(t, 30*time.Second), []sink.Message{{ID: "n2", Destination: "s"}}) {
		if !errors.Is(err, ErrClosed) || sink.IsPermanent(err) {
			t.Errorf("Publish after Close: %v", err)
		}
	}
	// A client the caller closed: Unavailable.
	s2, err := New(client, &Config{StreamPrefix: e.prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	client.Close()
	for _, err := range s2.Publish(testenv.Context(t, 30*time.Second), []sink.Message{{ID: "n3", Destination: "s"}}) {
		if !sink.IsUnavailable(err) {
			t.Errorf("Publish on a closed client: %v", err)
		}
	}
	if got := e.xrange(t, e.prefix+"s"); len(got) != 1 {
		t.Errorf("stream holds %d entries, want 1", len(got))
	}
}

func TestConcurrentPublish(t *testing.T) {
	e := newEnv(t)
	s := e.newSink(t, nil)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for b := range 5 {
				msgs := make([]sink.Message, 20)
				for i := range msgs {
					msgs[i] = sink.Message{ID: fmt.Sprintf("w%d-%d-%d", w, b, i), Destination: fmt.Sprint("w", w), Value: []byte(`{}`)}
				}
				for i, err := range s.Publish(testenv.Context(t, 30*time.Second), msgs) {
					if err != nil {
						t.Errorf("worker %d message %d: %v", w, i, err)
					}
				}
			}
		})
	}
	wg.Wait()
	for w := range 8 {
		got := e.xrange(t, fmt.Sprint(e.prefix, "w", w))
		if len(got) != 100 {
			t.Errorf("stream w%d holds %d entries, want 100", w, len(got))
		}
		for k, r := range got { // each worker's own order
			id, _ := r.field("id")
			if want := fmt.Sprintf("w%d-%d-%d", w, k/20, k%20); id != want {
				t.Fatalf("stream w%d entry %d is %s, want %s", w, k, id, want)
			}
		}
	}
}

func TestDialErrors(t *testing.T) {
	ctx := testenv.Context(t, 30*time.Second)
	for _, tc := range []struct{ url, want string }{
		{"", "empty URL"},
		{"http://127.0.0.1:6379/0", `scheme "http"`},
		{"redis://127.0.0.1:6379/x", "invalid database"},
		{"redis://u:pw@[::1", "not shown"},
	} {
		_, err := Dial(ctx, tc.url, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Dial(%q): %v, want an error with %q", tc.url, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), ":pw@") {
			t.Errorf("Dial(%q): the error shows the password: %v", tc.url, err)
		}
	}
	if _, err := normalize(&Config{MaxLen: -1}); err == nil {
		t.Error("negative MaxLen accepted")
	}
	if _, err := New(nil, nil); err == nil {
		t.Error("New(nil) succeeded")
	}

	u, err := url.Parse(serverURL())
	if err != nil {
		t.Fatal(err)
	}
	connect(t).Close() // the server is up
	wrong := *u
	wrong.User = url.UserPassword("nobody", "s3cret-wrong")
	_, err = Dial(ctx, wrong.String(), nil)
	if err == nil || strings.Contains(err.Error(), "s3cret-wrong") || !strings.Contains(err.Error(), "xxxxx") {
		t.Errorf("Dial with a wrong password: %v; want an error that hides the password", err)
	}

	p, err := faultproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Cut()
	cut := *u
	cut.Host = p.Addr()
	cut.User = url.UserPassword("default", "s3cret")
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = Dial(dctx, cut.String(), nil)
	if err == nil || !strings.Contains(err.Error(), "cannot reach") || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("Dial to a cut proxy: %v", err)
	}
}
