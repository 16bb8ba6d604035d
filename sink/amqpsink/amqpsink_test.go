package amqpsink

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"github.com/outboxkit/outbox/internal/faultproxy"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/sink"
)

// envURL overrides the broker the tests use.
const envURL = "OUTBOX_TEST_AMQP_URL"

const startHint = "start it with: rabbitmq-server -detached"

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func brokerURL() string {
	if u := os.Getenv(envURL); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// env is one test's connection to the broker and its own exchange; every
// queue and exchange it declares is deleted when the test ends.
type env struct {
	conn     *amqp.Connection
	ch       *amqp.Channel
	exchange string
	prefix   string // unique, for queue names and routing keys

	mu        sync.Mutex
	queues    []string
	exchanges []string
}

// dialBroker connects to the test broker or fails the test saying how to
// start it.
func dialBroker(t testing.TB) *amqp.Connection {
	t.Helper()
	conn, err := amqp.DialConfig(brokerURL(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		t.Fatalf("RabbitMQ is not reachable at %s (set %s to use another broker): %v; %s", redact(brokerURL()), envURL, err, startHint)
	}
	return conn
}

func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(invalid URL)"
	}
	return u.Redacted()
}

func newEnv(t testing.TB) *env {
	t.Helper()
	conn := dialBroker(t)
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		t.Fatal(err)
	}
	id := testenv.Hex(t)
	e := &env{conn: conn, ch: ch, exchange: "t.ex." + id, prefix: "t." + id}
	t.Cleanup(func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		ch, err := conn.Channel()
		if err == nil {
			for _, q := range e.queues {
				if _, err := ch.QueueDelete(q, false, false, false); err != nil {
					t.Errorf("delete queue %s: %v", q, err)
					ch, _ = conn.Channel()
				}
			}
			for _, x := range append(e.exchanges, e.exchange) {
				if err := ch.ExchangeDelete(x, false, false); err != nil {
					t.Errorf("delete exchange %s: %v", x, err)
					ch, _ = conn.Channel()
				}
			}
		}
		conn.Close()
	})
	return e
}

