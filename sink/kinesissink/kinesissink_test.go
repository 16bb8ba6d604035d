package kinesissink

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"

	"github.com/outboxkit/outbox/sink"
)

// throttle sits between the SDK and kinesalite, which cannot be made to
// throttle on demand: for the records fail picks, it answers
// ProvisionedThroughputExceededException itself and forwards the rest of
// the PutRecords request to kinesalite, merging the two answers in
// request order as Kinesis does.
type throttle struct {
	base http.RoundTripper
	mu   sync.Mutex
	fail func(id string, attempt int) bool
	sent map[string]int // attempts per message id
}

type putRecordsBody struct {
	StreamName string
	Records    []struct {
		Data         []byte
		PartitionKey string
	}
}

func (th *throttle) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Header.Get("X-Amz-Target") != "Kinesis_20131202.PutRecords" {
		return th.base.RoundTrip(req)
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	var in map[string]any
	var typed putRecordsBody
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(body, &typed); err != nil {
		return nil, err
	}
	records := in["Records"].([]any)
	failed := make([]bool, len(records))
	var kept []any
	th.mu.Lock()
	for i, r := range typed.Records {
		var env struct{ ID string }
		json.Unmarshal(r.Data, &env)
		th.sent[env.ID]++
		if failed[i] = th.fail(env.ID, th.sent[env.ID]); !failed[i] {
			kept = append(kept, records[i])
		}
	}
	th.mu.Unlock()
	var fwd []any
	if len(kept) > 0 {
		in["Records"] = kept
		b, _ := json.Marshal(in)
		r2 := req.Clone(req.Context())
		r2.Body, r2.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
		// kinesalite requires a signature but does not check it against
		// the body, so the SDK's stays.
		resp, err := th.base.RoundTrip(r2)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != 200 {
			return resp, nil
		}
		defer resp.Body.Close()
		var out struct{ Records []any }
		err = json.NewDecoder(resp.Body).Decode(&out)
		io.Copy(io.Discard, resp.Body) // so the connection goes back idle
		if err != nil {
			return nil, err
		}
		fwd = out.Records
	}
	var merged []any
	nFailed := 0
	for i := range records {
		if failed[i] {
			nFailed++
			merged = append(merged, map[string]any{"ErrorCode": "ProvisionedThroughputExceededException", "ErrorMessage": "Rate exceeded for shard (injected)"})
			continue
		}
		merged = append(merged, fwd[0])
		fwd = fwd[1:]
	}
	b, _ := json.Marshal(map[string]any{"FailedRecordCount": nFailed, "Records": merged})
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/x-amz-json-1.1"}},
		Body: io.NopCloser(bytes.NewReader(b)), ContentLength: int64(len(b)), Request: req}, nil
}

