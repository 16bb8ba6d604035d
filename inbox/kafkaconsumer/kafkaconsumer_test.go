package kafkaconsumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/inbox/inboxpgx"
	"github.com/outboxkit/outbox/inbox/kafkaconsumer"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxdriver"
)

const topic = "outbox.event.order"

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture is an inbox and an effects table in a fresh schema, and an
// in-process Kafka cluster with the topic.
type fixture struct {
	pool    *pgxpool.Pool
	tbl     outboxdriver.Table
	brokers []string
	prod    *kgo.Client
}

func newFixture(t *testing.T, partitions int32) *fixture {
	t.Helper()
	pool := testenv.Pool(t)
	tbl := testenv.Table(t, pool)
	tbl.Name = "inbox"
	ctx := testenv.Context(t, 30*time.Second)
	if _, err := inboxpgx.Migrate(ctx, pool, tbl); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+outboxdriver.QuoteIdent(tbl.Schema)+`.effects (seq bigserial PRIMARY KEY, consumer text NOT NULL, event_id text NOT NULL, agg text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	prod, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prod.Close)
	return &fixture{pool: pool, tbl: tbl, brokers: c.ListenAddrs(), prod: prod}
}

func newID() string { return uuid.Must(uuid.NewV7()).String() }

// produce sends a record as kafkasink does: key = aggregate id, header id.
func (f *fixture) produce(t *testing.T, id, key string, value []byte) {
	t.Helper()
	r := &kgo.Record{Topic: topic, Key: []byte(key), Value: value}
	if id != "" {
		r.Headers = []kgo.RecordHeader{{Key: inbox.HeaderID, Value: []byte(id)}}
	}
	if err := f.prod.ProduceSync(testenv.Context(t, 10*time.Second), r).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) inbox(t *testing.T, name string, m inbox.Metrics) *inbox.Inbox[pgx.Tx] {
	t.Helper()
	ib, err := inbox.New(inboxpgx.New(f.pool), &inbox.Config{Consumer: name, Schema: f.tbl.Schema, Table: f.tbl.Name, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	return ib
}

// handler records one effect per record; a value that is not a JSON object
// is a permanent error.
func (f *fixture) handler(name string) consumer.Handler[pgx.Tx] {
	return func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		var body map[string]any
		if err := json.Unmarshal(msg.Payload, &body); err != nil {
			return consumer.Permanent(fmt.Errorf("payload does not decode: %w", err))
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+outboxdriver.QuoteIdent(f.tbl.Schema)+`.effects (consumer, event_id, agg) VALUES ($1, $2, $3)`,
			name, strings.ToLower(msg.EventID), msg.AggregateID)
		return err
	}
}

func (f *fixture) effects(t *testing.T, name string) map[string]int {
	t.Helper()
	rows, err := f.pool.Query(testenv.Context(t, 10*time.Second),
		`SELECT event_id, count(*) FROM `+outboxdriver.QuoteIdent(f.tbl.Schema)+`.effects WHERE consumer = $1 GROUP BY event_id`, name)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		out[id] = n
	}
	return out
}

func (f *fixture) config(group string) *kafkaconsumer.Config {
	return &kafkaconsumer.Config{
		Config:  consumer.Config{RetryBase: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond},
		Brokers: f.brokers, Group: group, Topics: []string{topic}, CommitInterval: 50 * time.Millisecond,
	}
}

// start starts a consumer; stop (also at the end of the test) stops it.
func start(t *testing.T, ib *inbox.Inbox[pgx.Tx], h consumer.Handler[pgx.Tx], cfg *kafkaconsumer.Config) (stop func()) {
	t.Helper()
	c, err := kafkaconsumer.New(ib, h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(testenv.Context(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	stop = sync.OnceFunc(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	t.Cleanup(stop)
	return stop
}

// committed returns the group's committed offset of partition p, -1 when
// none.
func (f *fixture) committed(t *testing.T, group string, p int32) int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = group
	rt := kmsg.NewOffsetFetchRequestTopic()
	rt.Topic = topic
	rt.Partitions = []int32{p}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(testenv.Context(t, 10*time.Second), cl)
	if err != nil {
		t.Fatal(err)
	}
	for _, rt := range resp.Topics {
		for _, rp := range rt.Partitions {
			if rp.Partition == p {
				return rp.Offset
			}
		}
	}
	return -1
}

// committedOffset is a condition for testenv.Eventually: the billing
// group's committed offset of partition 0 is want.
func committedOffset(t *testing.T, f *fixture, want int64) func() error {
	return func() error {
		if c := f.committed(t, "billing", 0); c != want {
			return fmt.Errorf("committed offset %d, want %d", c, want)
		}
		return nil
	}
}

type counts struct{ n [5]atomic.Int64 }

func (c *counts) Handled(_ string, o inbox.Outcome, _ time.Duration) { c.n[o].Add(1) }
func (c *counts) get(o inbox.Outcome) int64                          { return c.n[o].Load() }

// TestSameEventTwiceAndTwoMembers produces every event twice to a topic of
// four partitions consumed by two members of one group: each event takes
// effect once, and every record's offset is committed.
func TestSameEventTwiceAndTwoMembers(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 4)
	var a, b counts
	start(t, f.inbox(t, "billing", &a), f.handler("billing"), f.config("billing"))
	start(t, f.inbox(t, "billing", &b), f.handler("billing"), f.config("billing"))
	const n = 100
	ids := make([]string, n)
	for i := range ids {
		ids[i] = newID()
		f.produce(t, ids[i], fmt.Sprint("agg-", i%9), []byte(`{}`))
		f.produce(t, ids[i], fmt.Sprint("agg-", i%9), []byte(`{}`))
	}
	// A rebalance between the members redelivers records from the last
	// committed offset (counted as duplicates), so the handled count can
	// reach 2n before the last event took effect: wait for the effects
	// and the processed count too.
	await.Eventually(t, 60*time.Second, func() error {
		done := a.get(inbox.Processed) + a.get(inbox.Duplicate) + b.get(inbox.Processed) + b.get(inbox.Duplicate)
		processed, effects := a.get(inbox.Processed)+b.get(inbox.Processed), len(f.effects(t, "billing"))
		if done < 2*n || processed < n || effects < n {
			return fmt.Errorf("%d of %d records handled, %d of %d events processed, %d took effect", done, 2*n, processed, n, effects)
		}
		return nil
	})
	got := f.effects(t, "billing")
	if len(got) != n {
		t.Fatalf("%d events took effect, want %d", len(got), n)
	}
	for _, id := range ids {
		if got[id] != 1 {
			t.Fatalf("event %s took effect %d times", id, got[id])
		}
	}
	if p := a.get(inbox.Processed) + b.get(inbox.Processed); p != n {
		t.Fatalf("processed %d, want %d", p, n)
	}
	// Every record is committed: the offsets sum to the records produced.
	await.Eventually(t, 30*time.Second, func() error {
		var sum int64
		for p := range int32(4) {
			sum += max(f.committed(t, "billing", p), 0)
		}
		if sum != 2*n {
			return fmt.Errorf("committed offsets sum to %d, want %d", sum, 2*n)
		}
		return nil
	})
}

// TestTwoGroups: two consumers, each its own group, each apply every event
// once.
func TestTwoGroups(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	for _, name := range []string{"billing", "shipping"} {
		start(t, f.inbox(t, name, nil), f.handler(name), f.config(name))
	}
	ids := []string{newID(), newID(), newID()}
	for _, id := range ids {
		f.produce(t, id, "7", []byte(`{}`))
		f.produce(t, id, "7", []byte(`{}`))
	}
	for _, name := range []string{"billing", "shipping"} {
		await.Eventually(t, 30*time.Second, func() error {
			got := f.effects(t, name)
			ok := len(got) == len(ids)
			for _, n := range got {
				ok = ok && n == 1
			}
			if !ok {
				return fmt.Errorf("%s: effects %v", name, got)
			}
			return nil
		})
	}
}

// TestInvalidRecordsAreDeadLettered: records without an id, with an id that
// is not a UUID, and with a value that does not decode are dead-lettered
// with their cause, committed, and consumption goes on.
func TestInvalidRecordsAreDeadLettered(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	ib := f.inbox(t, "billing", nil)
	start(t, ib, f.handler("billing"), f.config("billing"))
	undecodable, good := newID(), newID()
	f.produce(t, "", "1", []byte(`{}`))
	f.produce(t, "not-a-uuid", "2", []byte(`{}`))
	f.produce(t, undecodable, "3", []byte(`{"half`))
	f.produce(t, good, "4", []byte(`{}`))
	await.Eventually(t, 30*time.Second, committedOffset(t, f, 4))
	if got := f.effects(t, "billing"); len(got) != 1 || got[good] != 1 {
		t.Fatalf("effects %v, want one for %s", got, good)
	}
	dls, err := ib.DeadLetters(testenv.Context(t, 10*time.Second), 10)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"": "no event id", "not-a-uuid": "not a UUID", undecodable: "payload does not decode"}
	if len(dls) != len(want) {
		t.Fatalf("%d dead letters, want %d: %+v", len(dls), len(want), dls)
	}
	for _, dl := range dls {
		cause, ok := want[dl.EventID]
		if !ok || !strings.Contains(dl.Error, cause) || dl.Destination != topic || dl.AggregateType != "order" {
			t.Errorf("dead letter id %q error %q destination %q type %q; want one of %v with its cause", dl.EventID, dl.Error, dl.Destination, dl.AggregateType, want)
		}
		delete(want, dl.EventID)
	}
}

