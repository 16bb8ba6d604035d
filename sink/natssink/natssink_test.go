package natssink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/sink"
)

const serverURL = "nats://127.0.0.1:4222"

const startHint = "start it with: start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log"

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// env is one test's connection, stream name and subject prefix.
type env struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	stream string // unique stream name
	prefix string // unique subject prefix; the stream listens on prefix.>
}

// newEnv connects to the test server and reserves a unique stream name and
// subject prefix; the stream is deleted at cleanup if a test created it.
func newEnv(t *testing.T, jsOpts ...jetstream.JetStreamOpt) *env {
	t.Helper()
	nc, err := nats.Connect(serverURL, nats.Timeout(2*time.Second))
	if err != nil {
		t.Fatalf("nats-server with JetStream is not reachable at %s: %v; %s", serverURL, err, startHint)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jsOpts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		t.Fatalf("JetStream is not available on %s: %v; %s", serverURL, err, startHint)
	}
	id := testenv.Hex(t)
	e := &env{nc: nc, js: js, stream: "T_" + id, prefix: "t" + id}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, e.stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("delete stream %s: %v", e.stream, err)
		}
	})
	return e
}

func (e *env) config() *Config {
	return &Config{Stream: e.stream, Subjects: []string{e.prefix + ".>"}}
}

