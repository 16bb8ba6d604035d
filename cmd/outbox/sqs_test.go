package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/outboxkit/outbox/internal/goawstest"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/internal/workload"
)

// TestEndToEndSQSFIFO runs the relay against goaws (in this test process)
// with a FIFO queue in the sink URL: every committed event arrives once
// (MessageDeduplicationId = event id), each aggregate's events in commit
// order (MessageGroupId = aggregate id).
func TestEndToEndSQSFIFO(t *testing.T) {
	t.Parallel()
	srv, err := goawstest.Start()
	if err != nil {
		t.Fatal(err)
	}
	tb, flags := migrated(t)
	admin := goawstest.SQS(t, srv.URL())
	queue := testenv.Name("e2e") + ".fifo"
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	out, err := admin.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(queue), Attributes: map[string]string{"FifoQueue": "true"}})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: out.QueueUrl})
	startRelayEnv(t, []string{"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test", "AWS_EC2_METADATA_DISABLED=true"},
		append(flags, "--sink", "sqs://"+queue+"?region="+goawstest.Region+"&endpoint="+srv.URL())...)
	res, err := workload.Run(ctx, testenv.Pool(t), tb, workload.Config{Aggregates: 40, Transactions: 600, Writers: 4, RollbackPct: 10})
	if err != nil {
		t.Fatal(err)
	}
	var ds []workload.Delivery
	ids := map[string]bool{}
	// Up to 60s; workload.Check reports what is missing. goaws hands a
	// FIFO queue's messages out one at a time, in the order stored.
	_ = await.Poll(60*time.Second, func() error {
		for {
			got, err := admin.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: out.QueueUrl, MaxNumberOfMessages: 1})
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Messages) == 0 {
				break
			}
			for _, m := range got.Messages {
				r := goawstest.Decode(t, queue, aws.ToString(m.Body))
				ds = append(ds, workload.Delivery{ID: r.ID, Key: string(r.Key), Payload: r.Value})
				ids[r.ID] = true
				if _, err := admin.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: out.QueueUrl, ReceiptHandle: m.ReceiptHandle}); err != nil {
					t.Fatal(err)
				}
			}
		}
		if len(ids) < res.Committed() {
			return fmt.Errorf("%d of %d committed events read", len(ids), res.Committed())
		}
		return nil
	})
	dups, err := workload.Check(res, ds)
	if err != nil {
		t.Fatal(err)
	}
	if dups != 0 {
		t.Errorf("%d duplicate copies on a FIFO queue that de-duplicates by event id", dups)
	}
	t.Logf("%d committed events, %d received", res.Committed(), len(ds))
}
