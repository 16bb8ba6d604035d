package sqssink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/outboxkit/outbox/internal/awsbatch"
	"github.com/outboxkit/outbox/internal/goawstest"
	"github.com/outboxkit/outbox/sink"
)

// TestFIFOFieldsOnGoaws publishes to a FIFO queue on goaws and checks the
// MessageGroupId and MessageDeduplicationId of each entry the sink sent
// (goaws does not hand them back on receive), and that a standard queue
// gets neither.
func TestFIFOFieldsOnGoaws(t *testing.T) {
	for _, fifo := range []bool{true, false} {
		t.Run(fmt.Sprint("fifo=", fifo), func(t *testing.T) {
			e := newEnv(t, fifo)
			q := e.queue(t, "fields")
			s, err := New(goawstest.SQS(t, server.URL()), &Config{Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			long := strings.Repeat("k", 129)
			msgs := []sink.Message{
				{ID: "e1", Destination: q, Key: []byte("order-1"), Value: []byte(`1`)},
				{ID: "e2", Destination: q, Key: []byte("order 2"), Value: []byte(`2`)},
				{ID: "e3", Destination: q, Value: []byte(`3`)},
				{ID: "e4", Destination: q, Key: []byte(long), Value: []byte(`4`)},
			}
			for i, err := range s.Publish(ctx30s(t), msgs) {
				if err != nil {
					t.Fatalf("message %d: %v", i, err)
				}
			}
			sent := server.Sent(e.queueURL(q))
			if len(sent) != len(msgs) {
				t.Fatalf("%d entries sent to %s, want %d", len(sent), q, len(msgs))
			}
			want := map[string]string{"e1": "order-1", "e2": awsbatch.FIFOID("order 2"), "e3": "e3", "e4": awsbatch.FIFOID(long)}
			for _, se := range sent {
				id := goawstest.Decode(t, q, se.Body).ID
				wantGroup, wantDedup := want[id], id
				if !fifo {
					wantGroup, wantDedup = "", ""
				}
				if se.GroupID != wantGroup || se.DedupID != wantDedup {
					t.Errorf("message %s: MessageGroupId %q, MessageDeduplicationId %q; want %q, %q", id, se.GroupID, se.DedupID, wantGroup, wantDedup)
				}
			}
			if fifo && (!strings.HasPrefix(want["e2"], "sha256:") || len(want["e4"]) > 128) {
				t.Errorf("invalid group ids not hashed: %q, %q", want["e2"], want["e4"])
			}
		})
	}
}

// fakeSQS answers SendMessageBatch as rule says for each entry (by event
// id and attempt), and records every request's entries.
type fakeSQS struct {
	mu       sync.Mutex
	attempts map[string]int
	requests [][]sentEntry
	// rule returns "" to store the entry, "request" to refuse the whole
	// request as InvalidParameterValue, or "code:sender" / "code:service"
	// to fail the entry.
	rule func(id string, attempt int) string
}

type sentEntry struct{ ID, Group, Dedup string }

func (f *fakeSQS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("X-Amz-Target") != "AmazonSQS.SendMessageBatch" {
		http.Error(w, "unexpected "+r.Header.Get("X-Amz-Target"), http.StatusBadRequest)
		return
	}
	var in struct {
		Entries []struct {
			Id, MessageBody, MessageGroupId, MessageDeduplicationId string
			MessageAttributes                                       map[string]struct{ StringValue string }
		}
	}
	json.NewDecoder(r.Body).Decode(&in)
	type failed struct {
		Id, Code, Message string
		SenderFault       bool
	}
	var ok []map[string]string
	var fails []failed
	f.mu.Lock()
	defer f.mu.Unlock()
	var req []sentEntry
	for _, e := range in.Entries {
		req = append(req, sentEntry{e.MessageAttributes["id"].StringValue, e.MessageGroupId, e.MessageDeduplicationId})
	}
	f.requests = append(f.requests, req)
	for _, e := range req {
		if f.rule(e.ID, f.attempts[e.ID]+1) == "request" {
			w.Header().Set("Content-Type", "application/x-amz-json-1.0")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"__type":"com.amazonaws.sqs#InvalidParameterValue","message":"refused"}`)
			return
		}
	}
	for i, e := range req {
		f.attempts[e.ID]++
		id := in.Entries[i].Id
		switch r := f.rule(e.ID, f.attempts[e.ID]); {
		case r == "":
			ok = append(ok, map[string]string{"Id": id, "MessageId": "m-" + e.ID, "MD5OfMessageBody": "x"})
		default:
			code, who, _ := strings.Cut(r, ":")
			fails = append(fails, failed{Id: id, Code: code, Message: "refused", SenderFault: who == "sender"})
		}
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	json.NewEncoder(w).Encode(map[string]any{"Successful": ok, "Failed": fails})
}

func fakeSink(t *testing.T, f *fakeSQS, queue string) *Sink {
	t.Helper()
	f.attempts = map[string]int{}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	c := sqs.New(sqs.Options{Region: "us-east-1", BaseEndpoint: aws.String(srv.URL), HTTPClient: srv.Client(),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""), DisableMessageChecksumValidation: true})
	s, err := New(c, &Config{Queue: queue, Logger: quiet, RetryDelay: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestPartialFailureFIFO: an entry failed by the service is retried and
// succeeds; an entry refused as the sender's fault fails permanently, and
// the later message of its group is never sent and fails transiently; no
// request carries two messages of one group.
func TestPartialFailureFIFO(t *testing.T) {
	f := &fakeSQS{rule: func(id string, attempt int) string {
		switch {
		case id == "bad":
			return "InvalidParameterValue:sender"
		case id == "flaky" && attempt < 3:
			return "InternalError:service"
		}
		return ""
	}}
	s := fakeSink(t, f, "https://sqs.us-east-1.amazonaws.com/123456789012/q.fifo")
	msgs := []sink.Message{
		{ID: "a1", Key: []byte("g1")}, {ID: "bad", Key: []byte("g1")}, {ID: "a3", Key: []byte("g1")},
		{ID: "b1", Key: []byte("g2")}, {ID: "b2", Key: []byte("g2")},
		{ID: "flaky", Key: []byte("g3")}, {ID: "c2", Key: []byte("g3")},
	}
	errs := s.Publish(context.Background(), msgs)
	for i, m := range msgs {
		switch m.ID {
		case "bad":
			if !sink.IsPermanent(errs[i]) {
				t.Errorf("%s: %v, want a permanent error", m.ID, errs[i])
			}
		case "a3":
			if errs[i] == nil || sink.IsPermanent(errs[i]) {
				t.Errorf("%s: %v, want a transient error", m.ID, errs[i])
			}
		default:
			if errs[i] != nil {
				t.Errorf("%s: %v, want nil", m.ID, errs[i])
			}
		}
	}
	if f.attempts["flaky"] != 3 || f.attempts["a3"] != 0 {
		t.Errorf("flaky sent %d times (want 3), a3 %d times (want 0)", f.attempts["flaky"], f.attempts["a3"])
	}
	for _, req := range f.requests {
		groups := map[string]bool{}
		for _, e := range req {
			if groups[e.Group] {
				t.Errorf("request %v carries two messages of group %s", req, e.Group)
			}
			groups[e.Group] = true
			if e.Dedup != e.ID {
				t.Errorf("message %s: MessageDeduplicationId %q", e.ID, e.Dedup)
			}
		}
	}
}

// TestRetriesExhausted: an entry that keeps failing on the service's side
// fails transiently after MaxRetries retries.
func TestRetriesExhausted(t *testing.T) {
	f := &fakeSQS{rule: func(id string, attempt int) string { return "ThrottlingException:sender" }}
	s := fakeSink(t, f, "https://sqs.us-east-1.amazonaws.com/123456789012/q")
	errs := s.Publish(context.Background(), []sink.Message{{ID: "t1"}})
	if errs[0] == nil || sink.IsPermanent(errs[0]) || f.attempts["t1"] != DefaultMaxRetries+1 {
		t.Errorf("result %v after %d attempts; want a transient error after %d", errs[0], f.attempts["t1"], DefaultMaxRetries+1)
	}
}

// TestRefusedRequestIsSplit: a request SQS refuses for its content is
// sent again message by message, and only the culprit fails, permanently.
func TestRefusedRequestIsSplit(t *testing.T) {
	f := &fakeSQS{rule: func(id string, attempt int) string {
		if id == "poison" {
			return "request"
		}
		return ""
	}}
	s := fakeSink(t, f, "https://sqs.us-east-1.amazonaws.com/123456789012/q")
	errs := s.Publish(context.Background(), []sink.Message{{ID: "x1"}, {ID: "poison"}, {ID: "x2"}})
	if errs[0] != nil || errs[2] != nil || !sink.IsPermanent(errs[1]) {
		t.Errorf("results %v; want nil, permanent, nil", errs)
	}
	if f.attempts["x1"] != 1 || f.attempts["x2"] != 1 {
		t.Errorf("x1 stored %d times, x2 %d times; want once each", f.attempts["x1"], f.attempts["x2"])
	}
}

// TestStandardBatchesOfTen: 25 messages to a standard queue go out in
// requests of 10, 10 and 5, keys notwithstanding.
func TestStandardBatchesOfTen(t *testing.T) {
	f := &fakeSQS{rule: func(string, int) string { return "" }}
	s := fakeSink(t, f, "https://sqs.us-east-1.amazonaws.com/123456789012/q")
	msgs := make([]sink.Message, 25)
	for i := range msgs {
		msgs[i] = sink.Message{ID: fmt.Sprint("m", i), Key: []byte("same")}
	}
	for i, err := range s.Publish(context.Background(), msgs) {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	var sizes []int
	for _, req := range f.requests {
		sizes = append(sizes, len(req))
		for _, e := range req {
			if e.Group != "" || e.Dedup != "" {
				t.Errorf("standard queue got MessageGroupId %q, MessageDeduplicationId %q", e.Group, e.Dedup)
			}
		}
	}
	if fmt.Sprint(sizes) != "[10 10 5]" {
		t.Errorf("request sizes %v, want [10 10 5]", sizes)
	}
}

// TestMissingQueueIsTransient: a queue name goaws does not know fails
// transiently, saying to create it.
func TestMissingQueueIsTransient(t *testing.T) {
	s, err := New(goawstest.SQS(t, server.URL()), &Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	errs := s.Publish(ctx30s(t), []sink.Message{{ID: "m1", Destination: "no-such-queue-" + t.Name()[:4]}})
	if errs[0] == nil || sink.IsPermanent(errs[0]) || !strings.Contains(errs[0].Error(), "does not exist") {
		t.Errorf("result %v; want a transient error saying the queue does not exist", errs[0])
	}
}

func TestParseURL(t *testing.T) {
	good := map[string]URL{
		"sqs://orders?region=eu-west-1":                          {Queue: "orders", Region: "eu-west-1"},
		"sqs://orders.fifo?region=eu-west-1&owner=123456789012":  {Queue: "orders.fifo", Region: "eu-west-1", Owner: "123456789012"},
		"sqs://?region=us-east-1&endpoint=http://127.0.0.1:4100": {Region: "us-east-1", Endpoint: "http://127.0.0.1:4100"},
		"sqs://": {},
	}
	for raw, want := range good {
		got, err := ParseURL(raw)
		if err != nil || got != want {
			t.Errorf("ParseURL(%q) = %+v, %v; want %+v", raw, got, err, want)
		}
	}
	for _, raw := range []string{
		"sqs://user:secret@orders", "sqs://orders/extra", "sqs://orders?regoin=x", "sqs://bad!name",
		"sqs://orders:99", "kinesis://orders", "sqs://orders?region=a&region=b",
	} {
		_, err := ParseURL(raw)
		if err == nil {
			t.Errorf("ParseURL(%q) accepted", raw)
			continue
		}
		if strings.Contains(err.Error(), "secret") || strings.Contains(err.Error(), "\n") {
			t.Errorf("ParseURL(%q): %q leaks the password or spans lines", raw, err)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	c := goawstest.SQS(t, server.URL())
	for _, cfg := range []*Config{{Queue: "bad name"}, {Queue: "https://"}, {MaxRetries: -1}, {RetryDelay: -1}} {
		if _, err := New(c, cfg); err == nil {
			t.Errorf("New accepted %+v", cfg)
		}
	}
	if _, err := New(nil, nil); err == nil {
		t.Error("New accepted a nil client")
	}
	s, err := New(c, &Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	errs := s.Publish(context.Background(), []sink.Message{{ID: "m", Destination: "not a queue"}})
	if !sink.IsPermanent(errs[0]) {
		t.Errorf("invalid destination: %v, want permanent", errs[0])
	}
	s.Close()
	if errs := s.Publish(context.Background(), []sink.Message{{ID: "m", Destination: "q"}}); !errors.Is(errs[0], ErrClosed) {
		t.Errorf("after Close: %v", errs[0])
	}
}

// FuzzParseURL: ParseURL never panics, and what it accepts names a valid
// queue (or none) and parses again to the same result.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{"sqs://orders?region=eu-west-1", "sqs://q.fifo?owner=1&endpoint=http://x", "sqs://", "sqs://a:b@c", "sqs://%zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := ParseURL(raw)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("ParseURL(%q): error spans lines: %q", raw, err)
			}
			return
		}
		if u.Queue != "" && checkQueue(u.Queue) != nil {
			t.Fatalf("ParseURL(%q) accepted queue %q", raw, u.Queue)
		}
		if again, err := ParseURL(raw); err != nil || again != u {
			t.Fatalf("ParseURL(%q) not stable: %+v, %v", raw, again, err)
		}
	})
}