// declareExchange declares the test's exchange (topic, durable).
func (e *env) declareExchange(t testing.TB) {
	t.Helper()
	if err := e.ch.ExchangeDeclare(e.exchange, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
}

// queue declares a durable queue bound to the test's exchange with keys and
// returns its name.
func (e *env) queue(t testing.TB, name string, args amqp.Table, keys ...string) string {
	t.Helper()
	q := e.prefix + "." + name
	e.mu.Lock()
	e.queues = append(e.queues, q)
	e.mu.Unlock()
	if _, err := e.ch.QueueDeclare(q, true, false, false, false, args); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if err := e.ch.QueueBind(q, k, e.exchange, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	return q
}

// drain removes and returns every message in queue q.
func (e *env) drain(t testing.TB, q string) []amqp.Delivery {
	t.Helper()
	var out []amqp.Delivery
	for {
		d, ok, err := e.ch.Get(q, true)
		if err != nil {
			t.Fatalf("get from %s: %v", q, err)
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

func (e *env) config() *Config {
	return &Config{Exchange: e.exchange}
}

// newSink returns a sink on the env's exchange over a connection of its own.
func (e *env) newSink(t testing.TB, cfg *Config) *Sink {
	t.Helper()
	if cfg == nil {
		cfg = e.config()
	}
	s, err := Dial(testenv.Context(t, 30*time.Second), brokerURL(), cfg)
	if err != nil {
		t.Fatalf("%v; %s", err, startHint)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
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

func TestPublishRoutingHeadersAndProperties(t *testing.T) {
	e := newEnv(t)
	e.declareExchange(t)
	qa := e.queue(t, "a", nil, e.prefix+".a.*")
	qb := e.queue(t, "b", nil, e.prefix+".b.#")
	s := e.newSink(t, nil)

	msgs := []sink.Message{
		{ID: "e1", Destination: e.prefix + ".a.x", Key: []byte("agg-1"), Value: []byte(`{"n":1}`),
			Headers: []sink.Header{{Key: "id", Value: "e1"}, {Key: "type", Value: "order.created"}, {Key: "trace", Value: "t1"}, {Key: "trace", Value: "t2"}, {Key: "trace", Value: "t3"}}},
		{ID: "e2", Destination: e.prefix + ".b.y.z", Key: []byte("agg-2"), Value: []byte("not json \x00\xff")},
		{ID: "e3", Destination: e.prefix + ".a.y", Value: nil, Headers: []sink.Header{{Key: "key", Value: "own-key"}}},
		{ID: "e4", Destination: e.prefix + ".a.x", Key: []byte("agg-1"), Value: []byte(`"s"`)},
	}
	requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), msgs), len(msgs))

	a := e.drain(t, qa)
	b := e.drain(t, qb)
	if len(a) != 3 || len(b) != 1 {
		t.Fatalf("queue a holds %d messages, b %d; want 3 and 1", len(a), len(b))
	}
	for i, want := range []int{0, 2, 3} {
		if a[i].MessageId != msgs[want].ID {
			t.Errorf("queue a message %d: message-id %q, want %q (routing or order wrong)", i, a[i].MessageId, msgs[want].ID)
		}
	}
	d := a[0]
	if d.Exchange != e.exchange || d.RoutingKey != e.prefix+".a.x" {
		t.Errorf("exchange %q routing key %q, want %q and %q", d.Exchange, d.RoutingKey, e.exchange, e.prefix+".a.x")
	}
	if d.DeliveryMode != amqp.Persistent {
		t.Errorf("delivery mode %d, want persistent (2)", d.DeliveryMode)
	}
	if d.ContentType != "application/json" {
		t.Errorf("content type %q, want application/json", d.ContentType)
	}
	if string(d.Body) != `{"n":1}` {
		t.Errorf("body %q", d.Body)
	}
	if d.Headers["id"] != "e1" || d.Headers["type"] != "order.created" || d.Headers["key"] != "agg-1" {
		t.Errorf("headers %v: want id e1, type order.created, key agg-1", d.Headers)
	}
	if tr, _ := d.Headers["trace"].([]any); !slices.Equal(tr, []any{"t1", "t2", "t3"}) {
		t.Errorf("repeated header trace = %#v, want [t1 t2 t3]", d.Headers["trace"])
	}
	if got := b[0]; got.ContentType != "application/octet-stream" || string(got.Body) != "not json \x00\xff" ||
		got.Headers["id"] != "e2" || got.Headers["key"] != "agg-2" || got.DeliveryMode != amqp.Persistent {
		t.Errorf("binary message: content type %q body %q headers %v mode %d", got.ContentType, got.Body, got.Headers, got.DeliveryMode)
	}
	if got := a[1]; got.Headers["key"] != "own-key" || len(got.Body) != 0 || got.Headers["id"] != "e3" {
		t.Errorf("message with its own key header and no body: headers %v body %q", got.Headers, got.Body)
	}
}

func TestCustomRouteAndKeyHeader(t *testing.T) {
	e := newEnv(t)
	q := e.prefix + ".direct"
	e.mu.Lock()
	e.queues = append(e.queues, q)
	e.mu.Unlock()
	if _, err := e.ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	// The default exchange routes to the queue named by the routing key.
	s := e.newSink(t, &Config{
		Route:     func(dest string) (string, string) { return "", e.prefix + "." + dest },
		KeyHeader: "x-aggregate",
	})
	requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), []sink.Message{{ID: "r1", Destination: "direct", Key: []byte("agg"), Value: []byte(`{}`)}}), 1)
	got := e.drain(t, q)
	if len(got) != 1 || got[0].MessageId != "r1" || got[0].Headers["x-aggregate"] != "agg" || got[0].Headers["key"] != nil {
		t.Fatalf("got %+v", got)
	}
}

func TestUnroutableIsPermanentFailure(t *testing.T) {
	e := newEnv(t)
	e.declareExchange(t)
	q := e.queue(t, "bound", nil, e.prefix+".bound")
	s := e.newSink(t, &Config{Exchange: e.exchange, MaxInFlight: 3})

	var msgs []sink.Message
	for i := range 10 {
		dest := e.prefix + ".bound"
		if i%3 == 1 {
			dest = e.prefix + ".nobody-listens"
		}
		msgs = append(msgs, sink.Message{ID: fmt.Sprint("u", i), Destination: dest, Value: []byte(`{}`)})
	}
	errs := s.Publish(testenv.Context(t, 30*time.Second), msgs)
	routed := 0
	for i, err := range errs {
		if i%3 != 1 {
			if err != nil {
				t.Errorf("routable message %d: %v", i, err)
			}
			routed++
			continue
		}
		if err == nil {
			t.Errorf("unroutable message %d reported as a success", i)
			continue
		}
		if !sink.IsPermanent(err) || sink.IsUnavailable(err) || !errors.Is(err, ErrUnroutable) {
			t.Errorf("unroutable message %d: %v; want permanent, wrapping ErrUnroutable", i, err)
		}
		// RabbitMQ's words, and what fixes it for the relay's user and
		// for a program's.
		for _, want := range []string{e.exchange, e.prefix + ".nobody-listens", "no queue is bound to the exchange", "binding key", "routing key",
			"--destination", "Config.Queues", "Config.Route"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("unroutable message %d: error %q does not mention %q", i, err, want)
			}
		}
	}
	if got := e.drain(t, q); len(got) != routed {
		t.Errorf("queue holds %d messages, want %d", len(got), routed)
	}
	// The channel is still fine.
	requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), msgs[:1]), 1)
}

