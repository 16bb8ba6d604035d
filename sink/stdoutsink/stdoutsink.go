package stdoutsink

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"unicode/utf8"

	"github.com/outboxkit/outbox/sink"
)

// Sink writes messages as JSON lines. It implements sink.Sink and is safe
// for concurrent use: lines from concurrent Publish calls never interleave.
type Sink struct {
	mu     sync.Mutex
	w      io.Writer
	closed bool // guarded by mu
}

// ErrClosed is the (transient) error Publish reports after Close.
var ErrClosed = errors.New("stdoutsink: sink is closed")

var _ sink.Sink = (*Sink)(nil)

// New returns a Sink writing to w, typically os.Stdout. Close does not close
// w.
func New(w io.Writer) *Sink {
	return &Sink{w: w}
}

type header struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

type line struct {
	ID            string          `json:"id"`
	Destination   string          `json:"destination"`
	Key           *string         `json:"key,omitempty"`
	KeyBase64     string          `json:"key_base64,omitempty"`
	Headers       []header        `json:"headers"`
	Payload       json.RawMessage `json:"payload,omitempty"`
	PayloadBase64 *string         `json:"payload_base64,omitempty"`
}

var null = json.RawMessage("null")

// Line returns the JSON line, with its trailing newline, that the sink
// writes for m.
func Line(m *sink.Message) ([]byte, error) {
	l := line{ID: m.ID, Destination: m.Destination, Headers: make([]header, len(m.Headers))}
	if utf8.Valid(m.Key) {
		k := string(m.Key)
		l.Key = &k
	} else {
		l.KeyBase64 = base64.StdEncoding.EncodeToString(m.Key)
	}
	for i, h := range m.Headers {
		l.Headers[i] = header(h)
	}
	switch {
	case len(m.Value) == 0:
		l.Payload = null
	case json.Valid(m.Value):
		l.Payload = m.Value
	default:
		b := base64.StdEncoding.EncodeToString(m.Value)
		l.PayloadBase64 = &b
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(&l); err != nil { // compacts Payload, adds "\n"
		return nil, err
	}
	return buf.Bytes(), nil
}

// Publish writes one line per message, in order. After a write error, that
// message and the rest fail with it; when ctx ends, the unwritten rest fail
// with ctx's error; after Close, every message fails with ErrClosed. All
// errors are transient.
func (s *Sink) Publish(ctx context.Context, msgs []sink.Message) []error {
	errs := make([]error, len(msgs))
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		fill(errs, ErrClosed)
		return errs
	}
	for i := range msgs {
		if err := ctx.Err(); err != nil {
			fill(errs[i:], fmt.Errorf("stdoutsink: %w", err))
			break
		}
		b, err := Line(&msgs[i])
		if err != nil { // cannot happen: every field is encodable
			errs[i] = fmt.Errorf("stdoutsink: encode message %q: %w", msgs[i].ID, err)
			continue
		}
		if _, err := s.w.Write(b); err != nil {
			fill(errs[i:], fmt.Errorf("stdoutsink: write message %q: %w", msgs[i].ID, err))
			break
		}
	}
	return errs
}

func fill(errs []error, err error) {
	for i := range errs {
		errs[i] = err
	}
}

// Close makes later Publish calls fail with ErrClosed. It does not close the
// writer, which belongs to the caller. It is idempotent and returns nil.
func (s *Sink) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	return nil
}

// System names the broker as OpenTelemetry's messaging.system attribute
// does: "stdout".
func (s *Sink) System() string { return "stdout" }
