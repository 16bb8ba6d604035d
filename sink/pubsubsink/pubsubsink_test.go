package pubsubsink

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/outboxkit/outbox/sink"
)

func ctx10s(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func msg(id, dest, key string) sink.Message {
	return sink.Message{ID: id, Destination: dest, Key: []byte(key), Value: []byte(`{"id":"` + id + `"}`)}
}

type pubsubMsg struct{ id, topic, key string }

func (e *env) stored(t *testing.T) []pubsubMsg {
	t.Helper()
	var out []pubsubMsg
	for _, m := range e.srv.Messages() {
		out = append(out, pubsubMsg{m.Attributes[IDAttr], strings.TrimPrefix(m.Topic, "projects/"+project+"/topics/"), m.OrderingKey})
	}
	return out
}

// TestFailedOrderedPublishIsResumedByTheRetry: a failed publish pauses its
// ordering key in the client; the relay's retry of the same messages
// resumes it and they arrive in order, none of the key's messages having
// overtaken the failed one.
func TestFailedOrderedPublishIsResumedByTheRetry(t *testing.T) {
	e := newEnv(t)
	s := e.newSink(t, nil)
	batch := []sink.Message{msg("k1", "outbox.a", "k"), msg("k2", "outbox.a", "k"), msg("j1", "outbox.a", "j")}
	e.fail.on.Store(true)
	errs := s.Publish(ctx10s(t), batch)
	for i, err := range errs {
		if err == nil || sink.IsPermanent(err) {
			t.Fatalf("message %d while publishes fail: %v, want a transient error", i, err)
		}
	}
	e.fail.on.Store(false)

	// The client has paused key k: without ResumePublish nothing of k goes
	// out, so the sink's retry below depends on resuming it.
	p, err := s.publisher(ctx10s(t), "outbox.a")
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Publish(ctx10s(t), &pubsub.Message{Data: []byte("x"), OrderingKey: "k"}).Get(ctx10s(t))
	var paused pubsub.ErrPublishingPaused
	if !errors.As(err, &paused) {
		t.Fatalf("the client did not pause key k after the failure: %v", err)
	}
	if got := e.stored(t); len(got) != 0 {
		t.Fatalf("stored while publishes failed: %v", got)
	}

	// The relay's retry: the same messages, plus a later one of key k.
	retry := append(batch, msg("k3", "outbox.a", "k"))
	for i, err := range s.Publish(ctx10s(t), retry) {
		if err != nil {
			t.Fatalf("retry, message %d: %v", i, err)
		}
	}
	var k []string
	for _, m := range e.stored(t) {
		if m.key == "k" {
			k = append(k, m.id)
		}
	}
	if strings.Join(k, ",") != "k1,k2,k3" {
		t.Fatalf("key k stored as %v, want k1,k2,k3", k)
	}
}

// TestPausedKeyInLaterBatch: a key paused by a failure in one Publish is
// resumed by the next Publish that carries the key, even for other
// messages than the failed one (the relay dead-lettered it).
func TestPausedKeyInLaterBatch(t *testing.T) {
	e := newEnv(t)
	s := e.newSink(t, nil)
	e.fail.on.Store(true)
	if err := s.Publish(ctx10s(t), []sink.Message{msg("k1", "outbox.a", "k")})[0]; err == nil {
		t.Fatal("publish succeeded while failing")
	}
	e.fail.on.Store(false)
	if err := s.Publish(ctx10s(t), []sink.Message{msg("k2", "outbox.a", "k")})[0]; err != nil {
		t.Fatalf("next message of the paused key: %v", err)
	}
}

func TestFixedTopicCarriesTheDestination(t *testing.T) {
	e := newEnv(t)
	s := e.newSink(t, &Config{Topic: "all-events", CreateTopics: true})
	for i, err := range s.Publish(ctx10s(t), []sink.Message{msg("a", "outbox.order", "k"), msg("b", "outbox.payment", "k")}) {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	ms := e.srv.Messages()
	if len(ms) != 2 {
		t.Fatalf("stored %d messages", len(ms))
	}
	for i, want := range []string{"outbox.order", "outbox.payment"} {
		if ms[i].Topic != "projects/"+project+"/topics/all-events" || ms[i].Attributes[DestinationAttr] != want {
			t.Errorf("message %d on %s with destination %q, want topic all-events and destination %q", i, ms[i].Topic, ms[i].Attributes[DestinationAttr], want)
		}
	}
}

func TestMissingTopicWithoutCreateIsTransient(t *testing.T) {
	e := newEnv(t)
	s := e.newSink(t, &Config{Timeout: 3 * time.Second})
	err := s.Publish(ctx10s(t), []sink.Message{msg("a", "outbox.missing", "k")})[0]
	if err == nil || sink.IsPermanent(err) || !strings.Contains(err.Error(), `create topic "outbox.missing"`) {
		t.Fatalf("got %v, want a transient error saying to create the topic", err)
	}
	if _, err := e.client.TopicAdminClient.CreateTopic(ctx10s(t), &pubsubpb.Topic{Name: "projects/" + project + "/topics/outbox.missing"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Publish(ctx10s(t), []sink.Message{msg("a", "outbox.missing", "k")})[0]; err != nil {
		t.Fatalf("once the topic exists: %v", err)
	}
}

func TestRefusedMessagesArePermanentAndSpareTheirKey(t *testing.T) {
	e := newEnv(t)
	s := e.newSink(t, nil)
	withHeader := func(id, k, v string) sink.Message {
		m := msg(id, "outbox.a", "k")
		m.Headers = []sink.Header{{Key: k, Value: v}}
		return m
	}
	binKey := msg("bin-key", "outbox.a", "")
	binKey.Key = []byte{0xff, 0xfe}
	bad := []sink.Message{
		msg("bad-topic", "a b", "k"),
		msg("goog-topic", "google.x", "k"),
		binKey,
		msg("long-key", "outbox.a", strings.Repeat("k", 1025)),
		withHeader("goog-header", "googfoo", "v"),
		withHeader("long-value", "x", strings.Repeat("v", 1025)),
		withHeader("bad-utf8", "x", "\xff"),
		withHeader("reserved", RepeatedAttr, "[]"),
	}
	var batch []sink.Message
	for _, m := range bad {
		batch = append(batch, m, msg("ok-after-"+m.ID, "outbox.a", "k"))
	}
	errs := s.Publish(ctx10s(t), batch)
	for i, err := range errs {
		if i%2 == 1 {
			if err != nil {
				t.Errorf("message %s: %v", batch[i].ID, err)
			}
		} else if !sink.IsPermanent(err) {
			t.Errorf("message %s: got %v, want a permanent error", batch[i].ID, err)
		}
	}
	if got := len(e.stored(t)); got != len(bad) {
		t.Fatalf("stored %d messages, want %d", got, len(bad))
	}
}

func TestRepeatedHeaders(t *testing.T) {
	e := newEnv(t)
	s := e.newSink(t, nil)
	m := msg("r", "outbox.a", "k")
	m.Headers = []sink.Header{{Key: "id", Value: "r"}, {Key: "t", Value: "1"}, {Key: "u", Value: "x"}, {Key: "t", Value: "2"}}
	if err := s.Publish(ctx10s(t), []sink.Message{m})[0]; err != nil {
		t.Fatal(err)
	}
	a := e.srv.Messages()[0].Attributes
	if len(a) != 4 || a["id"] != "r" || a["t"] != `["1","2"]` || a["u"] != "x" || a[RepeatedAttr] != `["t"]` {
		t.Fatalf("attributes %v", a)
	}
}

func TestDialHonoursTheEmulatorHost(t *testing.T) {
	e := newEnv(t)
	t.Setenv("PUBSUB_EMULATOR_HOST", e.srv.Addr)
	s, err := Dial(ctx10s(t), "pubsub://"+project+"/dialled", &Config{CreateTopics: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Publish(ctx10s(t), []sink.Message{msg("d", "outbox.x", "k")})[0]; err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	got := e.stored(t)
	if len(got) != 1 || got[0].topic != "dialled" {
		t.Fatalf("stored %v", got)
	}
	if err := s.Publish(ctx10s(t), []sink.Message{msg("late", "outbox.x", "k")})[0]; !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

func TestParseURL(t *testing.T) {
	for raw, want := range map[string]string{
		"pubsub://p":            "p/",
		"pubsub://p/outbox-all": "p/outbox-all",
	} {
		p, tp, err := ParseURL(raw)
		if err != nil || p+"/"+tp != want {
			t.Errorf("ParseURL(%q) = %q, %q, %v", raw, p, tp, err)
		}
	}
	for _, raw := range []string{"pubsub://", "pubsub:p", "pubsub://p/a/b", "pubsub://p/x", "pubsub://p?x=1", "pubsub://u:pw@p", "kafka://p"} {
		if _, _, err := ParseURL(raw); err == nil || strings.Contains(err.Error(), "pw") {
			t.Errorf("ParseURL(%q): %v, want an error (without the password)", raw, err)
		}
	}
	if _, err := New(nil, project, nil); err == nil {
		t.Error("New(nil) succeeded")
	}
	if _, err := normalize(&Config{Timeout: -1}); err == nil || !strings.Contains(err.Error(), "Config.Timeout") {
		t.Errorf("negative Timeout: %v", err)
	}
}
