package kafkaconsumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/internal/confval"
)

// Defaults applied to zero Config fields.
const (
	// DefaultCommitInterval is how often handled offsets are committed.
	DefaultCommitInterval = time.Second
	// DefaultShutdownGrace is how long Run lets handlers in flight finish.
	DefaultShutdownGrace = 30 * time.Second
)

// Config configures a Consumer.
type Config struct {
	// Config holds the concurrency, retry and dead-letter settings. Its
	// Logger defaults to warnings and errors as text on standard error.
	consumer.Config
	// Brokers are the seed brokers, host:port. Required.
	Brokers []string
	// Group is the consumer group. Required; usually the inbox's consumer
	// name.
	Group string
	// Topics are the topics to consume. Required.
	Topics []string
	// CommitInterval is how often handled offsets are committed. Default
	// 1s.
	CommitInterval time.Duration
	// ShutdownGrace is how long Run lets handlers in flight finish after
	// its context ended. Default 30s.
	ShutdownGrace time.Duration
	// Options are more client options (TLS, SASL, ...). The consumer sets
	// the seed brokers, group, topics, manual commits, rebalance callbacks
	// and a reset to the start of a partition that has no committed
	// offset; options given here that set those are overridden.
	Options []kgo.Opt
}

// Consumer reads records of a consumer group and handles them through an
// inbox.
type Consumer[TTx any] struct {
	ib  *inbox.Inbox[TTx]
	h   consumer.Handler[TTx]
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	started bool
	cl      *kgo.Client
	eng     *consumer.Engine[TTx]
	parts   map[tp]*partition
	stop    context.CancelFunc
	done    chan struct{}
}

type tp struct {
	topic string
	part  int32
}

// partition tracks the records of one assigned partition that are not
// committed yet. Guarded by Consumer.mu.
type partition struct {
	ctx    context.Context
	cancel context.CancelFunc // when revoked or lost
	// pending are the fetched records not yet behind the commit point, in
	// offset order.
	pending     []*pendingRec
	next        kgo.EpochOffset // the offset to commit; Offset < 0: none
	committed   int64
	outstanding int // submitted, neither acknowledged nor released
}

type pendingRec struct {
	offset int64
	epoch  int32
	done   bool
}

// New returns a Consumer that handles the records of cfg.Topics with h
// through ib. It does no I/O; Start joins the group.
func New[TTx any](ib *inbox.Inbox[TTx], h consumer.Handler[TTx], cfg *Config) (*Consumer[TTx], error) {
	if ib == nil {
		return nil, errors.New("kafkaconsumer: inbox is nil")
	}
	if h == nil {
		return nil, errors.New("kafkaconsumer: handler is nil")
	}
	if cfg == nil {
		return nil, errors.New("kafkaconsumer: config is nil: Brokers, Group and Topics are required")
	}
	c := *cfg
	c.Brokers, c.Topics, c.Options = slices.Clone(c.Brokers), slices.Clone(c.Topics), slices.Clone(c.Options)
	if len(c.Brokers) == 0 {
		return nil, errors.New("kafkaconsumer: no Config.Brokers: give at least one host:port")
	}
	for _, b := range c.Brokers {
		if i := strings.LastIndexByte(b, ':'); i <= 0 || i == len(b)-1 {
			return nil, fmt.Errorf("kafkaconsumer: broker %q: want host:port", b)
		}
	}
	if strings.TrimSpace(c.Group) == "" {
		return nil, errors.New("kafkaconsumer: Config.Group is empty: name the consumer group")
	}
	if len(c.Topics) == 0 {
		return nil, errors.New("kafkaconsumer: no Config.Topics: name the topics to consume")
	}
	for _, t := range c.Topics {
		if t == "" || len(t) > 249 || strings.ContainsFunc(t, func(r rune) bool {
			return !(r == '.' || r == '_' || r == '-' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
		}) {
			return nil, fmt.Errorf("kafkaconsumer: topic %q: use 1 to 249 of [a-zA-Z0-9._-]", t)
		}
	}
	if err := confval.PositiveOr("kafkaconsumer", "CommitInterval", &c.CommitInterval, DefaultCommitInterval); err != nil {
		return nil, err
	}
	if err := confval.PositiveOr("kafkaconsumer", "ShutdownGrace", &c.ShutdownGrace, DefaultShutdownGrace); err != nil {
		return nil, err
	}
	c.Logger = confval.Logger(c.Logger)
	c.KeepAlive = 0 // Kafka has no per-record timeout
	eng, err := consumer.New(ib, h, &c.Config)
	if err != nil {
		return nil, fmt.Errorf("kafkaconsumer: %w", err)
	}
	return &Consumer[TTx]{ib: ib, h: h, cfg: c, log: c.Logger.With("group", c.Group), eng: eng, parts: map[tp]*partition{}}, nil
}

// Start joins the consumer group and starts reading and handling records in
// the background, and returns. It fails if the Consumer was already started.
func (c *Consumer[TTx]) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started {
		return errors.New("kafkaconsumer: already started")
	}
	opts := append(slices.Clone(c.cfg.Options),
		kgo.SeedBrokers(c.cfg.Brokers...),
		kgo.ConsumerGroup(c.cfg.Group),
		kgo.ConsumeTopics(c.cfg.Topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsRevoked(c.revoked),
		kgo.OnPartitionsLost(c.lost),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafkaconsumer: %w", err)
	}
	if err := c.eng.Start(ctx); err != nil {
		cl.Close()
		return fmt.Errorf("kafkaconsumer: %w", err)
	}
	c.started, c.cl = true, cl
	loopCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	c.stop = stop
	c.done = make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { c.poll(loopCtx) })
	wg.Go(func() { c.committer(loopCtx) })
	go func() {
		wg.Wait()
		close(c.done)
	}()
	return nil
}

