package sinkurl_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/outboxkit/outbox/internal/goawstest"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/sinkurl"
	"github.com/outboxkit/outbox/sink/snssink"
	"github.com/outboxkit/outbox/sink/sqssink"
)

// sqs:// and sns:// open the SQS and SNS sinks with the SDK's usual
// credentials and the endpoint of the URL; bad URLs get a clear error.
func TestOpenSQSAndSNS(t *testing.T) {
	srv, err := goawstest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q := testenv.Name("open")
	if _, err := goawstest.SQS(t, srv.URL()).CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(q)}); err != nil {
		t.Fatal(err)
	}
	s, err := sinkurl.Open(ctx, "sqs://"+q+"?region=us-east-1&endpoint="+srv.URL(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, ok := s.(*sqssink.Sink); !ok {
		t.Fatalf("sqs:// opened a %T", s)
	}
	if errs := s.Publish(ctx, []sink.Message{{ID: "m1", Destination: "ignored", Value: []byte(`{}`)}}); errs[0] != nil {
		t.Fatalf("publish to %s: %v", q, errs[0])
	}
	n, err := sinkurl.Open(ctx, "sns://?region=us-east-1&account="+goawstest.Account+"&endpoint="+srv.URL(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if _, ok := n.(*snssink.Sink); !ok {
		t.Fatalf("sns:// opened a %T", n)
	}
	for _, c := range []struct{ url, want string }{
		{"sqs://bad!queue?region=us-east-1", "queue name"},
		{"sqs://q?region=us-east-1&secret=x", `unknown parameter "secret"`},
		{"sns://t?region=us-east-1&endpoint=" + srv.URL(), "needs account="},
	} {
		_, err := sinkurl.Open(ctx, c.url, nil, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("Open(%q) = %v, want one line saying %q", c.url, err, c.want)
		}
	}
}