// newSink returns a sink on e's connection with an existing stream.
func (e *env) newSink(t *testing.T, cfg *Config) *Sink {
	t.Helper()
	if cfg == nil {
		cfg = e.config()
	}
	s, err := New(e.js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if err := s.EnsureStream(testenv.Context(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	return s
}

func (e *env) streamMsgs(t *testing.T) uint64 {
	t.Helper()
	st, err := e.js.Stream(testenv.Context(t, 10*time.Second), e.stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(testenv.Context(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func msg(id, subject string, value []byte) sink.Message {
	return sink.Message{ID: id, Destination: subject, Key: []byte("k"), Value: value,
		Headers: []sink.Header{{Key: "id", Value: id}}}
}

func requireNoErrors(t *testing.T, errs []error, n int) {
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

// countingJS records the largest number of unacknowledged async publishes
// seen right after each submission.
type countingJS struct {
	jetstream.JetStream
	mu         sync.Mutex
	maxPending int
}

func (c *countingJS) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	f, err := c.JetStream.PublishMsgAsync(m, opts...)
	c.mu.Lock()
	c.maxPending = max(c.maxPending, c.JetStream.PublishAsyncPending())
	c.mu.Unlock()
	return f, err
}

func TestPublishBatchRoundTrip(t *testing.T) {
	for _, maxPending := range []int{0, 7} {
		t.Run(fmt.Sprintf("MaxPending=%d", maxPending), func(t *testing.T) {
			e := newEnv(t)
			cjs := &countingJS{JetStream: e.js}
			cfg := e.config()
			cfg.MaxPending = maxPending
			s, err := New(cjs, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if err := s.EnsureStream(testenv.Context(t, 10*time.Second)); err != nil {
				t.Fatal(err)
			}

			const n = 500
			msgs := make([]sink.Message, n)
			for i := range msgs {
				id := fmt.Sprintf("evt-%d-%s", i, e.prefix)
				key := fmt.Sprintf("agg-%d", i%5)
				msgs[i] = sink.Message{
					ID:          id,
					Destination: fmt.Sprintf("%s.orders.%s", e.prefix, key),
					Key:         []byte(key),
					Value:       fmt.Appendf(nil, `{"n":%d}`, i),
					Headers: []sink.Header{
						{Key: "id", Value: id},
						{Key: "type", Value: "order.created"},
						{Key: "trace", Value: "first"},
						{Key: "trace", Value: fmt.Sprint("second-", i)},
					},
				}
			}
			msgs[3].Value = nil // no payload is fine too

			requireNoErrors(t, s.Publish(testenv.Context(t, 10*time.Second), msgs), n)

			if maxPending > 0 && cjs.maxPending > maxPending {
				t.Errorf("saw %d unacknowledged publishes, MaxPending is %d", cjs.maxPending, maxPending)
			}
			st, err := e.js.Stream(testenv.Context(t, 10*time.Second), e.stream)
			if err != nil {
				t.Fatal(err)
			}
			for i, m := range msgs {
				got, err := st.GetMsg(testenv.Context(t, 10*time.Second), uint64(i+1))
				if err != nil {
					t.Fatalf("get seq %d: %v", i+1, err)
				}
				if got.Subject != m.Destination || !bytes.Equal(got.Data, m.Value) {
					t.Fatalf("seq %d: got %s %q, want %s %q", i+1, got.Subject, got.Data, m.Destination, m.Value)
				}
				h := got.Header
				if v := h.Get(jetstream.MsgIDHeader); v != m.ID {
					t.Fatalf("seq %d: Nats-Msg-Id %q, want %q", i+1, v, m.ID)
				}
				if v := h.Get("id"); v != m.ID {
					t.Fatalf("seq %d: id header %q, want %q", i+1, v, m.ID)
				}
				if v := h.Get("type"); v != "order.created" {
					t.Fatalf("seq %d: type header %q", i+1, v)
				}
				if v := h.Get(KeyHeader); v != string(m.Key) {
					t.Fatalf("seq %d: key header %q, want %q", i+1, v, m.Key)
				}
				if v, want := h.Values("trace"), []string{"first", fmt.Sprint("second-", i)}; !slices.Equal(v, want) {
					t.Fatalf("seq %d: trace headers %q, want %q", i+1, v, want)
				}
			}
			if got := e.streamMsgs(t); got != n {
				t.Fatalf("stream holds %d messages, want %d", got, n)
			}
		})
	}
}

func TestPublishDuplicateIDIsSuccess(t *testing.T) {
	e := newEnv(t)
	s := e.newSink(t, nil)
	m := msg("dup-"+e.prefix, e.prefix+".a", []byte("x"))

	requireNoErrors(t, s.Publish(testenv.Context(t, 10*time.Second), []sink.Message{m}), 1)
	requireNoErrors(t, s.Publish(testenv.Context(t, 10*time.Second), []sink.Message{m}), 1)    // duplicate PubAck
	requireNoErrors(t, s.Publish(testenv.Context(t, 10*time.Second), []sink.Message{m, m}), 2) // twice in one batch
	if got := e.streamMsgs(t); got != 1 {
		t.Fatalf("stream holds %d messages, want 1", got)
	}
}

func TestPublishOversizedIsPermanent(t *testing.T) {
	t.Run("server max_payload", func(t *testing.T) {
		e := newEnv(t)
		s := e.newSink(t, nil)
		big := make([]byte, e.nc.MaxPayload()+1)
		msgs := []sink.Message{
			msg("a-"+e.prefix, e.prefix+".a", []byte("small")),
			msg("b-"+e.prefix, e.prefix+".b", big),
			msg("c-"+e.prefix, e.prefix+".c", []byte("small")),
		}
		errs := s.Publish(testenv.Context(t, 10*time.Second), msgs)
		if errs[0] != nil || errs[2] != nil {
			t.Fatalf("small messages failed: %v", errs)
		}
		if !sink.IsPermanent(errs[1]) || !errors.Is(errs[1], nats.ErrMaxPayload) {
			t.Fatalf("oversized message: got %v, want a permanent max payload error", errs[1])
		}
		if !strings.Contains(errs[1].Error(), `natssink: publish to subject "`+e.prefix+`.b"`) {
			t.Errorf("error lacks context: %v", errs[1])
		}
		if got := e.streamMsgs(t); got != 2 {
			t.Fatalf("stream holds %d messages, want 2", got)
		}
	})
	t.Run("stream max_msg_size", func(t *testing.T) {
		e := newEnv(t)
		if _, err := e.js.CreateStream(testenv.Context(t, 10*time.Second), jetstream.StreamConfig{
			Name: e.stream, Subjects: []string{e.prefix + ".>"}, Storage: jetstream.MemoryStorage, MaxMsgSize: 1024,
		}); err != nil {
			t.Fatal(err)
		}
		s := e.newSink(t, nil)
		errs := s.Publish(testenv.Context(t, 10*time.Second), []sink.Message{
			msg("a-"+e.prefix, e.prefix+".a", make([]byte, 2048)),
			msg("b-"+e.prefix, e.prefix+".b", []byte("small")),
		})
		if !sink.IsPermanent(errs[0]) || !errors.Is(errs[0], jetstream.ErrStreamMessageExceedsMaximum) {
			t.Fatalf("oversized message: got %v, want a permanent max_msg_size error", errs[0])
		}
		if errs[1] != nil {
			t.Fatalf("small message: %v", errs[1])
		}
	})
}

func TestPublishInvalidSubjectIsPermanent(t *testing.T) {
	e := newEnv(t)
	s := e.newSink(t, nil)
	bad := []string{"", " ", e.prefix + ".a b", e.prefix + ".*", e.prefix + ".>", e.prefix + ".a*",
		e.prefix + "..a", "." + e.prefix, e.prefix + ".", e.prefix + ".a\tb", e.prefix + ".a\nb",
		e.prefix + "." + strings.Repeat("x", 5000)}
	var msgs []sink.Message
	for i, subj := range bad {
		msgs = append(msgs, msg(fmt.Sprintf("bad-%d-%s", i, e.prefix), subj, []byte("x")))
		msgs = append(msgs, msg(fmt.Sprintf("ok-%d-%s", i, e.prefix), e.prefix+".ok", []byte("x")))
	}
	errs := s.Publish(testenv.Context(t, 10*time.Second), msgs)
	for i, err := range errs {
		if i%2 == 1 {
			if err != nil {
				t.Errorf("valid message %d: %v", i, err)
			}
			continue
		}
		if !sink.IsPermanent(err) || !strings.Contains(err.Error(), "invalid subject") {
			t.Errorf("subject %.40q: got %v, want a permanent invalid subject error", msgs[i].Destination, err)
		}
	}
	if got, want := e.streamMsgs(t), uint64(len(bad)); got != want {
		t.Fatalf("stream holds %d messages, want %d", got, want)
	}
}

func TestPublishInvalidHeaderNameIsPermanent(t *testing.T) {
	e := newEnv(t)
	s := e.newSink(t, nil)
	bad := msg("h-"+e.prefix, e.prefix+".a", []byte("x"))
	bad.Headers = append(bad.Headers, sink.Header{Key: "bad name:", Value: "v"})
	errs := s.Publish(testenv.Context(t, 10*time.Second), []sink.Message{bad, msg("ok-"+e.prefix, e.prefix+".b", nil)})
	if !sink.IsPermanent(errs[0]) {
		t.Fatalf("invalid header name: got %v, want permanent", errs[0])
	}
	if errs[1] != nil {
		t.Fatal(errs[1])
	}
}

func TestPublishNoStreamIsTransient(t *testing.T) {
	e := newEnv(t)
	s := e.newSink(t, nil)
	subj := "nostream" + e.prefix + ".x"
	errs := s.Publish(testenv.Context(t, 10*time.Second), []sink.Message{
		msg("a-"+e.prefix, subj, []byte("x")),
		msg("b-"+e.prefix, e.prefix+".ok", []byte("x")),
	})
	err := errs[0]
	if err == nil || sink.IsPermanent(err) {
		t.Fatalf("got %v, want a transient error", err)
	}
	if !errors.Is(err, jetstream.ErrNoStreamResponse) ||
		!strings.Contains(err.Error(), fmt.Sprintf("no stream listens on subject %q", subj)) ||
		!strings.Contains(err.Error(), "Config.Subjects") {
		t.Fatalf("unclear error: %v", err)
	}
	if errs[1] != nil {
		t.Fatal(errs[1])
	}
}

func TestEnsureStream(t *testing.T) {
	t.Run("creates missing stream", func(t *testing.T) {
		e := newEnv(t)
		cfg := e.config()
		cfg.Subjects = []string{e.prefix + ".a.>", e.prefix + ".b.*"}
		s, err := New(e.js, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.EnsureStream(testenv.Context(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
		st, err := e.js.Stream(testenv.Context(t, 10*time.Second), e.stream)
		if err != nil {
			t.Fatalf("stream not created: %v", err)
		}
		c := st.CachedInfo().Config
		if !slices.Equal(c.Subjects, cfg.Subjects) || c.Storage != jetstream.FileStorage {
			t.Fatalf("created stream has subjects %q storage %v", c.Subjects, c.Storage)
		}
		if err := s.EnsureStream(testenv.Context(t, 10*time.Second)); err != nil {
			t.Fatalf("second call: %v", err)
		}
		requireNoErrors(t, s.Publish(testenv.Context(t, 10*time.Second), []sink.Message{msg("1", e.prefix+".b.x", nil)}), 1)
	})
	t.Run("leaves existing stream alone", func(t *testing.T) {
		e := newEnv(t)
		want := jetstream.StreamConfig{Name: e.stream, Subjects: []string{e.prefix + ".other.>"},
			Storage: jetstream.MemoryStorage, MaxMsgs: 42}
		if _, err := e.js.CreateStream(testenv.Context(t, 10*time.Second), want); err != nil {
			t.Fatal(err)
		}
		s, err := New(e.js, e.config())
		if err != nil {
			t.Fatal(err)
		}
		if err := s.EnsureStream(testenv.Context(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
		st, err := e.js.Stream(testenv.Context(t, 10*time.Second), e.stream)
		if err != nil {
			t.Fatal(err)
		}
		got := st.CachedInfo().Config
		if !slices.Equal(got.Subjects, want.Subjects) || got.Storage != want.Storage || got.MaxMsgs != want.MaxMsgs {
			t.Fatalf("existing stream changed: %+v", got)
		}
	})
	t.Run("existing with NoCreateStream is not compared", func(t *testing.T) {
		e := newEnv(t)
		if _, err := e.js.CreateStream(testenv.Context(t, 10*time.Second), jetstream.StreamConfig{
			Name: e.stream, Subjects: []string{e.prefix + ".other.>"}, Storage: jetstream.MemoryStorage}); err != nil {
			t.Fatal(err)
		}
		var logged strings.Builder
		cfg := e.config()
		cfg.NoCreateStream = true
		cfg.Logger = slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug}))
		s, err := New(e.js, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.EnsureStream(testenv.Context(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(logged.String(), "other subjects") || !strings.Contains(logged.String(), "stream exists") {
			t.Fatalf("with NoCreateStream, EnsureStream logged %q; want no comparison of subjects", logged.String())
		}
	})
	t.Run("missing with NoCreateStream", func(t *testing.T) {
		e := newEnv(t)
		cfg := e.config()
		cfg.NoCreateStream = true
		s, err := New(e.js, cfg)
		if err != nil {
			t.Fatal(err)
		}
		err = s.EnsureStream(testenv.Context(t, 10*time.Second))
		if err == nil || !strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), "NoCreateStream") ||
			!strings.Contains(err.Error(), e.stream) {
			t.Fatalf("got %v, want an error saying the stream is missing and NoCreateStream is set", err)
		}
		if _, err := e.js.Stream(testenv.Context(t, 10*time.Second), e.stream); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Fatalf("stream was created anyway (%v)", err)
		}
	})
}

func TestPublishContextCancelled(t *testing.T) {
	e := newEnv(t)
	s := e.newSink(t, nil)
	t.Run("before the call", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		errs := s.Publish(ctx, []sink.Message{msg("1", e.prefix+".a", nil), msg("2", e.prefix+".a", nil)})
		for i, err := range errs {
			if err != context.Canceled {
				t.Fatalf("message %d: %v, want context.Canceled", i, err)
			}
		}
	})
	t.Run("while waiting", func(t *testing.T) {
		// Publishes to a subject without a stream are retried by the
		// jetstream client for about 500ms, so they are still unfinished
		// when the deadline passes.
		var msgs []sink.Message
		msgs = append(msgs, msg("ok", e.prefix+".a", nil))
		for i := range 50 {
			msgs = append(msgs, msg(fmt.Sprint("n", i), "nostream"+e.prefix+".x", nil))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		start := time.Now()
		errs := s.Publish(ctx, msgs)
		if d := time.Since(start); d > 300*time.Millisecond {
			t.Fatalf("Publish returned after %v, long after the deadline", d)
		}
		if len(errs) != len(msgs) {
			t.Fatalf("got %d results", len(errs))
		}
		if errs[0] != nil && errs[0] != context.DeadlineExceeded {
			t.Fatalf("message 0: %v", errs[0])
		}
		for i, err := range errs[1:] {
			if err != context.DeadlineExceeded {
				t.Fatalf("message %d: %v, want context.DeadlineExceeded", i+1, err)
			}
		}
	})
	t.Run("window full", func(t *testing.T) {
		cfg := e.config()
		cfg.MaxPending = 2
		s := e.newSink(t, cfg)
		var msgs []sink.Message
		for i := range 10 {
			msgs = append(msgs, msg(fmt.Sprint("w", i), "nostream"+e.prefix+".x", nil))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		for i, err := range s.Publish(ctx, msgs) {
			if err != context.DeadlineExceeded {
				t.Fatalf("message %d: %v, want context.DeadlineExceeded", i, err)
			}
		}
	})
}

func TestPublishConnectionClosedMidBatch(t *testing.T) {
	e := newEnv(t)
	// A second connection, so that cleanup can still delete the stream.
	nc, err := nats.Connect(serverURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(js, e.config())
	if err != nil {
		t.Fatal(err)
	}
	msgs := []sink.Message{msg("1", "nostream"+e.prefix+".x", nil), msg("2", "nostream"+e.prefix+".y", nil)}
	time.AfterFunc(50*time.Millisecond, nc.Close)
	start := time.Now()
	errs := s.Publish(context.Background(), msgs)
	if d := time.Since(start); d > 300*time.Millisecond {
		t.Fatalf("Publish returned after %v", d)
	}
	for i, err := range errs {
		if err == nil || sink.IsPermanent(err) || !errors.Is(err, nats.ErrConnectionClosed) {
			t.Fatalf("message %d: %v, want transient connection closed", i, err)
		}
	}
	// And on a connection that is closed already.
	for i, err := range s.Publish(context.Background(), msgs) {
		if !errors.Is(err, nats.ErrConnectionClosed) || sink.IsPermanent(err) {
			t.Fatalf("message %d after close: %v", i, err)
		}
	}
}

func TestAckTimeout(t *testing.T) {
	e := newEnv(t)
	cfg := e.config()
	cfg.AckTimeout = 50 * time.Millisecond
	s := e.newSink(t, cfg)
	errs := s.Publish(testenv.Context(t, 10*time.Second), []sink.Message{msg("1", "nostream"+e.prefix+".x", nil)})
	if !errors.Is(errs[0], jetstream.ErrAsyncPublishTimeout) || sink.IsPermanent(errs[0]) {
		t.Fatalf("got %v, want a transient ack timeout", errs[0])
	}
}

func TestEmptyBatch(t *testing.T) {
	e := newEnv(t)
	s := e.newSink(t, nil)
	if errs := s.Publish(testenv.Context(t, 10*time.Second), nil); len(errs) != 0 {
		t.Fatalf("got %v", errs)
	}
}

func TestNewValidatesConfig(t *testing.T) {
	e := newEnv(t)
	s, err := New(e.js, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.cfg.Stream != "OUTBOX" || !slices.Equal(s.cfg.Subjects, []string{"outbox.event.>"}) ||
		s.cfg.MaxPending != 4096 || s.cfg.NoCreateStream || s.cfg.Logger == nil {
		t.Fatalf("defaults: %+v", s.cfg)
	}
	if _, err := New(nil, nil); err == nil {
		t.Fatal("New(nil) succeeded")
	}
	for name, cfg := range map[string]*Config{
		"Stream":     {Stream: "a.b"},
		"Subjects":   {Subjects: []string{"a..b"}},
		"Subjects ":  {Subjects: []string{"a.>.b"}},
		"Subjects  ": {Subjects: []string{"a.b*"}},
		"MaxPending": {MaxPending: -1},
		"AckTimeout": {AckTimeout: -time.Second},
	} {
		if _, err := New(e.js, cfg); err == nil || !strings.Contains(err.Error(), "Config."+strings.TrimSpace(name)) {
			t.Errorf("%+v: got %v, want an error naming Config.%s", cfg, err, strings.TrimSpace(name))
		}
	}
}

func TestCloseLeavesCallersConnectionOpen(t *testing.T) {
	e := newEnv(t)
	s := e.newSink(t, nil)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if e.nc.IsClosed() {
		t.Fatal("Close closed the caller's connection")
	}
	for _, err := range s.Publish(testenv.Context(t, 10*time.Second), []sink.Message{msg("1", e.prefix+".a", nil)}) {
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("Publish after Close: %v", err)
		}
	}
}

func TestDial(t *testing.T) {
	t.Run("publishes and owns the connection", func(t *testing.T) {
		e := newEnv(t)
		s, err := Dial(testenv.Context(t, 10*time.Second), serverURL, e.config())
		if err != nil {
			t.Fatal(err)
		}
		if err := s.EnsureStream(testenv.Context(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
		requireNoErrors(t, s.Publish(testenv.Context(t, 10*time.Second), []sink.Message{msg("1", e.prefix+".a", []byte("x"))}), 1)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if !s.owned.IsClosed() {
			t.Fatal("Close left the dialled connection open")
		}
		if err := s.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		if got := e.streamMsgs(t); got != 1 {
			t.Fatalf("stream holds %d messages", got)
		}
	})
	t.Run("bad URLs", func(t *testing.T) {
		for url, want := range map[string]string{
			"":                            "empty NATS URL",
			"http://127.0.0.1:4222":       `scheme "http" is not supported`,
			"127.0.0.1:4222":              "invalid NATS URL",
			"nats://127.0.0.1:4222/x":     "unexpected path",
			"nats://u:secret@host:1,ws:/": "invalid NATS URL",
		} {
			_, err := Dial(testenv.Context(t, 10*time.Second), url, nil)
			if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("Dial(%q): got %v, want a one-line error containing %q", url, err, want)
			}
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		url := "nats://" + addr
		_, err = Dial(testenv.Context(t, 10*time.Second), url, nil)
		if err == nil || !strings.Contains(err.Error(), "cannot connect to "+url) ||
			!strings.Contains(err.Error(), "is nats-server running with -js?") {
			t.Fatalf("got %v, want a clear connect error", err)
		}
	})
	t.Run("password is not shown", func(t *testing.T) {
		_, err := Dial(testenv.Context(t, 10*time.Second), "http://user:hunter2@127.0.0.1:4222", nil)
		if err == nil || strings.Contains(err.Error(), "hunter2") {
			t.Fatalf("got %v", err)
		}
	})
}