// TestFailingRecordHoldsTheCommit: a record whose handler keeps failing is
// retried in place; the records after it (other keys) are handled, but the
// partition's committed offset stays at the failing record. A consumer
// stopped then and a new one started handle the failing record once and
// suppress the others as duplicates.
func TestFailingRecordHoldsTheCommit(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	ids := []string{newID(), newID(), newID(), newID(), newID()}
	var failing atomic.Bool
	failing.Store(true)
	var tries atomic.Int64
	base := f.handler("billing")
	h := func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		if msg.EventID == ids[1] && failing.Load() {
			tries.Add(1)
			return errors.New("downstream is down")
		}
		return base(ctx, tx, msg)
	}
	cfg := f.config("billing")
	cfg.MaxAttempts = 1000
	stop := start(t, f.inbox(t, "billing", nil), h, cfg)
	for i, id := range ids {
		f.produce(t, id, fmt.Sprint("key-", i), []byte(`{}`))
	}
	await.Eventually(t, 30*time.Second, func() error {
		if got, n := f.effects(t, "billing"), tries.Load(); len(got) != 4 || n < 3 {
			return fmt.Errorf("effects %v, %d failed attempts", got, n)
		}
		return nil
	})
	await.Eventually(t, 30*time.Second, committedOffset(t, f, 1)) // the failing record
	stop()
	if c := f.committed(t, "billing", 0); c != 1 {
		t.Fatalf("after stop the committed offset is %d, want 1: nothing past the unhandled record", c)
	}
	failing.Store(false)
	var m counts
	start(t, f.inbox(t, "billing", &m), h, f.config("billing"))
	await.Eventually(t, 30*time.Second, committedOffset(t, f, 5))
	if m.get(inbox.Processed) != 1 || m.get(inbox.Duplicate) != 3 {
		t.Fatalf("second consumer: %d processed, %d duplicates; want 1 and 3", m.get(inbox.Processed), m.get(inbox.Duplicate))
	}
	got := f.effects(t, "billing")
	for _, id := range ids {
		if got[id] != 1 {
			t.Fatalf("event %s took effect %d times", id, got[id])
		}
	}
}