func TestMissingExchangeIsPermanentAndSparesTheBatch(t *testing.T) {
	e := newEnv(t)
	e.declareExchange(t)
	q := e.queue(t, "q", nil, "#")
	missing := e.exchange + ".missing"
	s := e.newSink(t, &Config{Exchange: e.exchange, Route: func(dest string) (string, string) {
		if strings.HasPrefix(dest, "missing.") {
			return missing, dest
		}
		return e.exchange, dest
	}})
	msgs := []sink.Message{
		{ID: "m1", Destination: "ok.1"},
		{ID: "m2", Destination: "missing.1"},
		{ID: "m3", Destination: "ok.2"},
	}
	for round := range 2 {
		errs := s.Publish(testenv.Context(t, 30*time.Second), msgs)
		if errs[0] != nil || errs[2] != nil {
			t.Fatalf("round %d: messages to an existing exchange: %v, %v", round, errs[0], errs[2])
		}
		if !sink.IsPermanent(errs[1]) || !strings.Contains(errs[1].Error(), fmt.Sprintf("the exchange %q (from Config.Route) does not exist", missing)) {
			t.Fatalf("round %d: message to a missing exchange: %v; want a permanent error naming it", round, errs[1])
		}
	}
	if got := e.drain(t, q); len(got) != 4 {
		t.Errorf("queue holds %d messages, want 4", len(got))
	}

	// An exchange deleted after the sink checked it: the broker closes the
	// channel, and only the message for the deleted exchange fails.
	other := e.exchange + ".other"
	e.mu.Lock()
	e.exchanges = append(e.exchanges, other)
	e.mu.Unlock()
	if err := e.ch.ExchangeDeclare(other, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.ch.ExchangeBind(e.exchange, "#", other, false, nil); err != nil {
		t.Fatal(err)
	}
	s2 := e.newSink(t, &Config{Exchange: e.exchange, Route: func(dest string) (string, string) {
		if strings.HasPrefix(dest, "other.") {
			return other, dest
		}
		return e.exchange, dest
	}})
	requireNoErrors(t, s2.Publish(testenv.Context(t, 30*time.Second), []sink.Message{{ID: "o1", Destination: "other.1"}}), 1)
	if err := e.ch.ExchangeDelete(other, false, false); err != nil {
		t.Fatal(err)
	}
	var batch []sink.Message
	for i := range 20 {
		dest := fmt.Sprint("ok.", i)
		if i == 7 {
			dest = "other.7"
		}
		batch = append(batch, sink.Message{ID: fmt.Sprint("d", i), Destination: dest, Value: []byte(`{}`)})
	}
	errs := s2.Publish(testenv.Context(t, 30*time.Second), batch)
	for i, err := range errs {
		if i == 7 {
			if !sink.IsPermanent(err) || !isCode(err, amqp.NotFound) {
				t.Errorf("message to the deleted exchange: %v; want permanent not-found", err)
			}
		} else if err != nil {
			t.Errorf("message %d: %v", i, err)
		}
	}
	got := e.drain(t, q)
	ids := map[string]int{}
	for _, d := range got {
		ids[d.MessageId]++
	}
	for i := range 20 {
		if id := fmt.Sprint("d", i); i != 7 && ids[id] == 0 {
			t.Errorf("message %s is not in the queue", id)
		}
	}
}

func TestNackIsTransient(t *testing.T) {
	e := newEnv(t)
	e.declareExchange(t)
	q := e.queue(t, "full", amqp.Table{"x-max-length": int32(2), "x-overflow": "reject-publish"}, e.prefix+".full")
	s := e.newSink(t, nil)
	var msgs []sink.Message
	for i := range 5 {
		msgs = append(msgs, sink.Message{ID: fmt.Sprint("n", i), Destination: e.prefix + ".full", Value: []byte(`{}`)})
	}
	errs := s.Publish(testenv.Context(t, 30*time.Second), msgs)
	for i, err := range errs {
		if i < 2 {
			if err != nil {
				t.Errorf("message %d: %v", i, err)
			}
			continue
		}
		if !errors.Is(err, ErrNacked) || sink.IsPermanent(err) || sink.IsUnavailable(err) {
			t.Errorf("message %d to a full reject-publish queue: %v; want a transient error wrapping ErrNacked", i, err)
		}
	}
	if got := e.drain(t, q); len(got) != 2 {
		t.Errorf("queue holds %d messages, want 2", len(got))
	}
	// Room again: the same messages go through.
	requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), msgs[2:4]), 2)
}

