package webhookconsumer_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/inbox/consumertest"
	"github.com/outboxkit/outbox/inbox/internal/pgstore"
	"github.com/outboxkit/outbox/inbox/webhookconsumer"
	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/webhooksink"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture is an inbox with an effects table, a receiver served on a
// loopback server, and webhooksink posting to it.
type fixture struct {
	st     consumertest.Store[pgx.Tx]
	ib     *inbox.Inbox[pgx.Tx]
	m      counts
	secret string
	srv    *httptest.Server
	sink   *webhooksink.Sink
	// wrap, when set, serves instead of the receiver (it calls next).
	wrap  func(w http.ResponseWriter, r *http.Request, next http.Handler)
	calls atomic.Int64
	fail  atomic.Int64 // the handler fails (transiently) this many more times
}

type counts struct{ n [5]atomic.Int64 }

func (c *counts) Handled(_ string, o inbox.Outcome, _ time.Duration) { c.n[o].Add(1) }

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{st: pgstore.New(t), secret: webhooksink.NewSecret()}
	f.ib = f.st.Inbox(t, "billing", &f.m)
	rcv, err := webhookconsumer.New(f.ib, f.handler, &webhookconsumer.Config{Secrets: []string{f.secret}})
	if err != nil {
		t.Fatal(err)
	}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f.wrap != nil {
			f.wrap(w, r, rcv)
			return
		}
		rcv.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	s, err := webhooksink.New(&webhooksink.Config{URL: f.srv.URL + "/hooks/" + webhooksink.Placeholder, Secrets: []string{f.secret}, AllowPrivate: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	f.sink = s
	return f
}

// handler records one effect per event; a payload that is not JSON is a
// permanent error, and it fails while f.fail is positive.
func (f *fixture) handler(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
	f.calls.Add(1)
	if f.fail.Add(-1) >= 0 {
		return errors.New("the database of the effect is down")
	}
	var body map[string]any
	if err := json.Unmarshal(msg.Payload, &body); err != nil {
		return consumer.Permanent(fmt.Errorf("payload does not decode: %w", err))
	}
	return f.st.Effect(ctx, tx, "billing", consumertest.Effect{EventID: strings.ToLower(msg.EventID), AggregateID: msg.AggregateID})
}

func (f *fixture) effects(t *testing.T) map[string]int {
	out := map[string]int{}
	for _, e := range f.st.Effects(t, "billing") {
		out[e.EventID]++
	}
	return out
}

func event(n int) sink.Message {
	id := uuid.Must(uuid.NewV7()).String()
	return sink.Message{ID: id, Destination: "outbox.event.order", Key: []byte(strconv.Itoa(n % 3)), Value: []byte(fmt.Sprintf(`{"n":%d}`, n))}
}

func (f *fixture) publish(t *testing.T, msgs ...sink.Message) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return f.sink.Publish(ctx, msgs)
}

// TestEffectOnceAndRetriesAreDuplicates posts 10 events twice (a relay's
// retry, and a replay inside the tolerance window): every request is
// answered 2xx, each event takes effect once, the second copies are
// duplicates, and the handler sees the fields webhooksink sends.
func TestEffectOnceAndRetriesAreDuplicates(t *testing.T) {
	f := newFixture(t)
	var msgs []sink.Message
	for i := range 10 {
		msgs = append(msgs, event(i))
	}
	for round := range 2 {
		for i, err := range f.publish(t, msgs...) {
			if err != nil {
				t.Fatalf("round %d, event %d: %v", round, i, err)
			}
		}
	}
	got := f.effects(t)
	for _, m := range msgs {
		if n := got[strings.ToLower(m.ID)]; n != 1 {
			t.Errorf("event %s took effect %d times, want once", m.ID, n)
		}
	}
	if p, d := f.m.n[inbox.Processed].Load(), f.m.n[inbox.Duplicate].Load(); p != 10 || d != 10 {
		t.Errorf("processed %d, duplicates %d; want 10 and 10", p, d)
	}
}

