package natssink

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/sink"
)

// A stored header the stream cannot satisfy is refused the same way on
// every attempt: the refusal is permanent (by its JetStream error code),
// so the relay dead-letters the event at once instead of spending every
// attempt on it.
func TestPublishUnsatisfiableHeaderIsPermanent(t *testing.T) {
	e := newEnv(t)
	s := e.newSink(t, nil)
	with := func(name, header, value string) sink.Message {
		m := msg(name+"-"+e.prefix, e.prefix+".a", []byte(`{}`))
		m.Headers = append(m.Headers, sink.Header{Key: header, Value: value})
		return m
	}
	msgs := []sink.Message{
		with("seq", jetstream.ExpectedLastSeqHeader, "999"),
		with("msgid", jetstream.ExpectedLastMsgIDHeader, "no-such-id"),
		with("stream", jetstream.ExpectedStreamHeader, "NOT_"+e.stream),
		msg("ok-"+e.prefix, e.prefix+".b", []byte(`{}`)),
	}
	codes := []jetstream.ErrorCode{10071, 10070, 10060}
	errs := s.Publish(testenv.Context(t, 10*time.Second), msgs)
	for i, code := range codes {
		var apiErr *jetstream.APIError
		if !sink.IsPermanent(errs[i]) || !errors.As(errs[i], &apiErr) || apiErr.ErrorCode != code {
			t.Errorf("%s: got %v, want a permanent error wrapping JetStream error %d", msgs[i].ID, errs[i], code)
		}
	}
	if errs[3] != nil {
		t.Fatal(errs[3])
	}
	if n := e.streamMsgs(t); n != 1 {
		t.Fatalf("stream holds %d messages, want 1", n)
	}
}

// A key or header value with a line break cannot be a NATS header
// unchanged (the client would send spaces instead): it is refused for good
// rather than published altered.
func TestPublishLineBreakInKeyOrHeaderIsPermanent(t *testing.T) {
	e := newEnv(t)
	s := e.newSink(t, nil)
	key := msg("key-"+e.prefix, e.prefix+".a", []byte(`{}`))
	key.Key = []byte("4\r\n2")
	hdr := msg("hdr-"+e.prefix, e.prefix+".a", []byte(`{}`))
	hdr.Headers = append(hdr.Headers, sink.Header{Key: "note", Value: "a\nb"})
	ok := msg("ok-"+e.prefix, e.prefix+".b", []byte(`{}`))
	ok.Key = []byte("4 2")
	errs := s.Publish(testenv.Context(t, 10*time.Second), []sink.Message{key, hdr, ok})
	for i, want := range []string{"the key contains a line break", `header "note" contains a line break`} {
		if !sink.IsPermanent(errs[i]) || !strings.Contains(errs[i].Error(), want) {
			t.Errorf("message %d: got %v, want a permanent error saying %q", i, errs[i], want)
		}
	}
	if errs[2] != nil {
		t.Fatal(errs[2])
	}
	if n := e.streamMsgs(t); n != 1 {
		t.Fatalf("stream holds %d messages, want 1 (nothing altered was published)", n)
	}
}
