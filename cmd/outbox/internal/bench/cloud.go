package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/kinesissink"
	"github.com/outboxkit/outbox/sink/pubsubsink"
)

// PubSubInProcess starts an in-process Pub/Sub server (the client
// library's pstest) for the run: "pubsub://" with no project.
const PubSubInProcess = "pubsub://"

// pubsubProject is the project of the in-process server.
const pubsubProject = "outbox-bench"

// relayEnver is a broker whose `outbox relay` child process needs
// environment variables besides its flags.
type relayEnver interface {
	RelayEnv() []string
}

// rawDescriber is a broker that says how its raw publish works, for the
// report's raw_broker line.
type rawDescriber interface {
	RawDescription() string
}

// pubsubBroker publishes to a topic of its own (and a second one for the
// raw publishes), read through a subscription made before anything is
// published; topics and subscription are deleted at Close. The project is
// the URL's (through PUBSUB_EMULATOR_HOST to an emulator, or to the
// service with the client's usual credentials), or an in-process pstest
// server's.
type pubsubBroker struct {
	project string
	srv     *pstest.Server   // the in-process server, or nil
	conn    *grpc.ClientConn // to srv
	client  *pubsub.Client
	topic   string
}

func openPubSub(ctx context.Context, rest, tag string) (_ *pubsubBroker, err error) {
	b := &pubsubBroker{project: rest, topic: tag}
	defer func() {
		if err != nil {
			b.Close()
		}
	}()
	if rest == "" {
		b.project, b.srv = pubsubProject, pstest.NewServer()
		if b.conn, err = grpc.NewClient(b.srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
			return nil, err
		}
		b.client, err = pubsub.NewClient(ctx, b.project, option.WithGRPCConn(b.conn))
	} else {
		if _, _, err := pubsubsink.ParseURL("pubsub://" + rest); err != nil || strings.Contains(rest, "/") {
			return nil, fmt.Errorf("bench: sink pubsub://%s: want pubsub:// (in process) or pubsub://PROJECT (the bench makes topics of its own)", rest)
		}
		b.client, err = pubsub.NewClient(ctx, b.project)
	}
	if err != nil {
		return nil, fmt.Errorf("bench: Pub/Sub client for project %q: %w", b.project, err)
	}
	for _, t := range []string{b.topic, b.RawDestination(b.topic)} {
		if _, err := b.client.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: b.topicName(t)}); err != nil {
			return nil, fmt.Errorf("bench: create Pub/Sub topic %s: %w", t, err)
		}
	}
	if _, err := b.client.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: b.subscription(), Topic: b.topicName(b.topic), AckDeadlineSeconds: 60,
	}); err != nil {
		return nil, fmt.Errorf("bench: create Pub/Sub subscription %s: %w", b.topic, err)
	}
	return b, nil
}

func (b *pubsubBroker) topicName(id string) string { return "projects/" + b.project + "/topics/" + id }
func (b *pubsubBroker) subscription() string {
	return "projects/" + b.project + "/subscriptions/" + b.topic
}

func (b *pubsubBroker) Describe() string {
	where := "project " + b.project
	switch {
	case b.srv != nil:
		where = "in-process pstest server at " + b.srv.Addr
	case os.Getenv("PUBSUB_EMULATOR_HOST") != "":
		where = "emulator at " + os.Getenv("PUBSUB_EMULATOR_HOST") + ", project " + b.project
	}
	return "Google Pub/Sub: " + where + ", topic " + b.topic + ", ordering keys on"
}

// Destination is the topic: every event goes to the one topic.
func (b *pubsubBroker) Destination() string            { return b.topic }
func (b *pubsubBroker) RawDestination(d string) string { return d + "_raw" }
func (b *pubsubBroker) RelayArgs() []string            { return []string{"--sink", "pubsub://" + b.project} }

// RelayEnv points the relay process at the in-process server.
func (b *pubsubBroker) RelayEnv() []string {
	if b.srv == nil {
		return nil
	}
	return []string{"PUBSUB_EMULATOR_HOST=" + b.srv.Addr}
}