// TestReadsWhatTheSinkWrites checks every field of the message the handler
// receives from a webhooksink request.
func TestReadsWhatTheSinkWrites(t *testing.T) {
	st := pgstore.New(t)
	secret := webhooksink.NewSecret()
	got := make(chan inbox.Message, 1)
	rcv, err := webhookconsumer.New(st.Inbox(t, "fields", nil), func(_ context.Context, _ pgx.Tx, msg inbox.Message) error {
		got <- msg
		return nil
	}, &webhookconsumer.Config{Secrets: []string{secret}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(rcv)
	defer srv.Close()
	s, err := webhooksink.New(&webhooksink.Config{URL: srv.URL + "/hooks/" + webhooksink.Placeholder, Secrets: []string{secret}, AllowPrivate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	m := event(42)
	m.Key = []byte("42")
	m.Headers = []sink.Header{{Key: "traceparent", Value: tp}}
	consumertest.PublishAll(t, s, []sink.Message{m})
	msg := <-got
	for _, c := range []struct{ name, got, want string }{
		{"EventID", msg.EventID, m.ID},
		{"AggregateType", msg.AggregateType, "order"},
		{"AggregateID", msg.AggregateID, "42"},
		{"Destination", msg.Destination, "outbox.event.order"},
		{"System", msg.System, "webhook"},
		{"Payload", string(msg.Payload), string(m.Value)},
		{"traceparent", msg.Headers["traceparent"], tp},
	} {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.name, c.got, c.want)
		}
	}
}

// TestResponseLostAfterCommit commits the effect and then drops the
// connection before the answer, as a receiver that crashes there would:
// the sender sees a transient failure and sends again, the receiver
// answers 2xx for the duplicate, and the effect happened once.
func TestResponseLostAfterCommit(t *testing.T) {
	f := newFixture(t)
	var dropped atomic.Bool
	f.wrap = func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r)
		if rec.Code == http.StatusNoContent && dropped.CompareAndSwap(false, true) {
			panic(http.ErrAbortHandler) // the answer never leaves
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	}
	m := event(1)
	errs := f.publish(t, m)
	if errs[0] == nil || sink.IsPermanent(errs[0]) {
		t.Fatalf("first publish = %v, want a transient error (the answer was lost)", errs[0])
	}
	if n := f.effects(t)[strings.ToLower(m.ID)]; n != 1 {
		t.Fatalf("after the lost answer the event took effect %d times, want once (committed)", n)
	}
	if errs := f.publish(t, m); errs[0] != nil {
		t.Fatalf("the retry = %v, want 2xx", errs[0])
	}
	if n := f.effects(t)[strings.ToLower(m.ID)]; n != 1 {
		t.Errorf("after the retry the event took effect %d times, want once", n)
	}
	if d := f.m.n[inbox.Duplicate].Load(); d != 1 {
		t.Errorf("%d duplicates suppressed, want 1", d)
	}
}

// TestFailureAnswers5xxThenTheRetryCommits makes the handler fail once: the
// answer is a 5xx (transient for the sender), nothing is recorded, and the
// retry takes effect.
func TestFailureAnswers5xxThenTheRetryCommits(t *testing.T) {
	f := newFixture(t)
	f.fail.Store(1)
	m := event(1)
	errs := f.publish(t, m)
	var se *webhooksink.StatusError
	if !errors.As(errs[0], &se) || se.StatusCode != http.StatusInternalServerError || sink.IsPermanent(errs[0]) {
		t.Fatalf("publish with a failing handler = %v, want a transient 500", errs[0])
	}
	if n := f.effects(t)[strings.ToLower(m.ID)]; n != 0 {
		t.Fatalf("the failed attempt left %d effects, want none", n)
	}
	if errs := f.publish(t, m); errs[0] != nil {
		t.Fatalf("the retry = %v, want 2xx", errs[0])
	}
	if n := f.effects(t)[strings.ToLower(m.ID)]; n != 1 {
		t.Errorf("the event took effect %d times, want once", n)
	}
}

// TestPoisonIsDeadLetteredAndRefused posts a payload the handler refuses
// as permanent: it is recorded in the inbox's dead letters and answered
// 422, which webhooksink counts as permanent.
func TestPoisonIsDeadLetteredAndRefused(t *testing.T) {
	f := newFixture(t)
	m := event(1)
	m.Value = []byte("not json")
	errs := f.publish(t, m)
	var se *webhooksink.StatusError
	if !errors.As(errs[0], &se) || se.StatusCode != http.StatusUnprocessableEntity || !sink.IsPermanent(errs[0]) {
		t.Fatalf("publish of a poison event = %v, want a permanent 422", errs[0])
	}
	dls, err := f.ib.DeadLetters(context.Background(), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 || !strings.EqualFold(dls[0].EventID, m.ID) || string(dls[0].Payload) != "not json" || !strings.Contains(dls[0].Error, "payload does not decode") {
		t.Fatalf("dead letters %+v, want the poison event with its payload and cause", dls)
	}
}

// sign returns the Standard Webhooks headers of body signed with secret at
// time ts.
func sign(t *testing.T, secret, id string, ts time.Time, body []byte) http.Header {
	t.Helper()
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		t.Fatal(err)
	}
	sec := strconv.FormatInt(ts.Unix(), 10)
	h := hmac.New(sha256.New, key)
	fmt.Fprintf(h, "%s.%s.%s", id, sec, body)
	hdr := http.Header{}
	hdr.Set(webhooksink.HeaderID, id)
	hdr.Set(webhooksink.HeaderTimestamp, sec)
	hdr.Set(webhooksink.HeaderSignature, "v1,"+base64.StdEncoding.EncodeToString(h.Sum(nil)))
	return hdr
}

// TestRefusals sends requests that must be refused before anything is
// handled, and checks the status and that the answer says why.
func TestRefusals(t *testing.T) {
	f := newFixture(t)
	body := []byte(`{"n":1}`)
	id := uuid.Must(uuid.NewV7()).String()
	for _, c := range []struct {
		name   string
		method string
		hdr    http.Header
		body   []byte
		code   int
		says   string
	}{
		{"replay outside the window", http.MethodPost, sign(t, f.secret, id, time.Now().Add(-10*time.Minute), body), body, http.StatusBadRequest, "replay"},
		{"timestamp in the future", http.MethodPost, sign(t, f.secret, id, time.Now().Add(10*time.Minute), body), body, http.StatusBadRequest, "replay"},
		{"wrong secret", http.MethodPost, sign(t, webhooksink.NewSecret(), id, time.Now(), body), body, http.StatusUnauthorized, "signature"},
		{"body changed", http.MethodPost, sign(t, f.secret, id, time.Now(), body), []byte(`{"n":2}`), http.StatusUnauthorized, "signature"},
		{"no headers", http.MethodPost, http.Header{}, body, http.StatusBadRequest, "missing"},
		{"GET", http.MethodGet, sign(t, f.secret, id, time.Now(), body), nil, http.StatusMethodNotAllowed, "POST"},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequest(c.method, f.srv.URL+"/hooks/outbox.event.order", strings.NewReader(string(c.body)))
			if err != nil {
				t.Fatal(err)
			}
			req.Header = c.hdr
			resp, err := f.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != c.code || !strings.Contains(string(b), c.says) {
				t.Errorf("answer %d %q, want %d mentioning %q", resp.StatusCode, b, c.code, c.says)
			}
		})
	}
	if n := f.calls.Load(); n != 0 {
		t.Errorf("the handler ran %d times for refused requests, want never", n)
	}
	if n := len(f.effects(t)); n != 0 {
		t.Errorf("%d effects from refused requests, want none", n)
	}
}

