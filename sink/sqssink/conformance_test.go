package sqssink

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"go.uber.org/goleak"

	"github.com/outboxkit/outbox/internal/faultproxy"
	"github.com/outboxkit/outbox/internal/goawstest"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/sinktest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// server is goaws, started in this process before any test runs (the
// suite checks that a subtest leaves no goroutine behind).
var server *goawstest.Server

func TestMain(m *testing.M) {
	s, err := goawstest.Start()
	if err != nil {
		panic(err)
	}
	server = s
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("net/http.(*Server).Serve"), goleak.IgnoreAnyFunction("net/http.(*conn).serve"))
}

// env is one test's queues on goaws, reached through a fault proxy.
type env struct {
	admin  *sqs.Client
	proxy  *faultproxy.Proxy
	prefix string
	inbox  *goawstest.Inbox
	fifo   bool

	mu   sync.Mutex
	urls map[string]string // queue name -> URL
}

func newEnv(t *testing.T, fifo bool) *env {
	t.Helper()
	p, err := faultproxy.Start(server.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	admin := goawstest.SQS(t, server.URL())
	return &env{admin: admin, proxy: p, prefix: testenv.Name("q"), inbox: goawstest.NewInbox(admin), fifo: fifo, urls: map[string]string{}}
}

func ctx30s(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// queue creates the queue for name once and returns its name.
func (e *env) queue(t *testing.T, name string) string {
	t.Helper()
	q := e.prefix + "-" + name
	if e.fifo {
		q += ".fifo"
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.urls[q]; ok {
		return q
	}
	in := &sqs.CreateQueueInput{QueueName: aws.String(q)}
	if e.fifo {
		in.Attributes = map[string]string{"FifoQueue": "true"}
	}
	out, err := e.admin.CreateQueue(ctx30s(t), in)
	if err != nil {
		t.Fatalf("create queue %s: %v", q, err)
	}
	e.urls[q] = aws.ToString(out.QueueUrl)
	t.Cleanup(func() {
		e.admin.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: out.QueueUrl})
	})
	return q
}

func (e *env) queueURL(q string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.urls[q]
}

func harness(fifo bool) sinktest.Harness {
	e := sinktest.PerTest(func(t *testing.T) *env { return newEnv(t, fifo) })
	return sinktest.Harness{
		New: func(t *testing.T) sink.Sink {
			s, err := New(goawstest.SQS(t, "http://"+e(t).proxy.Addr()), &Config{Logger: quiet, RetryDelay: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Dest: func(t *testing.T, name string) string { return e(t).queue(t, name) },
		Read: func(t *testing.T, dests []string, want int) []sinktest.Received {
			return e(t).inbox.Read(t, dests, want, e(t).queueURL)
		},
		// goaws de-duplicates a FIFO queue's messages by
		// MessageDeduplicationId, as SQS does for five minutes.
		DedupeKey: fifo,
		KeyHeader: "", // the envelope's "key"
		TooLarge: func(t *testing.T, dest string) *sink.Message {
			return &sink.Message{Destination: dest, Key: []byte("k"), Value: []byte(`"` + strings.Repeat("x", MaxMessageBytes) + `"`)}
		},
		Outage: func(t *testing.T) func() {
			p := e(t).proxy
			p.Cut()
			return p.Restore
		},
	}
}

// TestConformance runs the sink conformance suite against goaws on
// standard queues, with the sink behind a fault proxy.
func TestConformance(t *testing.T) {
	sinktest.Run(t, harness(false))
}

// TestConformanceFIFO runs it on FIFO queues: per-key order through
// MessageGroupId, and de-duplication by MessageDeduplicationId.
func TestConformanceFIFO(t *testing.T) {
	sinktest.Run(t, harness(true))
}
