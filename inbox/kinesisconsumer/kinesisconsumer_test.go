package kinesisconsumer_test

import (
	"context"
	"fmt"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/inbox/consumertest"
	"github.com/outboxkit/outbox/inbox/internal/pgstore"
	"github.com/outboxkit/outbox/inbox/kinesisconsumer"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/sink"
)

// active waits until the stream is ACTIVE again after a reshard.
func (e *kinesisEnv) active(t *testing.T) {
	t.Helper()
	await.Eventually(t, 30*time.Second, func() error {
		d, err := e.admin.DescribeStreamSummary(testenv.Context(t, 10*time.Second), &kinesis.DescribeStreamSummaryInput{StreamName: aws.String(e.stream)})
		if err != nil {
			return err
		}
		if s := d.StreamDescriptionSummary.StreamStatus; s != types.StreamStatusActive {
			return fmt.Errorf("stream %s", s)
		}
		return nil
	})
}

// TestOrderAcrossASplit publishes an aggregate's first events, splits every
// shard, publishes its later events (which land on a child shard), and
// checks that the consumer handles them all in publish order: a child is
// read only once its parent is finished. The parents' checkpoints end as
// ShardEnd.
func TestOrderAcrossASplit(t *testing.T) {
	e := newKinesisEnv(t)
	st := pgstore.New(t)
	ib := st.Inbox(t, "split", nil)
	var msgs []sink.Message
	for i := range 40 {
		id := uuid.Must(uuid.NewV7()).String()
		msgs = append(msgs, sink.Message{ID: id, Destination: e.stream, Key: []byte(fmt.Sprintf("agg-%d", i%4)), Value: []byte(fmt.Sprintf(`{"n":%d}`, i))})
	}
	consumertest.PublishAll(t, e.sink, msgs[:20])
	shards, err := e.admin.ListShards(testenv.Context(t, 10*time.Second), &kinesis.ListShardsInput{StreamName: aws.String(e.stream)})
	if err != nil {
		t.Fatal(err)
	}
	var parents []string
	for _, s := range shards.Shards {
		lo, hi := s.HashKeyRange.StartingHashKey, s.HashKeyRange.EndingHashKey
		mid := midpoint(t, aws.ToString(lo), aws.ToString(hi))
		if _, err := e.admin.SplitShard(testenv.Context(t, 10*time.Second), &kinesis.SplitShardInput{StreamName: aws.String(e.stream), ShardToSplit: s.ShardId, NewStartingHashKey: aws.String(mid)}); err != nil {
			t.Fatalf("split %s: %v", aws.ToString(s.ShardId), err)
		}
		parents = append(parents, aws.ToString(s.ShardId))
		e.active(t)
	}
	consumertest.PublishAll(t, e.sink, msgs[20:])
	h := func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		return st.Effect(ctx, tx, "split", consumertest.Effect{EventID: strings.ToLower(msg.EventID), AggregateID: msg.AggregateID})
	}
	e.start(t, ib, h, consumer.Config{})
	await.Eventually(t, 60*time.Second, func() error {
		if n := len(st.Effects(t, "split")); n != len(msgs) {
			return fmt.Errorf("%d of %d events handled", n, len(msgs))
		}
		return nil
	})
	pos := map[string]int{}
	for i, m := range msgs {
		pos[strings.ToLower(m.ID)] = i
	}
	last := map[string]int{}
	for _, ef := range st.Effects(t, "split") {
		p := pos[ef.EventID]
		if prev, ok := last[ef.AggregateID]; ok && p < prev {
			t.Errorf("aggregate %s: event #%d handled after #%d, want publish order across the split", ef.AggregateID, p, prev)
		}
		last[ef.AggregateID] = p
	}
	await.Eventually(t, 30*time.Second, func() error {
		for _, p := range parents {
			if cp := e.cps.get(p); cp != kinesisconsumer.ShardEnd {
				return fmt.Errorf("parent shard %s has checkpoint %q, want %s", p, cp, kinesisconsumer.ShardEnd)
			}
		}
		return nil
	})
}

// midpoint returns (lo+hi)/2 of two decimal hash keys.
func midpoint(t *testing.T, lo, hi string) string {
	t.Helper()
	a, ok1 := new(big.Int).SetString(lo, 10)
	b, ok2 := new(big.Int).SetString(hi, 10)
	if !ok1 || !ok2 {
		t.Fatalf("hash keys %q %q", lo, hi)
	}
	return a.Add(a, b).Rsh(a, 1).String()
}

// TestConfigErrors checks that New refuses bad configuration with an error
// naming the field, and Start a stream that does not exist.
func TestConfigErrors(t *testing.T) {
	reachable(t)
	kc := client(t, kinesaliteAddr)
	ib := pgstore.New(t).Inbox(t, "config", nil)
	h := func(context.Context, pgx.Tx, inbox.Message) error { return nil }
	cps := &view{s: &memCheckpoints{m: map[string]string{}}}
	for _, c := range []struct {
		cfg  *kinesisconsumer.Config
		want string
	}{
		{nil, "Config.Stream is empty"},
		{&kinesisconsumer.Config{Stream: "s"}, "Config.Checkpoints is nil"},
		{&kinesisconsumer.Config{Stream: "s", Checkpoints: cps, Limit: 1000}, "Limit 1000"},
		{&kinesisconsumer.Config{Stream: "s", Checkpoints: cps, PollInterval: -time.Second}, "PollInterval"},
	} {
		if _, err := kinesisconsumer.New(kc, ib, h, c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) = %v, want an error containing %q", c.cfg, err, c.want)
		}
	}
	c, err := kinesisconsumer.New(kc, ib, h, &kinesisconsumer.Config{Stream: testenv.Name("absent"), Checkpoints: cps})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(testenv.Context(t, 10*time.Second)); err == nil || !strings.Contains(err.Error(), "list the shards") {
		t.Errorf("Start on an absent stream = %v, want an error listing its shards", err)
	}
}