func (b *pubsubBroker) Sink(context.Context) (sink.Sink, error) {
	return pubsubsink.New(b.client, b.project, &pubsubsink.Config{Logger: slog.New(slog.DiscardHandler)})
}

// Raw publishes through one publisher with message ordering on, the
// ordering key the aggregate id, as the sink does, and waits for every
// message's result.
func (b *pubsubBroker) Raw(ctx context.Context, msgs []sink.Message) error {
	pubs := map[string]*pubsub.Publisher{}
	defer func() {
		for _, p := range pubs {
			p.Stop()
		}
	}()
	results := make([]*pubsub.PublishResult, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		p := pubs[m.Destination]
		if p == nil {
			p = b.client.Publisher(b.topicName(m.Destination))
			p.EnableMessageOrdering = true
			pubs[m.Destination] = p
		}
		attrs := make(map[string]string, len(m.Headers)+1)
		for _, h := range m.Headers {
			attrs[h.Key] = h.Value
		}
		attrs[pubsubsink.IDAttr] = m.ID
		results[i] = p.Publish(ctx, &pubsub.Message{Data: m.Value, Attributes: attrs, OrderingKey: string(m.Key)})
	}
	for _, r := range results {
		if _, err := r.Get(ctx); err != nil {
			return fmt.Errorf("bench: raw publish: %w", err)
		}
	}
	return nil
}

func (b *pubsubBroker) RawDescription() string {
	return "the same messages through the Pub/Sub client's publisher (ordering key = aggregate id, as the sink), every result awaited at the end, no database"
}

// Consume pulls from the subscription, 1000 messages a request, and
// acknowledges them. (pstest's streaming pull, which the client's Receive
// uses, hands out messages too slowly to count a drain of many thousands.)
func (b *pubsubBroker) Consume(ctx context.Context, fn func(id string)) (func(), error) {
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	admin := b.client.SubscriptionAdminClient
	go func() {
		defer close(done)
		for cctx.Err() == nil {
			res, err := admin.Pull(cctx, &pubsubpb.PullRequest{Subscription: b.subscription(), MaxMessages: 1000})
			if err == nil && len(res.ReceivedMessages) > 0 {
				ids := make([]string, 0, len(res.ReceivedMessages))
				for _, m := range res.ReceivedMessages {
					fn(m.GetMessage().GetAttributes()[pubsubsink.IDAttr])
					ids = append(ids, m.GetAckId())
				}
				err = admin.Acknowledge(cctx, &pubsubpb.AcknowledgeRequest{Subscription: b.subscription(), AckIds: ids})
			}
			if err != nil && cctx.Err() == nil {
				fmt.Fprintf(os.Stderr, "bench: Pub/Sub consumer: %v\n", err)
				select {
				case <-time.After(100 * time.Millisecond):
				case <-cctx.Done():
				}
			}
		}
	}()
	return func() { cancel(); <-done }, nil
}

func (b *pubsubBroker) Close() error {
	var errs []error
	if b.client != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := b.client.SubscriptionAdminClient.DeleteSubscription(ctx, &pubsubpb.DeleteSubscriptionRequest{Subscription: b.subscription()}); err != nil {
			errs = append(errs, err)
		}
		for _, t := range []string{b.topic, b.RawDestination(b.topic)} {
			if err := b.client.TopicAdminClient.DeleteTopic(ctx, &pubsubpb.DeleteTopicRequest{Topic: b.topicName(t)}); err != nil {
				errs = append(errs, err)
			}
		}
		errs = append(errs, b.client.Close()) // and conn, given to it
	} else if b.conn != nil {
		errs = append(errs, b.conn.Close())
	}
	if b.srv != nil {
		errs = append(errs, b.srv.Close())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("bench: close Pub/Sub: %w", err)
	}
	return nil
}

// kinesisShards is the shard count of the bench's streams.
const kinesisShards = 4

// kinesisInFlight is how many PutRecords requests the raw publish keeps in
// flight: as many as the relay's default lanes (kinesalite, one Node.js
// process, was no faster with 8 and slower with 1).
const kinesisInFlight = 4