// poll reads records and submits them until stopped.
func (c *Consumer[TTx]) poll(ctx context.Context) {
	for {
		fs := c.cl.PollRecords(ctx, c.eng.Config().MaxPending)
		if ctx.Err() != nil || fs.IsClientClosed() {
			c.cl.AllowRebalance()
			return
		}
		fs.EachError(func(topic string, p int32, err error) {
			c.log.Warn("kafkaconsumer: fetch failed", "topic", topic, "partition", p, "err", err)
		})
		// Register every record while rebalances are blocked, so that a
		// record is tracked only for a partition this member owns.
		var ds []*delivery
		c.mu.Lock()
		fs.EachRecord(func(r *kgo.Record) {
			k := tp{r.Topic, r.Partition}
			p := c.parts[k]
			if p == nil {
				pctx, cancel := context.WithCancel(ctx)
				p = &partition{ctx: pctx, cancel: cancel, next: kgo.EpochOffset{Offset: -1}, committed: -1}
				c.parts[k] = p
			}
			pr := &pendingRec{offset: r.Offset, epoch: r.LeaderEpoch}
			p.pending = append(p.pending, pr)
			ds = append(ds, &delivery{c: c, p: p, rec: pr, msg: message(r), key: r.Topic + "\x00" + string(r.Key)})
		})
		c.mu.Unlock()
		c.cl.AllowRebalance()
		for _, d := range ds {
			c.submit(d)
		}
	}
}

// submit hands d to the engine unless its partition was taken away.
func (c *Consumer[TTx]) submit(d *delivery) {
	c.mu.Lock()
	if d.p.ctx.Err() != nil {
		c.mu.Unlock()
		return
	}
	d.p.outstanding++
	c.mu.Unlock()
	if err := c.eng.Submit(d.p.ctx, d); err != nil {
		_ = d.Release(0)
	}
}

func message(r *kgo.Record) inbox.Message {
	var hdr map[string]string
	if len(r.Headers) > 0 {
		hdr = make(map[string]string, len(r.Headers))
		for _, h := range r.Headers {
			if _, ok := hdr[h.Key]; !ok {
				hdr[h.Key] = string(h.Value)
			}
		}
	}
	m := inbox.NewMessage(r.Topic, r.Key, hdr, r.Value)
	m.System = "kafka"
	return m
}

// committer commits handled offsets every CommitInterval until stopped.
func (c *Consumer[TTx]) committer(ctx context.Context) {
	t := time.NewTicker(c.cfg.CommitInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		if err := c.commit(cctx, nil); err != nil && ctx.Err() == nil {
			c.log.Warn("kafkaconsumer: committing offsets failed; trying again", "err", err)
		}
		cancel()
	}
}

// commit commits the contiguous handled offsets of the partitions in only
// (all owned partitions when only is nil) that moved since their last
// commit.
func (c *Consumer[TTx]) commit(ctx context.Context, only map[string][]int32) error {
	c.mu.Lock()
	offsets := map[string]map[int32]kgo.EpochOffset{}
	for k, p := range c.parts {
		if only != nil && !slices.Contains(only[k.topic], k.part) {
			continue
		}
		if p.next.Offset < 0 || p.next.Offset == p.committed {
			continue
		}
		if offsets[k.topic] == nil {
			offsets[k.topic] = map[int32]kgo.EpochOffset{}
		}
		offsets[k.topic][k.part] = p.next
	}
	cl := c.cl
	c.mu.Unlock()
	if len(offsets) == 0 {
		return nil
	}
	var cerr error
	cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			cerr = err
			return
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if e := kerr.ErrorForCode(p.ErrorCode); e != nil {
					cerr = fmt.Errorf("commit %s/%d: %w", t.Topic, p.Partition, e)
					continue
				}
				if st := c.parts[tp{t.Topic, p.Partition}]; st != nil {
					st.committed = offsets[t.Topic][p.Partition].Offset
				}
			}
		}
	})
	return cerr
}

