package snssink

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sns"

	"github.com/outboxkit/outbox/internal/awsbatch"
	"github.com/outboxkit/outbox/internal/goawstest"
	"github.com/outboxkit/outbox/sink"
)

// TestFIFOTopicOnGoaws publishes to a FIFO topic on goaws, checks the
// MessageGroupId and MessageDeduplicationId of each entry the sink sent
// (goaws accepts them but neither orders nor de-duplicates by them on its
// SNS side), and that every message reached the subscribed queue.
func TestFIFOTopicOnGoaws(t *testing.T) {
	e := newEnv(t)
	topic := e.topic(t, "fields.fifo")
	s, err := New(goawstest.SNS(t, server.URL()), &Config{Account: goawstest.Account, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	msgs := []sink.Message{
		{ID: "e1", Destination: topic, Key: []byte("order-1"), Value: []byte(`1`)},
		{ID: "e2", Destination: topic, Key: []byte("order-1"), Value: []byte(`2`)},
		{ID: "e3", Destination: topic, Key: []byte("order 2"), Value: []byte(`3`)},
		{ID: "e4", Destination: topic, Value: []byte(`4`)},
	}
	for i, err := range s.Publish(ctx30s(t), msgs) {
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	arn := "arn:aws:sns:" + goawstest.Region + ":" + goawstest.Account + ":" + topic
	sent := server.Sent(arn)
	want := map[string]string{"e1": "order-1", "e2": "order-1", "e3": awsbatch.FIFOID("order 2"), "e4": "e4"}
	if len(sent) != len(msgs) {
		t.Fatalf("%d entries sent to %s, want %d", len(sent), arn, len(msgs))
	}
	var order []string
	for _, se := range sent {
		id := goawstest.Decode(t, topic, se.Body).ID
		order = append(order, id)
		if se.GroupID != want[id] || se.DedupID != id {
			t.Errorf("message %s: MessageGroupId %q, MessageDeduplicationId %q; want %q, %q", id, se.GroupID, se.DedupID, want[id], id)
		}
	}
	if strings.Index(strings.Join(order, ","), "e1") > strings.Index(strings.Join(order, ","), "e2") {
		t.Errorf("sent in order %v: e2 before e1 of the same group", order)
	}
	got := e.inbox.Read(t, []string{topic}, len(msgs), e.queueURL)
	if len(got) != len(msgs) {
		t.Errorf("the subscribed queue received %d messages, want %d", len(got), len(msgs))
	}
}

// TestPartialFailure reads PublishBatch's per-entry failures: a sender
// fault is permanent, a service fault is retried.
func TestPartialFailure(t *testing.T) {
	attempts := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.ParseForm()
		var ok, failed strings.Builder
		for i := 1; r.Form.Get(fmt.Sprintf("PublishBatchRequestEntries.member.%d.Id", i)) != ""; i++ {
			p := fmt.Sprintf("PublishBatchRequestEntries.member.%d.", i)
			entry, id := r.Form.Get(p+"Id"), r.Form.Get(p+"MessageAttributes.entry.1.Value.StringValue")
			attempts[id]++
			switch {
			case id == "bad":
				fmt.Fprintf(&failed, "<member><Id>%s</Id><Code>InvalidParameter</Code><Message>no</Message><SenderFault>true</SenderFault></member>", entry)
			case id == "flaky" && attempts[id] == 1:
				fmt.Fprintf(&failed, "<member><Id>%s</Id><Code>InternalError</Code><Message>later</Message><SenderFault>false</SenderFault></member>", entry)
			default:
				fmt.Fprintf(&ok, "<member><Id>%s</Id><MessageId>m</MessageId></member>", entry)
			}
		}
		fmt.Fprintf(w, `<PublishBatchResponse xmlns="http://sns.amazonaws.com/doc/2010-03-31/"><PublishBatchResult><Successful>%s</Successful><Failed>%s</Failed></PublishBatchResult></PublishBatchResponse>`, ok.String(), failed.String())
	}))
	defer srv.Close()
	c := sns.New(sns.Options{Region: "us-east-1", BaseEndpoint: aws.String(srv.URL), HTTPClient: srv.Client(),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")})
	s, err := New(c, &Config{Topic: "arn:aws:sns:us-east-1:123456789012:t", Logger: quiet, RetryDelay: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	errs := s.Publish(context.Background(), []sink.Message{{ID: "good"}, {ID: "bad"}, {ID: "flaky"}})
	if errs[0] != nil || !sink.IsPermanent(errs[1]) || errs[2] != nil || attempts["flaky"] != 2 || attempts["bad"] != 1 {
		t.Errorf("results %v, attempts %v; want nil, permanent, nil after 2 attempts of flaky and 1 of bad", errs, attempts)
	}
}

// TestTopicNames: a name becomes an ARN in the client's region and
// partition with Config.Account; without an account a name fails
// transiently; an invalid name or ARN fails permanently.
func TestTopicNames(t *testing.T) {
	for region, want := range map[string]string{
		"eu-west-1": "arn:aws:sns:eu-west-1:123456789012:orders", "cn-north-1": "arn:aws-cn:sns:cn-north-1:123456789012:orders",
		"us-gov-west-1": "arn:aws-us-gov:sns:us-gov-west-1:123456789012:orders",
	} {
		s, err := New(sns.New(sns.Options{Region: region}), &Config{Account: "123456789012", Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := s.arn("orders"); got != want || err != nil {
			t.Errorf("%s: arn(orders) = %q, %v; want %q", region, got, err, want)
		}
	}
	s, err := New(sns.New(sns.Options{Region: "eu-west-1"}), &Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	errs := s.Publish(context.Background(), []sink.Message{
		{ID: "1", Destination: "orders"}, {ID: "2", Destination: "bad name"}, {ID: "3", Destination: "arn:aws:sns:x"},
	})
	if errs[0] == nil || sink.IsPermanent(errs[0]) || !strings.Contains(errs[0].Error(), "Config.Account") {
		t.Errorf("name without account: %v; want a transient error naming Config.Account", errs[0])
	}
	if !sink.IsPermanent(errs[1]) || !sink.IsPermanent(errs[2]) {
		t.Errorf("invalid name or ARN: %v, %v; want permanent", errs[1], errs[2])
	}
	s.Close()
	if errs := s.Publish(context.Background(), []sink.Message{{ID: "m", Destination: "q"}}); !errors.Is(errs[0], ErrClosed) {
		t.Errorf("after Close: %v", errs[0])
	}
}

func TestParseURL(t *testing.T) {
	good := map[string]URL{
		"sns://orders?region=eu-west-1":                                 {Topic: "orders", Region: "eu-west-1"},
		"sns://orders.fifo?region=eu-west-1&account=123456789012":       {Topic: "orders.fifo", Region: "eu-west-1", Account: "123456789012"},
		"sns://?region=us-east-1&account=1&endpoint=http://127.0.0.1:1": {Region: "us-east-1", Account: "1", Endpoint: "http://127.0.0.1:1"},
	}
	for raw, want := range good {
		got, err := ParseURL(raw)
		if err != nil || got != want {
			t.Errorf("ParseURL(%q) = %+v, %v; want %+v", raw, got, err, want)
		}
	}
	for _, raw := range []string{"sns://u:secret@orders", "sns://orders/x", "sns://orders?queue=x", "sns://bad!name", "sqs://orders"} {
		if _, err := ParseURL(raw); err == nil {
			t.Errorf("ParseURL(%q) accepted", raw)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("ParseURL(%q): %q leaks the password", raw, err)
		}
	}
	if _, err := Dial(context.Background(), "sns://orders?region=us-east-1&endpoint=http://127.0.0.1:1", nil); err == nil || !strings.Contains(err.Error(), "account=") {
		t.Errorf("Dial with endpoint= and no account=: %v; want an error asking for account=", err)
	}
	if _, err := New(sns.New(sns.Options{}), &Config{Account: "12"}); err == nil {
		t.Error("New accepted Config.Account 12")
	}
}

// FuzzParseURL: ParseURL never panics, and what it accepts names a valid
// topic (or none).
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{"sns://orders?region=eu-west-1", "sns://t.fifo?account=123456789012&endpoint=http://x", "sns://", "sns://a:b@c", "sns://%zz"} {
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
		if u.Topic != "" && !topicName.MatchString(u.Topic) {
			t.Fatalf("ParseURL(%q) accepted topic %q", raw, u.Topic)
		}
	})
}