// TestRetryThenDeadLetterKeepsKeyOrder: the first event of a key fails
// twice and is then applied, before the key's second event; an event that
// always fails is dead-lettered after MaxAttempts and committed.
func TestRetryThenDeadLetterKeepsKeyOrder(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	first, second, poison := newID(), newID(), newID()
	var mu sync.Mutex
	tries := map[string]int{}
	var order []string
	base := f.handler("billing")
	h := func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		mu.Lock()
		tries[msg.EventID]++
		n := tries[msg.EventID]
		mu.Unlock()
		switch {
		case msg.EventID == poison:
			return errors.New("downstream refuses")
		case msg.EventID == first && n <= 2:
			return fmt.Errorf("transient failure %d", n)
		}
		if err := base(ctx, tx, msg); err != nil {
			return err
		}
		mu.Lock()
		order = append(order, msg.EventID)
		mu.Unlock()
		return nil
	}
	cfg := f.config("billing")
	cfg.MaxAttempts = 3
	ib := f.inbox(t, "billing", nil)
	start(t, ib, h, cfg)
	f.produce(t, first, "A", []byte(`{}`))
	f.produce(t, poison, "B", []byte(`{}`))
	f.produce(t, second, "A", []byte(`{}`))
	await.Eventually(t, 30*time.Second, committedOffset(t, f, 3))
	mu.Lock()
	defer mu.Unlock()
	if len(order) != 2 || order[0] != first || order[1] != second {
		t.Fatalf("applied %v, want [%s %s]", order, first, second)
	}
	dls, err := ib.DeadLetters(testenv.Context(t, 10*time.Second), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 || dls[0].EventID != poison || !strings.Contains(dls[0].Error, "gave up after 3 attempts: downstream refuses") {
		t.Fatalf("dead letters = %+v, want the poison event with its cause", dls)
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	ib := f.inbox(t, "billing", nil)
	h := f.handler("billing")
	for _, tc := range []struct {
		cfg  *kafkaconsumer.Config
		want string
	}{
		{nil, "config is nil"},
		{&kafkaconsumer.Config{Group: "g", Topics: []string{"t"}}, "no Config.Brokers"},
		{&kafkaconsumer.Config{Brokers: []string{"localhost"}, Group: "g", Topics: []string{"t"}}, "want host:port"},
		{&kafkaconsumer.Config{Brokers: []string{"k:9092"}, Topics: []string{"t"}}, "Config.Group is empty"},
		{&kafkaconsumer.Config{Brokers: []string{"k:9092"}, Group: "g"}, "no Config.Topics"},
		{&kafkaconsumer.Config{Brokers: []string{"k:9092"}, Group: "g", Topics: []string{"a b"}}, `topic "a b"`},
		{&kafkaconsumer.Config{Brokers: []string{"k:9092"}, Group: "g", Topics: []string{"t"}, CommitInterval: -1}, "CommitInterval"},
		{&kafkaconsumer.Config{Brokers: []string{"k:9092"}, Group: "g", Topics: []string{"t"}, Config: consumer.Config{Concurrency: -1}}, "Concurrency -1"},
	} {
		if _, err := kafkaconsumer.New(ib, h, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}
}