// TestGracefulShutdownFinishesTheRequestInHand shuts the server down while
// a handler runs: Shutdown waits for it, the request is answered 2xx and
// its effect committed.
func TestGracefulShutdownFinishesTheRequestInHand(t *testing.T) {
	st := pgstore.New(t)
	secret := webhooksink.NewSecret()
	entered, release := make(chan struct{}), make(chan struct{})
	rcv, err := webhookconsumer.New(st.Inbox(t, "stop", nil), func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		close(entered)
		<-release
		return st.Effect(ctx, tx, "stop", consumertest.Effect{EventID: strings.ToLower(msg.EventID), AggregateID: msg.AggregateID})
	}, &webhookconsumer.Config{Secrets: []string{secret}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: rcv, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	s, err := webhooksink.New(&webhooksink.Config{URL: "http://" + ln.Addr().String() + "/${destination}", Secrets: []string{secret}, AllowPrivate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m := event(1)
	published := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		published <- s.Publish(ctx, []sink.Message{m})[0]
	}()
	<-entered
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		shut <- srv.Shutdown(ctx)
	}()
	select {
	case err := <-shut:
		close(release)
		t.Fatalf("Shutdown returned (%v) while a request was in hand", err)
	default:
	}
	close(release)
	if err := <-published; err != nil {
		t.Fatalf("the request in hand at shutdown = %v, want 2xx", err)
	}
	if err := <-shut; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Fatalf("serve: %v", err)
	}
	if n := len(st.Effects(t, "stop")); n != 1 {
		t.Errorf("%d effects, want 1", n)
	}
}

// TestConfigErrors checks that New refuses a missing or invalid secret.
func TestConfigErrors(t *testing.T) {
	ib := pgstore.New(t).Inbox(t, "config", nil)
	h := func(context.Context, pgx.Tx, inbox.Message) error { return nil }
	for _, c := range []struct {
		cfg  *webhookconsumer.Config
		want string
	}{
		{nil, "no Config.Secrets"},
		{&webhookconsumer.Config{}, "no Config.Secrets"},
		{&webhookconsumer.Config{Secrets: []string{"whsec_short"}}, "Config.Secrets"},
		{&webhookconsumer.Config{Secrets: []string{webhooksink.NewSecret()}, Tolerance: -time.Second}, "Tolerance"},
	} {
		if _, err := webhookconsumer.New(ib, h, c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) = %v, want an error containing %q", c.cfg, err, c.want)
		}
	}
}
