package goawstest

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/sink/sinktest"
)

// Config returns what an SDK client needs to reach endpoint (the Server,
// or a proxy in front of it): region, static credentials, and an HTTP
// client closed at the end of the test.
func Config(t *testing.T) (region string, creds aws.CredentialsProvider, hc *http.Client) {
	hc = &http.Client{Transport: &http.Transport{}}
	t.Cleanup(hc.CloseIdleConnections)
	return Region, credentials.NewStaticCredentialsProvider("test", "test", ""), hc
}

// SQS returns an SQS client for endpoint (http://host:port).
func SQS(t *testing.T, endpoint string) *sqs.Client {
	region, creds, hc := Config(t)
	return sqs.New(sqs.Options{Region: region, BaseEndpoint: aws.String(endpoint), Credentials: creds, HTTPClient: hc})
}

// Inbox receives, decodes and deletes the messages of queues and keeps
// them, for a sinktest harness's Read.
type Inbox struct {
	c   *sqs.Client
	mu  sync.Mutex
	got map[string][]sinktest.Received // by destination
}

// NewInbox returns an Inbox that reads with c.
func NewInbox(c *sqs.Client) *Inbox {
	return &Inbox{c: c, got: map[string][]sinktest.Received{}}
}

// drain receives every visible message of queueURL, one at a time (goaws
// hands out a FIFO queue's messages one by one), decodes it as held at
// dest, and deletes it.
func (in *Inbox) drain(t *testing.T, dest, queueURL string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		out, err := in.c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(queueURL), MaxNumberOfMessages: 1, MessageAttributeNames: []string{"All"}})
		if err != nil {
			t.Fatalf("receive from %s: %v", queueURL, err)
		}
		if len(out.Messages) == 0 {
			return
		}
		for _, m := range out.Messages {
			r := Decode(t, dest, aws.ToString(m.Body))
			if a, ok := m.MessageAttributes["id"]; !ok || aws.ToString(a.StringValue) != r.ID {
				t.Errorf("message %s at %s: attribute id %v, want the envelope's id", r.ID, dest, a.StringValue)
			}
			in.mu.Lock()
			in.got[dest] = append(in.got[dest], r)
			in.mu.Unlock()
			if _, err := in.c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(queueURL), ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Fatalf("delete from %s: %v", queueURL, err)
			}
		}
	}
}

// Read returns everything received from the queues of dests (queueOf maps
// a destination to its queue URL), polling up to 30 s until want are
// there.
func (in *Inbox) Read(t *testing.T, dests []string, want int, queueOf func(dest string) string) []sinktest.Received {
	t.Helper()
	all := func() []sinktest.Received {
		var out []sinktest.Received
		for _, d := range dests {
			in.drain(t, d, queueOf(d))
			in.mu.Lock()
			out = append(out, in.got[d]...)
			in.mu.Unlock()
		}
		return out
	}
	_ = await.Poll(30*time.Second, func() error {
		if n := len(all()); n < want {
			return fmt.Errorf("%d of %d messages arrived", n, want)
		}
		return nil
	})
	return all()
}

type envelope struct {
	ID            string  `json:"id"`
	Destination   string  `json:"destination"`
	Key           *string `json:"key"`
	KeyBase64     *string `json:"key_base64"`
	Headers       []struct{ Key, Value string }
	Payload       json.RawMessage `json:"payload"`
	PayloadBase64 *string         `json:"payload_base64"`
}

// Decode reads body, a sink.Envelope, as a message held at dest.
func Decode(t *testing.T, dest, body string) sinktest.Received {
	t.Helper()
	var env envelope
	if err := json.Unmarshal([]byte(body), &env); err != nil {
		t.Fatalf("message at %s: envelope: %v", dest, err)
	}
	hs := map[string][]string{}
	for _, h := range env.Headers {
		hs[h.Key] = append(hs[h.Key], h.Value)
	}
	var key []byte
	switch {
	case env.KeyBase64 != nil:
		k, err := base64.StdEncoding.DecodeString(*env.KeyBase64)
		if err != nil {
			t.Fatal(err)
		}
		key = k
	case env.Key != nil && *env.Key != "":
		key = []byte(*env.Key)
	}
	var value []byte
	switch {
	case env.PayloadBase64 != nil:
		v, err := base64.StdEncoding.DecodeString(*env.PayloadBase64)
		if err != nil {
			t.Fatal(err)
		}
		value = v
	case string(env.Payload) != "null" && len(env.Payload) > 0:
		value = env.Payload
	}
	return sinktest.Received{ID: env.ID, Destination: dest, Key: key, Value: value, Headers: hs}
}

// SNS returns an SNS client for endpoint (http://host:port).
func SNS(t *testing.T, endpoint string) *sns.Client {
	region, creds, hc := Config(t)
	return sns.New(sns.Options{Region: region, BaseEndpoint: aws.String(endpoint), Credentials: creds, HTTPClient: hc})
}