// kinesisBroker puts records on a stream of its own (and a second one for
// the raw puts), both of kinesisShards shards, deleted at Close.
type kinesisBroker struct {
	client           *kinesis.Client
	region, endpoint string
	stream           string
}

func openKinesis(ctx context.Context, rawURL, tag string) (_ *kinesisBroker, err error) {
	stream, region, endpoint, err := kinesissink.ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	if stream != "" {
		return nil, fmt.Errorf("bench: sink %q: leave the stream out (kinesis://?region=...&endpoint=...): the bench makes streams of its own", rawURL)
	}
	client, err := kinesissink.NewClient(ctx, region, endpoint)
	if err != nil {
		return nil, err
	}
	b := &kinesisBroker{client: client, region: client.Options().Region, endpoint: endpoint, stream: tag}
	defer func() {
		if err != nil {
			b.Close()
		}
	}()
	streams := []string{b.stream, b.RawDestination(b.stream)}
	for _, s := range streams {
		if _, err := client.CreateStream(ctx, &kinesis.CreateStreamInput{StreamName: aws.String(s), ShardCount: aws.Int32(kinesisShards)}); err != nil {
			return nil, fmt.Errorf("bench: create Kinesis stream %s (credentials: the SDK's usual; any for kinesalite): %w", s, err)
		}
	}
	w := kinesis.NewStreamExistsWaiter(client)
	for _, s := range streams {
		if err := w.Wait(ctx, &kinesis.DescribeStreamInput{StreamName: aws.String(s)}, 5*time.Minute); err != nil {
			return nil, fmt.Errorf("bench: Kinesis stream %s did not become active: %w", s, err)
		}
	}
	return b, nil
}

func (b *kinesisBroker) Describe() string {
	where := "region " + b.region
	if b.endpoint != "" {
		where = "endpoint " + b.endpoint + ", " + where
	}
	return fmt.Sprintf("Amazon Kinesis: %s, stream %s (%d shards)", where, b.stream, kinesisShards)
}

// Destination is the stream: every event goes to the one stream.
func (b *kinesisBroker) Destination() string            { return b.stream }
func (b *kinesisBroker) RawDestination(d string) string { return d + "_raw" }

func (b *kinesisBroker) RelayArgs() []string {
	q := url.Values{"region": {b.region}}
	if b.endpoint != "" {
		q.Set("endpoint", b.endpoint)
	}
	return []string{"--sink", "kinesis://" + b.stream + "?" + q.Encode()}
}

func (b *kinesisBroker) Sink(context.Context) (sink.Sink, error) {
	return kinesissink.New(b.client, &kinesissink.Config{Stream: b.stream, Logger: slog.New(slog.DiscardHandler)})
}

// Raw puts the messages' envelopes (what the sink puts) in PutRecords
// requests of up to 500 records, kinesisInFlight at a time, and puts the
// records a request refused again until every one is stored. It keeps no
// order per key: it is the stream's limit, not the relay's.
func (b *kinesisBroker) Raw(ctx context.Context, msgs []sink.Message) error {
	type request struct {
		stream  string
		records []types.PutRecordsRequestEntry
	}
	var reqs []request
	size := 0
	for i := range msgs {
		m := &msgs[i]
		data, err := sink.Envelope(m)
		if err != nil {
			return err
		}
		key := string(m.Key)
		if key == "" {
			key = m.ID
		}
		n := len(reqs) - 1
		if n < 0 || reqs[n].stream != m.Destination || len(reqs[n].records) == 500 || size+len(data)+len(key) > 5<<20 {
			reqs, size, n = append(reqs, request{stream: m.Destination}), 0, n+1
		}
		reqs[n].records = append(reqs[n].records, types.PutRecordsRequestEntry{Data: data, PartitionKey: aws.String(key)})
		size += len(data) + len(key)
	}
	work := make(chan request)
	errc := make(chan error, kinesisInFlight)
	var wg sync.WaitGroup
	for range kinesisInFlight {
		wg.Go(func() {
			for r := range work {
				if err := b.put(ctx, r.stream, r.records); err != nil {
					errc <- err
					return
				}
			}
		})
	}
	var err error
feed:
	for _, r := range reqs {
		select {
		case work <- r:
		case err = <-errc:
			break feed
		}
	}
	close(work)
	wg.Wait()
	close(errc)
	return errors.Join(err, <-errc)
}