func TestTooLarge(t *testing.T) {
	e := newEnv(t)
	e.declareExchange(t)
	q := e.queue(t, "q", nil, "#")

	t.Run("ConfigLimit", func(t *testing.T) {
		s := e.newSink(t, &Config{Exchange: e.exchange, MaxMessageSize: 10})
		errs := s.Publish(testenv.Context(t, 30*time.Second), []sink.Message{
			{ID: "s1", Destination: "x", Value: []byte("0123456789")},
			{ID: "big", Destination: "x", Value: []byte("0123456789a")},
			{ID: "s2", Destination: "x", Value: []byte("0")},
		})
		if errs[0] != nil || errs[2] != nil || !sink.IsPermanent(errs[1]) || !strings.Contains(errs[1].Error(), "MaxMessageSize") {
			t.Fatalf("got %v", errs)
		}
		if got := e.drain(t, q); len(got) != 2 {
			t.Errorf("queue holds %d messages, want 2", len(got))
		}
	})

	// The broker's own limit (max_message_size, 128 MiB by default in
	// RabbitMQ 3.x): it closes the channel, and the sink finds the culprit.
	t.Run("BrokerLimit", func(t *testing.T) {
		s := e.newSink(t, &Config{Exchange: e.exchange, MaxMessageSize: -1})
		var msgs []sink.Message
		for i := range 6 {
			msgs = append(msgs, sink.Message{ID: fmt.Sprint("b", i), Destination: "x", Key: []byte("k"), Value: []byte(`{}`)})
		}
		msgs[2].Value = make([]byte, DefaultMaxMessageSize+1)
		errs := s.Publish(testenv.Context(t, 30*time.Second), msgs)
		for i, err := range errs {
			if i == 2 {
				if !sink.IsPermanent(err) || sink.IsUnavailable(err) || !isCode(err, amqp.PreconditionFailed) {
					t.Errorf("oversized message: %v; want a permanent PRECONDITION_FAILED", err)
				}
				continue
			}
			if err != nil {
				t.Errorf("message %d: %v", i, err)
			}
		}
		var ids []string
		for _, d := range e.drain(t, q) {
			ids = append(ids, d.MessageId)
		}
		if !slices.Equal(ids, []string{"b0", "b1", "b3", "b4", "b5"}) {
			t.Errorf("queue holds %v, want b0 b1 b3 b4 b5 in order", ids)
		}
	})
}

