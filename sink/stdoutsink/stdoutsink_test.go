package stdoutsink

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/outboxkit/outbox/sink"
)

func TestPublishLines(t *testing.T) {
	msgs := []sink.Message{
		{
			ID: "1", Destination: "orders", Key: []byte("o-1"),
			Headers: []sink.Header{{Key: "id", Value: "1"}, {Key: "type", Value: "Created"}, {Key: "type", Value: "<again>"}},
			Value:   []byte("{\n  \"total\": 5,\n  \"items\": [1, 2]\n}"),
		},
		{ID: "2", Destination: "orders", Key: []byte("o-1"), Value: []byte("not json \x00\xff")},
		{ID: "3", Destination: "audit", Key: []byte{0xff, 0x00}, Value: []byte(`"a string"`)},
		{ID: "4", Destination: "audit"},
	}
	var buf bytes.Buffer
	s := New(&buf)
	for i, err := range s.Publish(context.Background(), msgs) {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	want := `{"id":"1","destination":"orders","key":"o-1","headers":[{"key":"id","value":"1"},{"key":"type","value":"Created"},{"key":"type","value":"<again>"}],"payload":{"total":5,"items":[1,2]}}
{"id":"2","destination":"orders","key":"o-1","headers":[],"payload_base64":"bm90IGpzb24gAP8="}
{"id":"3","destination":"audit","key_base64":"/wA=","headers":[],"payload":"a string"}
{"id":"4","destination":"audit","key":"","headers":[],"payload":null}
`
	if got := buf.String(); got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// failAfter accepts n writes, then fails every write.
type failAfter struct {
	n     int
	lines []string
}

var errDiskFull = errors.New("disk full")

func (w *failAfter) Write(p []byte) (int, error) {
	if len(w.lines) >= w.n {
		return 0, errDiskFull
	}
	w.lines = append(w.lines, string(p))
	return len(p), nil
}

func TestWriteErrorFailsRest(t *testing.T) {
	w := &failAfter{n: 1}
	msgs := []sink.Message{{ID: "a"}, {ID: "b"}, {ID: "c"}}
	errs := New(w).Publish(context.Background(), msgs)
	if errs[0] != nil {
		t.Fatalf("first message: %v", errs[0])
	}
	for i, err := range errs[1:] {
		if !errors.Is(err, errDiskFull) || sink.IsPermanent(err) {
			t.Fatalf("message %d: got %v, want transient %v", i+1, err, errDiskFull)
		}
	}
	if len(w.lines) != 1 || !strings.Contains(w.lines[0], `"id":"a"`) {
		t.Fatalf("written lines %q", w.lines)
	}
}

func TestCancelledContext(t *testing.T) {
	var buf bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	errs := New(&buf).Publish(ctx, []sink.Message{{ID: "a"}, {ID: "b"}})
	if len(errs) != 2 || !errors.Is(errs[0], context.Canceled) || !errors.Is(errs[1], context.Canceled) {
		t.Fatalf("got %v", errs)
	}
	if buf.Len() != 0 {
		t.Fatalf("wrote %q after cancel", buf.String())
	}
}

// TestConcurrentLinesDoNotInterleave runs Publish from many goroutines on a
// writer that is not safe for concurrent use.
func TestConcurrentLinesDoNotInterleave(t *testing.T) {
	var buf bytes.Buffer
	s := New(&buf)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			batch := make([]sink.Message, 50)
			for i := range batch {
				batch[i] = sink.Message{ID: "x", Destination: "d", Value: []byte(`{"a":1}`)}
			}
			for _, err := range s.Publish(context.Background(), batch) {
				if err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	const line = `{"id":"x","destination":"d","key":"","headers":[],"payload":{"a":1}}` + "\n"
	if buf.String() != strings.Repeat(line, 400) {
		t.Fatal("lines interleaved or lost")
	}
}