// revoked lets the partitions' handlers in flight finish, drops their
// queued records, commits their offsets and forgets them.
func (c *Consumer[TTx]) revoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	c.forget(ctx, revoked, true)
}

// lost forgets the partitions without committing: another member may own
// them already.
func (c *Consumer[TTx]) lost(ctx context.Context, _ *kgo.Client, lost map[string][]int32) {
	c.forget(ctx, lost, false)
}

func (c *Consumer[TTx]) forget(ctx context.Context, ps map[string][]int32, commit bool) {
	var mine []*partition
	c.mu.Lock()
	for topic, parts := range ps {
		for _, part := range parts {
			if p := c.parts[tp{topic, part}]; p != nil {
				p.cancel()
				mine = append(mine, p)
			}
		}
	}
	c.mu.Unlock()
	if commit {
		// Wait for the handlers in flight: their records may then be
		// committed. Records queued or waiting for a retry are released at
		// once, since their partition's context ended.
		wctx, cancel := context.WithTimeout(ctx, c.cfg.ShutdownGrace)
		defer cancel()
		for _, p := range mine {
			for {
				c.mu.Lock()
				n := p.outstanding
				c.mu.Unlock()
				if n == 0 || wctx.Err() != nil {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		if err := c.commit(wctx, ps); err != nil {
			c.log.Warn("kafkaconsumer: committing the offsets of revoked partitions failed; their next owner handles some records again (the inbox suppresses them)", "err", err)
		}
	}
	c.mu.Lock()
	for topic, parts := range ps {
		for _, part := range parts {
			delete(c.parts, tp{topic, part})
		}
	}
	c.mu.Unlock()
}

// Stop stops reading, lets the handlers in flight finish, commits the
// handled offsets, leaves the group and returns when every goroutine has
// exited. If ctx ends first, handlers in flight are cancelled (their
// transactions roll back; their records are read again by the partition's
// next owner). Stop is idempotent and safe when Start never ran.
func (c *Consumer[TTx]) Stop(ctx context.Context) error {
	c.mu.Lock()
	if !c.started {
		c.mu.Unlock()
		return nil
	}
	c.stop()
	done, cl := c.done, c.cl
	c.mu.Unlock()
	<-done // the poll loop returns once PollRecords sees its context end
	err := c.eng.Stop(ctx)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if cerr := c.commit(cctx, nil); cerr != nil {
		c.log.Warn("kafkaconsumer: committing offsets at stop failed; some records are handled again (the inbox suppresses them)", "err", cerr)
	}
	cl.CloseAllowingRebalance()
	return err
}

// Run starts the Consumer and stops it gracefully when ctx ends, letting
// handlers in flight finish for at most Config.ShutdownGrace.
func (c *Consumer[TTx]) Run(ctx context.Context) error {
	if err := c.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), c.cfg.ShutdownGrace)
	defer cancel()
	return c.Stop(sctx)
}

// delivery adapts a record to consumer.Delivery.
type delivery struct {
	c   interface{ finish(*delivery, bool) }
	p   *partition
	rec *pendingRec
	msg inbox.Message
	key string
}

func (d *delivery) Message() inbox.Message { return d.msg }
func (d *delivery) Key() string            { return d.key }
func (d *delivery) Attempts() int          { return 0 }
func (d *delivery) KeepAlive() error       { return nil }

// Abandoned is closed when the record's partition is revoked or lost.
func (d *delivery) Abandoned() <-chan struct{} { return d.p.ctx.Done() }

// Ack marks the record handled; the committer commits it once every record
// before it in its partition is handled too.
func (d *delivery) Ack(context.Context) error {
	d.c.finish(d, true)
	return nil
}

// Release leaves the record uncommitted: the partition's next reader
// (this member after a restart, or the next owner) reads it again.
func (d *delivery) Release(time.Duration) error {
	d.c.finish(d, false)
	return nil
}

func (c *Consumer[TTx]) finish(d *delivery, handled bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := d.p
	p.outstanding--
	if !handled {
		return
	}
	d.rec.done = true
	i := 0
	for ; i < len(p.pending) && p.pending[i].done; i++ {
		p.next = kgo.EpochOffset{Epoch: p.pending[i].epoch, Offset: p.pending[i].offset + 1}
	}
	p.pending = p.pending[i:]
}