func TestInvalidMessagesArePermanent(t *testing.T) {
	e := newEnv(t)
	e.declareExchange(t)
	q := e.queue(t, "q", nil, "#")
	s := e.newSink(t, nil)
	long := strings.Repeat("x", 256)
	errs := s.Publish(testenv.Context(t, 30*time.Second), []sink.Message{
		{ID: "ok1", Destination: "a"},
		{ID: "x1", Destination: ""},
		{ID: "x2", Destination: long},
		{ID: long, Destination: "a"},
		{ID: "x4", Destination: "a", Headers: []sink.Header{{Key: long, Value: "v"}}},
		{ID: "ok2", Destination: "a"},
	})
	for i, err := range errs {
		if i == 0 || i == 5 {
			if err != nil {
				t.Errorf("message %d: %v", i, err)
			}
		} else if !sink.IsPermanent(err) {
			t.Errorf("message %d: %v, want permanent", i, err)
		}
	}
	if got := e.drain(t, q); len(got) != 2 {
		t.Errorf("queue holds %d messages, want 2", len(got))
	}
}

func TestBatchLargerThanMaxInFlightKeepsOrder(t *testing.T) {
	e := newEnv(t)
	e.declareExchange(t)
	q := e.queue(t, "q", nil, "#")
	s := e.newSink(t, &Config{Exchange: e.exchange, MaxInFlight: 7})
	msgs := make([]sink.Message, 500)
	for i := range msgs {
		msgs[i] = sink.Message{ID: fmt.Sprint("o", i), Destination: "orders", Key: []byte("k"), Value: fmt.Appendf(nil, `{"i":%d}`, i)}
	}
	requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), msgs), len(msgs))
	got := e.drain(t, q)
	if len(got) != len(msgs) {
		t.Fatalf("queue holds %d messages, want %d", len(got), len(msgs))
	}
	for i, d := range got {
		if d.MessageId != msgs[i].ID {
			t.Fatalf("position %d holds %s, want %s", i, d.MessageId, msgs[i].ID)
		}
	}
}