func newThrottled(t *testing.T, e *env, fail func(id string, attempt int) bool) (*Sink, *throttle) {
	t.Helper()
	th := &throttle{base: &http.Transport{}, fail: fail, sent: map[string]int{}}
	t.Cleanup(th.base.(*http.Transport).CloseIdleConnections)
	c := kinesis.New(kinesis.Options{
		Region: "us-east-1", BaseEndpoint: aws.String("http://" + kinesaliteAddr),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
		HTTPClient:  &http.Client{Transport: th},
	})
	s, err := New(c, &Config{Logger: quiet, RetryDelay: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, th
}

func msgs(stream string, n, keys int) []sink.Message {
	var out []sink.Message
	for i := range n {
		out = append(out, sink.Message{ID: fmt.Sprint("m", i), Destination: stream, Key: fmt.Appendf(nil, "agg-%d", i%keys), Value: []byte("{}")})
	}
	return out
}

// checkOrder fails unless the stream holds want exactly once each, every
// key's messages in slice order.
func checkOrder(t *testing.T, e *env, stream string, want []sink.Message) {
	t.Helper()
	got := e.read(t, []string{stream}, len(want))
	pos := map[string]int{}
	for i, m := range want {
		pos[m.ID] = i
	}
	last := map[string]int{}
	seen := map[string]bool{}
	for _, r := range got {
		p, ok := pos[r.ID]
		if !ok || seen[r.ID] {
			t.Fatalf("unexpected or repeated record %s", r.ID)
		}
		seen[r.ID] = true
		if l, ok := last[string(r.Key)]; ok && p < l {
			t.Fatalf("key %s: %s stored after a later message", r.Key, r.ID)
		}
		last[string(r.Key)] = p
	}
	if len(seen) != len(want) {
		t.Fatalf("stored %d of %d messages", len(seen), len(want))
	}
}

// TestPartialFailuresAreRetriedPerRecordInOrder: records throttled on their
// own are put again within the call, and a key's later records wait for
// them, so every key stays in order.
func TestPartialFailuresAreRetriedPerRecordInOrder(t *testing.T) {
	e := newEnv(t)
	st := e.stream(t, "partial")
	// Every third message is throttled on its first two attempts.
	s, th := newThrottled(t, e, func(id string, attempt int) bool {
		var n int
		fmt.Sscanf(id, "m%d", &n)
		return n%3 == 0 && attempt <= 2
	})
	batch := msgs(st, 60, 4)
	for i, err := range s.Publish(ctx10s(t), batch) {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	if th.sent["m0"] != 3 || th.sent["m1"] != 1 {
		t.Fatalf("attempts: m0 %d, m1 %d; want 3 and 1", th.sent["m0"], th.sent["m1"])
	}
	checkOrder(t, e, st, batch)
}

// TestThrottledPastRetriesIsTransientAndHoldsItsKey: a record still
// throttled after Config.MaxRetries fails transiently, the later records of
// its key are not sent, other keys are.
func TestThrottledPastRetriesIsTransientAndHoldsItsKey(t *testing.T) {
	e := newEnv(t)
	st := e.stream(t, "throttled")
	s, th := newThrottled(t, e, func(id string, _ int) bool { return id == "m0" })
	batch := msgs(st, 8, 2) // m0, m2, m4, m6 share agg-0
	errs := s.Publish(ctx10s(t), batch)
	if err := errs[0]; err == nil || sink.IsPermanent(err) || !strings.Contains(err.Error(), "ProvisionedThroughputExceededException") {
		t.Fatalf("m0: %v, want a transient throughput error", err)
	}
	for i, err := range errs[1:] {
		i++
		if i%2 == 0 {
			if err == nil || sink.IsPermanent(err) || !strings.Contains(err.Error(), "not sent") {
				t.Errorf("m%d behind m0: %v, want transient not sent", i, err)
			}
			if th.sent[batch[i].ID] != 0 {
				t.Errorf("m%d was sent %d times though m0 failed", i, th.sent[batch[i].ID])
			}
		} else if err != nil {
			t.Errorf("m%d of another key: %v", i, err)
		}
	}
	if th.sent["m0"] != DefaultMaxRetries+1 {
		t.Errorf("m0 put %d times, want %d", th.sent["m0"], DefaultMaxRetries+1)
	}
	checkOrder(t, e, st, []sink.Message{batch[1], batch[3], batch[5], batch[7]})
}

func TestDial(t *testing.T) {
	e := newEnv(t)
	st := e.stream(t, "dial")
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	t.Setenv("AWS_ENDPOINT_URL_KINESIS", "http://"+kinesaliteAddr)
	s, err := Dial(ctx10s(t), "kinesis://"+st+"?region=us-east-1", &Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Publish(ctx10s(t), []sink.Message{{ID: "d1", Destination: st, Key: []byte("k")}})[0]; err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := e.read(t, []string{st}, 1); len(got) != 1 || got[0].ID != "d1" {
		t.Fatalf("stream holds %v", got)
	}
	if err := s.Publish(ctx10s(t), []sink.Message{{ID: "d2", Key: []byte("k")}})[0]; err != ErrClosed {
		t.Fatalf("after Close: %v", err)
	}
	for raw, want := range map[string]string{
		"kinesis://?region=us-east-1":           "names no stream",
		"kinesis://s?region=us-east-1&x=1":      "unknown parameter",
		"kinesis://u:secret@s?region=us-east-1": "credentials come from the environment",
		"kinesis://s/path":                      "want kinesis://STREAM",
	} {
		_, err := Dial(ctx10s(t), raw, nil)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "secret") {
			t.Errorf("Dial(%q): %v, want an error with %q", raw, err, want)
		}
	}
}