// put puts records on stream, again for those refused, with a doubling
// back-off, until all are stored.
func (b *kinesisBroker) put(ctx context.Context, stream string, records []types.PutRecordsRequestEntry) error {
	backoff := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		out, err := b.client.PutRecords(ctx, &kinesis.PutRecordsInput{StreamName: aws.String(stream), Records: records})
		if err != nil {
			return fmt.Errorf("bench: raw PutRecords: %w", err)
		}
		if aws.ToInt32(out.FailedRecordCount) == 0 {
			return nil
		}
		var again []types.PutRecordsRequestEntry
		for i, r := range out.Records {
			if r.ErrorCode != nil {
				again = append(again, records[i])
			}
		}
		if attempt == 10 {
			return fmt.Errorf("bench: raw PutRecords: %d records refused 10 times (%s)", len(again), aws.ToString(out.Records[0].ErrorCode))
		}
		records = again
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return ctx.Err()
		}
		backoff = min(2*backoff, time.Second)
	}
}

func (b *kinesisBroker) RawDescription() string {
	return fmt.Sprintf("the same envelopes through the SDK's PutRecords, 500 a request, %d requests in flight, no order per key, no database", kinesisInFlight)
}

// kinesisIdle is how long the consumer waits before reading a shard again
// that had nothing new.
const kinesisIdle = 100 * time.Millisecond

// Consume reads every shard of the stream from its start. Stopping waits
// for the request in flight rather than cancel it: kinesalite exits on a
// request its client aborts.
func (b *kinesisBroker) Consume(ctx context.Context, fn func(id string)) (func(), error) {
	shards, err := b.client.ListShards(ctx, &kinesis.ListShardsInput{StreamName: aws.String(b.stream)})
	if err != nil {
		return nil, fmt.Errorf("bench: consumer: %w", err)
	}
	stopc := make(chan struct{})
	var wg sync.WaitGroup
	stop := func() { close(stopc); wg.Wait() }
	for _, sh := range shards.Shards {
		it, err := b.client.GetShardIterator(ctx, &kinesis.GetShardIteratorInput{StreamName: aws.String(b.stream),
			ShardId: sh.ShardId, ShardIteratorType: types.ShardIteratorTypeTrimHorizon})
		if err != nil {
			stop()
			return nil, fmt.Errorf("bench: consumer: %w", err)
		}
		wg.Go(func() {
			iter := it.ShardIterator
			for iter != nil {
				select {
				case <-stopc:
					return
				case <-ctx.Done():
					return
				default:
				}
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
				out, err := b.client.GetRecords(rctx, &kinesis.GetRecordsInput{ShardIterator: iter, Limit: aws.Int32(10000)})
				cancel()
				if err != nil {
					fmt.Fprintf(os.Stderr, "bench: Kinesis consumer, shard %s: %v\n", aws.ToString(sh.ShardId), err)
					return
				}
				for _, r := range out.Records {
					var env struct {
						ID string `json:"id"`
					}
					if json.Unmarshal(r.Data, &env) == nil {
						fn(env.ID)
					}
				}
				iter = out.NextShardIterator
				if len(out.Records) == 0 {
					select {
					case <-time.After(kinesisIdle):
					case <-stopc:
					case <-ctx.Done():
					}
				}
			}
		})
	}
	return stop, nil
}

func (b *kinesisBroker) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	for _, s := range []string{b.stream, b.RawDestination(b.stream)} {
		if _, err := b.client.DeleteStream(ctx, &kinesis.DeleteStreamInput{StreamName: aws.String(s), EnforceConsumerDeletion: aws.Bool(true)}); err != nil {
			var missing *types.ResourceNotFoundException
			if !errors.As(err, &missing) {
				errs = append(errs, fmt.Errorf("bench: delete Kinesis stream %s: %w", s, err))
			}
		}
	}
	if c, ok := b.client.Options().HTTPClient.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
	return errors.Join(errs...)
}