func TestConcurrentPublish(t *testing.T) {
	e := newEnv(t)
	e.declareExchange(t)
	q := e.queue(t, "q", nil, "#")
	s := e.newSink(t, nil)
	var wg sync.WaitGroup
	const workers, per = 8, 50
	for w := range workers {
		wg.Go(func() {
			for b := range 5 {
				msgs := make([]sink.Message, per/5)
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
	if got := e.drain(t, q); len(got) != workers*per {
		t.Errorf("queue holds %d messages, want %d", len(got), workers*per)
	}
}

func TestSetup(t *testing.T) {
	e := newEnv(t)
	qName := e.prefix + ".setup"
	e.mu.Lock()
	e.queues = append(e.queues, qName)
	e.mu.Unlock()

	// Without Declare, a missing exchange is reported, with the relay's
	// flags and the Config fields that fix it.
	s := e.newSink(t, nil)
	err := s.Setup(testenv.Context(t, 30*time.Second))
	for _, want := range []string{fmt.Sprintf("the exchange %q does not exist", e.exchange), "--amqp-exchange", "Config.Exchange", "--amqp-declare", "Config.Declare"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Setup without Declare on a missing exchange: %v; want it to say %q", err, want)
		}
	}

	cfg := &Config{Exchange: e.exchange, Declare: true, Queues: []Queue{{Name: qName, BindingKeys: []string{"orders.#", "payments.*"}}}}
	s = e.newSink(t, cfg)
	for range 2 { // idempotent
		if err := s.Setup(testenv.Context(t, 30*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	errs := s.Publish(testenv.Context(t, 30*time.Second), []sink.Message{
		{ID: "s1", Destination: "orders.eu.created"},
		{ID: "s2", Destination: "payments.done"},
		{ID: "s3", Destination: "shipping.done"},
	})
	if errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], ErrUnroutable) {
		t.Fatalf("got %v", errs)
	}
	if got := e.drain(t, qName); len(got) != 2 {
		t.Errorf("queue holds %d messages, want 2", len(got))
	}
	q, err := e.ch.QueueDeclarePassive(qName, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("the queue Setup declared: %v", err)
	}
	_ = q
	// The exchange is durable: a declaration with durable=false fails.
	ch, err := e.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(e.exchange, "topic", false, false, false, false, nil); !isCode(err, amqp.PreconditionFailed) {
		t.Errorf("declaring the exchange non-durable: %v; want PRECONDITION_FAILED as Setup declared it durable", err)
	}

	// Now it exists: Setup without Declare passes.
	if err := e.newSink(t, nil).Setup(testenv.Context(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	// Another type for an existing exchange is reported.
	err = e.newSink(t, &Config{Exchange: e.exchange, ExchangeType: "fanout", Declare: true}).Setup(testenv.Context(t, 30*time.Second))
	for _, want := range []string{fmt.Sprintf("the exchange %q exists", e.exchange), "is not a durable fanout exchange", "--amqp-exchange", "Config.ExchangeType"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Setup with another exchange type: %v; want it to say %q", err, want)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{MaxInFlight: -1}, "MaxInFlight"},
		{Config{ConfirmTimeout: -1}, "ConfirmTimeout"},
		{Config{DialTimeout: -1}, "DialTimeout"},
		{Config{Queues: []Queue{{Name: "q", BindingKeys: []string{"#"}}}}, "Declare"},
		{Config{Declare: true, Queues: []Queue{{Name: "q"}}}, "BindingKeys"},
		{Config{Declare: true, Queues: []Queue{{BindingKeys: []string{"#"}}}}, "Name"},
		{Config{Exchange: strings.Repeat("x", 256)}, "(--amqp-exchange; Config.Exchange)"},
	} {
		if _, err := normalize(&tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error about %s", tc.cfg, err, tc.want)
		}
	}
	if _, err := New(nil, nil); err == nil {
		t.Error("New(nil) succeeded")
	}
}

func TestDialErrors(t *testing.T) {
	ctx := testenv.Context(t, 30*time.Second)
	for _, tc := range []struct{ url, want string }{
		{"", "empty URL"},
		{"http://127.0.0.1:5672/", `scheme "http"`},
		{"127.0.0.1:5672", "invalid URL"},
	} {
		if _, err := Dial(ctx, tc.url, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Dial(%q): %v, want an error with %q", tc.url, err, tc.want)
		}
	}

	u, err := url.Parse(brokerURL())
	if err != nil {
		t.Fatal(err)
	}
	dialBroker(t).Close() // the broker is up
	u.User = url.UserPassword("guest", "s3cret-wrong")
	_, err = Dial(ctx, u.String(), nil)
	if err == nil || strings.Contains(err.Error(), "s3cret-wrong") || !strings.Contains(err.Error(), "check the user name, password") {
		t.Errorf("Dial with a wrong password: %v; want an error that hides the password", err)
	}

	p, err := faultproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Cut()
	u.Host = p.Addr()
	start := time.Now()
	if _, err := Dial(ctx, u.String(), nil); err == nil || !strings.Contains(err.Error(), "cannot connect") {
		t.Errorf("Dial to a cut proxy: %v", err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("Dial to a cut proxy took %v", el)
	}

	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Dial(cctx, brokerURL(), nil); !errors.Is(err, context.Canceled) {
		t.Errorf("Dial with a cancelled context: %v", err)
	}
}

func TestNewLeavesConnectionOpen(t *testing.T) {
	e := newEnv(t)
	e.declareExchange(t)
	q := e.queue(t, "q", nil, "#")
	conn := dialBroker(t)
	defer conn.Close()
	s, err := New(conn, e.config())
	if err != nil {
		t.Fatal(err)
	}
	requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), []sink.Message{{ID: "n1", Destination: "a"}}), 1)
	if err := s.Setup(testenv.Context(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if conn.IsClosed() {
		t.Fatal("Close closed the caller's connection")
	}
	for _, err := range s.Publish(testenv.Context(t, 30*time.Second), []sink.Message{{ID: "n2", Destination: "a"}}) {
		if !errors.Is(err, ErrClosed) || sink.IsPermanent(err) {
			t.Errorf("Publish after Close: %v", err)
		}
	}
	if got := e.drain(t, q); len(got) != 1 {
		t.Errorf("queue holds %d messages, want 1", len(got))
	}

	// A closed caller connection: Unavailable, the sink cannot reopen it.
	s2, err := New(conn, e.config())
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	conn.Close()
	for _, err := range s2.Publish(testenv.Context(t, 30*time.Second), []sink.Message{{ID: "n3", Destination: "a"}}) {
		if !sink.IsUnavailable(err) || !strings.Contains(err.Error(), "New is closed") {
			t.Errorf("Publish on a closed connection: %v", err)
		}
	}
}

func TestCancelledContext(t *testing.T) {
	e := newEnv(t)
	e.declareExchange(t)
	e.queue(t, "q", nil, "#")
	s := e.newSink(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	msgs := []sink.Message{{ID: "c1", Destination: "a"}, {ID: "c2", Destination: "a"}}
	for _, err := range s.Publish(ctx, msgs) {
		if !errors.Is(err, context.Canceled) || sink.IsPermanent(err) {
			t.Errorf("got %v", err)
		}
	}
	requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), msgs), 2)
}

// TestOutageAndReconnect cuts the connection between the sink and the
// broker: publishes fail as Unavailable, and after the cut ends the next
// Publish dials again and succeeds.
func TestOutageAndReconnect(t *testing.T) {
	e := newEnv(t)
	e.declareExchange(t)
	q := e.queue(t, "q", nil, "#")
	u, err := url.Parse(brokerURL())
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	u.Host = p.Addr()
	s, err := Dial(testenv.Context(t, 30*time.Second), u.String(), &Config{Exchange: e.exchange, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	msg := func(id string) []sink.Message {
		return []sink.Message{{ID: id + "a", Destination: "x"}, {ID: id + "b", Destination: "x"}}
	}
	requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), msg("before")), 2)

	p.Cut()
	for round := range 3 {
		start := time.Now()
		errs := s.Publish(testenv.Context(t, 30*time.Second), msg(fmt.Sprint("cut", round)))
		if el := time.Since(start); el > 5*time.Second {
			t.Errorf("round %d: Publish during the outage took %v", round, el)
		}
		for i, err := range errs {
			if !sink.IsUnavailable(err) || sink.IsPermanent(err) {
				t.Errorf("round %d message %d: %v; want Unavailable", round, i, err)
			}
			if err != nil && strings.Contains(err.Error(), "guest:guest") {
				t.Errorf("error shows the password: %v", err)
			}
		}
		t.Logf("round %d: %v", round, errs[0])
	}
	p.Restore()
	requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), msg("after")), 2)
	var ids []string
	for _, d := range e.drain(t, q) {
		ids = append(ids, d.MessageId)
	}
	if !slices.Equal(ids, []string{"beforea", "beforeb", "aftera", "afterb"}) {
		t.Errorf("queue holds %v", ids)
	}
	if err := s.Setup(testenv.Context(t, 30*time.Second)); err != nil {
		t.Errorf("Setup after reconnecting: %v", err)
	}
}

