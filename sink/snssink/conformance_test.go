package snssink

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
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

func ctx30s(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// env is one test's topics on goaws, each with an SQS queue subscribed
// with raw message delivery, the sink reaching goaws through a fault
// proxy.
type env struct {
	topics *sns.Client
	queues *sqs.Client
	proxy  *faultproxy.Proxy
	prefix string
	inbox  *goawstest.Inbox

	mu   sync.Mutex
	urls map[string]string // topic name -> URL of its queue
}

func newEnv(t *testing.T) *env {
	t.Helper()
	p, err := faultproxy.Start(server.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	queues := goawstest.SQS(t, server.URL())
	return &env{topics: goawstest.SNS(t, server.URL()), queues: queues, proxy: p, prefix: testenv.Name("t"),
		inbox: goawstest.NewInbox(queues), urls: map[string]string{}}
}

// topic creates the topic for name, and its subscribed queue, once.
func (e *env) topic(t *testing.T, name string) string {
	t.Helper()
	topic := e.prefix + "-" + name
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.urls[topic]; ok {
		return topic
	}
	e.urls[topic] = subscribe(t, e.topics, e.queues, topic)
	return topic
}

// subscribe creates topic and a queue of the same name subscribed to it
// with raw message delivery, and returns the queue's URL.
func subscribe(t *testing.T, topics *sns.Client, queues *sqs.Client, topic string) string {
	t.Helper()
	tout, err := topics.CreateTopic(ctx30s(t), &sns.CreateTopicInput{Name: aws.String(topic)})
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	qout, err := queues.CreateQueue(ctx30s(t), &sqs.CreateQueueInput{QueueName: aws.String(topic)})
	if err != nil {
		t.Fatalf("create queue %s: %v", topic, err)
	}
	if _, err := topics.Subscribe(ctx30s(t), &sns.SubscribeInput{
		TopicArn: tout.TopicArn, Protocol: aws.String("sqs"), Endpoint: aws.String(goawstest.QueueARN(topic)),
		Attributes: map[string]string{"RawMessageDelivery": "true"},
	}); err != nil {
		t.Fatalf("subscribe %s to %s: %v", topic, topic, err)
	}
	t.Cleanup(func() {
		topics.DeleteTopic(context.Background(), &sns.DeleteTopicInput{TopicArn: tout.TopicArn})
		queues.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: qout.QueueUrl})
	})
	return aws.ToString(qout.QueueUrl)
}

func (e *env) queueURL(topic string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.urls[topic]
}

// TestConformance runs the sink conformance suite against goaws's SNS,
// reading what each topic delivered to its SQS subscription, with the
// sink behind a fault proxy.
func TestConformance(t *testing.T) {
	e := sinktest.PerTest(newEnv)
	sinktest.Run(t, sinktest.Harness{
		New: func(t *testing.T) sink.Sink {
			s, err := New(goawstest.SNS(t, "http://"+e(t).proxy.Addr()), &Config{Account: goawstest.Account, Logger: quiet, RetryDelay: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Dest: func(t *testing.T, name string) string { return e(t).topic(t, name) },
		Read: func(t *testing.T, dests []string, want int) []sinktest.Received {
			return e(t).inbox.Read(t, dests, want, e(t).queueURL)
		},
		DedupeKey: false, // standard topics do not de-duplicate
		KeyHeader: "",    // the envelope's "key"
		TooLarge: func(t *testing.T, dest string) *sink.Message {
			return &sink.Message{Destination: dest, Key: []byte("k"), Value: []byte(`"` + strings.Repeat("x", MaxMessageBytes) + `"`)}
		},
		Outage: func(t *testing.T) func() {
			p := e(t).proxy
			p.Cut()
			return p.Restore
		},
	})
}
