package stdoutsink

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"slices"
	"sync"
	"testing"

	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/sinktest"
)

// lockedBuffer is the "broker" of one conformance test: the lines written.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.buf.Bytes())
}

// TestConformance runs the sink conformance suite on a Sink writing to a
// buffer; Read parses the JSON lines back. The line's "id" field is the
// sink's way of carrying the event id (it adds no "id" header), so Read
// reports it as the header "id" when the line's headers have none.
func TestConformance(t *testing.T) {
	out := sinktest.PerTest(func(*testing.T) *lockedBuffer { return &lockedBuffer{} })
	sinktest.Run(t, sinktest.Harness{
		New:  func(t *testing.T) sink.Sink { return New(out(t)) },
		Dest: func(t *testing.T, name string) string { return name },
		Read: func(t *testing.T, dests []string, want int) []sinktest.Received {
			return readLines(t, out(t).bytes(), dests)
		},
	})
}

func readLines(t *testing.T, data []byte, dests []string) []sinktest.Received {
	t.Helper()
	var got []sinktest.Received
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var l struct {
			ID            string          `json:"id"`
			Destination   string          `json:"destination"`
			Key           *string         `json:"key"`
			KeyBase64     string          `json:"key_base64"`
			Headers       []header        `json:"headers"`
			Payload       json.RawMessage `json:"payload"`
			PayloadBase64 *string         `json:"payload_base64"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("line %q is not JSON: %v", sc.Bytes(), err)
		}
		if !slices.Contains(dests, l.Destination) {
			continue
		}
		r := sinktest.Received{ID: l.ID, Destination: l.Destination, Headers: map[string][]string{}}
		switch {
		case l.Key != nil:
			r.Key = []byte(*l.Key)
		default:
			k, err := base64.StdEncoding.DecodeString(l.KeyBase64)
			if err != nil {
				t.Fatalf("line %q: key_base64: %v", sc.Bytes(), err)
			}
			r.Key = k
		}
		for _, h := range l.Headers {
			r.Headers[h.Key] = append(r.Headers[h.Key], h.Value)
		}
		if _, ok := r.Headers["id"]; !ok {
			r.Headers["id"] = []string{l.ID}
		}
		switch {
		case l.PayloadBase64 != nil:
			v, err := base64.StdEncoding.DecodeString(*l.PayloadBase64)
			if err != nil {
				t.Fatalf("line %q: payload_base64: %v", sc.Bytes(), err)
			}
			r.Value = v
		case len(l.Payload) > 0 && string(l.Payload) != "null":
			r.Value = []byte(l.Payload)
		}
		got = append(got, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}