// TestPublishAbandonedByDeadline: a deadline that ends mid-batch makes
// Publish return at once; what failed can be published again.
func TestPublishAbandonedByDeadline(t *testing.T) {
	e := newEnv(t)
	e.declareExchange(t)
	q := e.queue(t, "q", nil, "#")
	s := e.newSink(t, nil)
	msgs := make([]sink.Message, 3000)
	for i := range msgs {
		msgs[i] = sink.Message{ID: fmt.Sprint("d", i), Destination: "x", Value: []byte(strings.Repeat("v", 300))}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Millisecond)
	defer cancel()
	start := time.Now()
	errs := s.Publish(ctx, msgs)
	if el := time.Since(start); el > time.Second {
		t.Errorf("Publish took %v after a 3ms deadline", el)
	}
	var failed []sink.Message
	for i, err := range errs {
		if err != nil {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("message %d: %v", i, err)
			}
			failed = append(failed, msgs[i])
		}
	}
	t.Logf("%d of %d failed with the deadline", len(failed), len(msgs))
	requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), failed), len(failed))
	ids := map[string]bool{}
	for _, d := range e.drain(t, q) {
		ids[d.MessageId] = true
	}
	for _, m := range msgs {
		if !ids[m.ID] {
			t.Fatalf("message %s missing", m.ID)
		}
	}
}

func TestConfirmTimeoutIsUnavailable(t *testing.T) {
	e := newEnv(t)
	e.declareExchange(t)
	e.queue(t, "q", nil, "#")
	// A confirm cannot arrive within a nanosecond.
	s := e.newSink(t, &Config{Exchange: e.exchange, ConfirmTimeout: time.Nanosecond})
	msgs := make([]sink.Message, 50)
	for i := range msgs {
		msgs[i] = sink.Message{ID: fmt.Sprint("t", i), Destination: "x"}
	}
	timeouts := 0
	for i, err := range s.Publish(testenv.Context(t, 30*time.Second), msgs) {
		if err == nil {
			continue
		}
		if !sink.IsUnavailable(err) || !strings.Contains(err.Error(), "no confirm within") {
			t.Errorf("message %d: %v; want an Unavailable confirm timeout", i, err)
		}
		timeouts++
	}
	if timeouts == 0 {
		t.Error("no confirm timed out after a nanosecond")
	}
}

func TestBlockedConnectionIsUnavailable(t *testing.T) {
	e := newEnv(t)
	e.declareExchange(t)
	q := e.queue(t, "q", nil, "#")
	s := e.newSink(t, nil)
	// As the connection watcher records a connection.blocked from the
	// broker (a memory or disk alarm).
	reason := "low on memory"
	s.cs.blocked.Store(&reason)
	for _, err := range s.Publish(testenv.Context(t, 30*time.Second), []sink.Message{{ID: "b1", Destination: "x"}}) {
		if !sink.IsUnavailable(err) || !strings.Contains(err.Error(), "low on memory") {
			t.Errorf("Publish on a blocked connection: %v", err)
		}
	}
	s.cs.blocked.Store(nil)
	requireNoErrors(t, s.Publish(testenv.Context(t, 30*time.Second), []sink.Message{{ID: "b2", Destination: "x"}}), 1)
	if got := e.drain(t, q); len(got) != 1 {
		t.Errorf("queue holds %d messages, want 1", len(got))
	}
}

// TestCloseDuringPublish closes a sink on the caller's connection while
// Publish calls are under way: they all return, with a result per message,
// and Close returns too.
func TestCloseDuringPublish(t *testing.T) {
	e := newEnv(t)
	e.declareExchange(t)
	e.queue(t, "q", nil, "#")
	conn := dialBroker(t)
	defer conn.Close()
	s, err := New(conn, e.config())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			msgs := make([]sink.Message, 2000)
			for i := range msgs {
				msgs[i] = sink.Message{ID: fmt.Sprintf("c%d-%d", w, i), Destination: "x", Value: []byte(`{}`)}
			}
			errs := s.Publish(testenv.Context(t, 30*time.Second), msgs)
			for i, err := range errs {
				if err != nil && !errors.Is(err, ErrClosed) {
					t.Errorf("worker %d message %d: %v", w, i, err)
				}
			}
		})
	}
	time.Sleep(5 * time.Millisecond)
	done := make(chan struct{})
	go func() { _ = s.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	wg.Wait()
	if conn.IsClosed() {
		t.Error("Close closed the caller's connection")
	}
}
