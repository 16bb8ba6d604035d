package kinesisconsumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/inbox/internal/envelope"
	"github.com/outboxkit/outbox/internal/backoff"
	"github.com/outboxkit/outbox/internal/confval"
)

// ShardEnd is the checkpoint of a shard read to its end and fully handled.
const ShardEnd = "SHARD_END"

// Defaults applied to zero Config fields.
const (
	// DefaultPollInterval is the pause between two GetRecords calls on a
	// shard that returned nothing new.
	DefaultPollInterval = time.Second
	// DefaultCheckpointInterval is how often checkpoints are saved.
	DefaultCheckpointInterval = 5 * time.Second
	// DefaultShardSyncInterval is how often the shard list is read again.
	DefaultShardSyncInterval = 30 * time.Second
	// DefaultLimit is the most records one GetRecords call asks for.
	DefaultLimit = 100
	// DefaultShutdownGrace is how long Run lets handlers in flight finish.
	DefaultShutdownGrace = 30 * time.Second
)

// Checkpoints stores the consumer's position in each shard. Get returns ""
// for a shard without a checkpoint. Implementations must be safe for
// concurrent use.
type Checkpoints interface {
	Get(ctx context.Context, stream, shardID string) (string, error)
	Set(ctx context.Context, stream, shardID, sequenceNumber string) error
}

// Config configures a Consumer. Stream and Checkpoints are required.
type Config struct {
	// Config holds the concurrency, retry and dead-letter settings. Its
	// Logger defaults to warnings and errors as text on standard error.
	consumer.Config
	// Stream is the stream's name. Required.
	Stream string
	// Checkpoints stores the position in each shard. Required.
	Checkpoints Checkpoints
	// PollInterval is the pause after a GetRecords call that returned no
	// record. Default 1s (Kinesis allows 5 calls a second per shard).
	PollInterval time.Duration
	// CheckpointInterval is how often the checkpoints that moved are
	// saved. Default 5s.
	CheckpointInterval time.Duration
	// ShardSyncInterval is how often the shard list is read again, to
	// find the children of a reshard. Default 30s.
	ShardSyncInterval time.Duration
	// Limit is the most records one GetRecords call asks for, at most
	// MaxPending. Default 100, or MaxPending when smaller.
	Limit int
	// ShutdownGrace is how long Run lets handlers in flight finish after
	// its context ended. Default 30s.
	ShutdownGrace time.Duration
}

// Consumer reads every shard of a stream and handles the records through
// an inbox.
type Consumer[TTx any] struct {
	kc  *kinesis.Client
	cfg Config
	log *slog.Logger
	eng *consumer.Engine[TTx]

	mu      sync.Mutex
	started bool
	shards  map[string]*shard
	stop    context.CancelFunc
	wg      sync.WaitGroup
}

// shard is the state of one shard. Guarded by Consumer.mu.
type shard struct {
	id      string
	parents []string
	started bool
	ended   bool // read to its end
	done    bool // ended and every record handled: checkpoint ShardEnd
	pending []*record
	next    string // the checkpoint to save; "" none
	saved   string
}

type record struct {
	seq  string
	done bool
}

// New returns a Consumer of cfg.Stream through kc that handles records with
// h through ib. It does no I/O.
func New[TTx any](kc *kinesis.Client, ib *inbox.Inbox[TTx], h consumer.Handler[TTx], cfg *Config) (*Consumer[TTx], error) {
	if kc == nil {
		return nil, errors.New("kinesisconsumer: Kinesis client is nil")
	}
	if ib == nil {
		return nil, errors.New("kinesisconsumer: inbox is nil")
	}
	if h == nil {
		return nil, errors.New("kinesisconsumer: handler is nil")
	}
	if cfg == nil || strings.TrimSpace(cfg.Stream) == "" {
		return nil, errors.New("kinesisconsumer: Config.Stream is empty: name the stream")
	}
	c := *cfg
	if c.Checkpoints == nil {
		return nil, errors.New("kinesisconsumer: Config.Checkpoints is nil: give a store for the shards' checkpoints")
	}
	for _, err := range []error{
		confval.PositiveOr("kinesisconsumer", "PollInterval", &c.PollInterval, DefaultPollInterval),
		confval.PositiveOr("kinesisconsumer", "CheckpointInterval", &c.CheckpointInterval, DefaultCheckpointInterval),
		confval.PositiveOr("kinesisconsumer", "ShardSyncInterval", &c.ShardSyncInterval, DefaultShardSyncInterval),
		confval.PositiveOr("kinesisconsumer", "ShutdownGrace", &c.ShutdownGrace, DefaultShutdownGrace),
	} {
		if err != nil {
			return nil, err
		}
	}
	c.Logger = confval.Logger(c.Logger)
	c.KeepAlive = 0 // Kinesis has no per-record timeout
	eng, err := consumer.New(ib, h, &c.Config)
	if err != nil {
		return nil, fmt.Errorf("kinesisconsumer: %w", err)
	}
	maxPending := eng.Config().MaxPending
	if c.Limit == 0 {
		c.Limit = min(DefaultLimit, maxPending)
	}
	if c.Limit < 0 || c.Limit > maxPending || c.Limit > 10000 {
		return nil, fmt.Errorf("kinesisconsumer: invalid Config.Limit %d: want 1 to MaxPending (%d), at most 10000", c.Limit, maxPending)
	}
	return &Consumer[TTx]{kc: kc, cfg: c, log: c.Logger.With("stream", c.Stream), eng: eng, shards: map[string]*shard{}}, nil
}

// Start reads the shard list (failing when the stream cannot be listed),
// then reads and handles records in the background, and returns. It fails
// if the Consumer was already started.
func (c *Consumer[TTx]) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started {
		return errors.New("kinesisconsumer: already started")
	}
	shards, err := c.listShards(ctx)
	if err != nil {
		return err
	}
	if err := c.eng.Start(ctx); err != nil {
		return fmt.Errorf("kinesisconsumer: %w", err)
	}
	c.started = true
	loopCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	c.stop = stop
	c.wg.Go(func() { c.sync(loopCtx, shards) })
	c.wg.Go(func() { c.checkpointer(loopCtx) })
	return nil
}

func (c *Consumer[TTx]) listShards(ctx context.Context) ([]types.Shard, error) {
	var out []types.Shard
	in := &kinesis.ListShardsInput{StreamName: aws.String(c.cfg.Stream)}
	for {
		res, err := c.kc.ListShards(ctx, in)
		if err != nil {
			return nil, fmt.Errorf("kinesisconsumer: list the shards of %s: %w", c.cfg.Stream, err)
		}
		out = append(out, res.Shards...)
		if res.NextToken == nil {
			return out, nil
		}
		in = &kinesis.ListShardsInput{NextToken: res.NextToken}
	}
}

// sync starts a reader for every shard whose parents are done, now and
// every ShardSyncInterval, until stopped.
func (c *Consumer[TTx]) sync(ctx context.Context, shards []types.Shard) {
	t := time.NewTicker(c.cfg.ShardSyncInterval)
	defer t.Stop()
	for {
		c.schedule(ctx, shards)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var err error
		if shards, err = c.listShards(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("kinesisconsumer: listing the shards failed; trying again", "err", err)
		}
	}
}

// schedule starts the readers of the shards that may start.
func (c *Consumer[TTx]) schedule(ctx context.Context, shards []types.Shard) {
	known := map[string]bool{}
	for _, s := range shards {
		known[aws.ToString(s.ShardId)] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range shards {
		id := aws.ToString(s.ShardId)
		sh, ok := c.shards[id]
		if !ok {
			sh = &shard{id: id}
			for _, p := range []*string{s.ParentShardId, s.AdjacentParentShardId} {
				if p != nil && known[*p] { // a parent past retention is gone: nothing to wait for
					sh.parents = append(sh.parents, *p)
				}
			}
			c.shards[id] = sh
		}
		if sh.started || sh.done {
			continue
		}
		ready := true
		for _, p := range sh.parents {
			if ps := c.shards[p]; ps == nil || !ps.done {
				ready = false
			}
		}
		if ready {
			sh.started = true
			c.wg.Go(func() { c.read(ctx, sh) })
		}
	}
}

// read reads one shard from its checkpoint until its end or the stop.
func (c *Consumer[TTx]) read(ctx context.Context, sh *shard) {
	log := c.log.With("shard", sh.id)
	failures := 0
	fail := func(what string, err error) bool {
		if ctx.Err() != nil {
			return false
		}
		failures++
		d := backoff.Delay(failures, 100*time.Millisecond, 10*time.Second)
		log.Warn("kinesisconsumer: "+what+" failed; trying again", "err", err, "retry_in", d)
		return sleep(ctx, d)
	}
	var iter *string
	for iter == nil {
		cp, err := c.cfg.Checkpoints.Get(ctx, c.cfg.Stream, sh.id)
		if err == nil && cp == ShardEnd {
			c.mu.Lock()
			sh.ended, sh.done, sh.saved = true, true, ShardEnd
			c.mu.Unlock()
			return
		}
		in := &kinesis.GetShardIteratorInput{StreamName: aws.String(c.cfg.Stream), ShardId: aws.String(sh.id), ShardIteratorType: types.ShardIteratorTypeTrimHorizon}
		if err == nil && cp != "" {
			in.ShardIteratorType, in.StartingSequenceNumber = types.ShardIteratorTypeAfterSequenceNumber, aws.String(cp)
			c.mu.Lock()
			sh.saved = cp
			c.mu.Unlock()
		}
		if err == nil {
			var res *kinesis.GetShardIteratorOutput
			if res, err = c.kc.GetShardIterator(ctx, in); err == nil {
				iter = res.ShardIterator
				break
			}
		}
		if !fail("getting the shard iterator", err) {
			return
		}
	}
	for ctx.Err() == nil {
		res, err := c.kc.GetRecords(ctx, &kinesis.GetRecordsInput{ShardIterator: iter, Limit: aws.Int32(int32(c.cfg.Limit))})
		if err != nil {
			var expired *types.ExpiredIteratorException
			if errors.As(err, &expired) {
				// Read again from the last record submitted.
				c.mu.Lock()
				after := sh.saved
				if n := len(sh.pending); n > 0 {
					after = sh.pending[n-1].seq
				}
				c.mu.Unlock()
				in := &kinesis.GetShardIteratorInput{StreamName: aws.String(c.cfg.Stream), ShardId: aws.String(sh.id), ShardIteratorType: types.ShardIteratorTypeTrimHorizon}
				if after != "" {
					in.ShardIteratorType, in.StartingSequenceNumber = types.ShardIteratorTypeAfterSequenceNumber, aws.String(after)
				}
				if r, err2 := c.kc.GetShardIterator(ctx, in); err2 == nil {
					iter = r.ShardIterator
					continue
				}
			}
			if !fail("reading records", err) {
				return
			}
			continue
		}
		failures = 0
		for _, r := range res.Records {
			d := c.delivery(sh, r)
			c.mu.Lock()
			sh.pending = append(sh.pending, d.rec)
			c.mu.Unlock()
			if err := c.eng.Submit(ctx, d); err != nil {
				return // stopping: not handled, not checkpointed
			}
		}
		if res.NextShardIterator == nil {
			c.mu.Lock()
			sh.ended = true
			c.advance(sh)
			c.mu.Unlock()
			log.Info("kinesisconsumer: read the shard to its end")
			return
		}
		iter = res.NextShardIterator
		if len(res.Records) == 0 && !sleep(ctx, c.cfg.PollInterval) {
			return
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// advance moves sh's checkpoint past its contiguous handled records, and
// marks it done when it ended and nothing is left. c.mu is held.
func (c *Consumer[TTx]) advance(sh *shard) {
	i := 0
	for ; i < len(sh.pending) && sh.pending[i].done; i++ {
		sh.next = sh.pending[i].seq
	}
	sh.pending = sh.pending[i:]
	if sh.ended && len(sh.pending) == 0 {
		sh.next = ShardEnd
	}
}

// checkpointer saves the checkpoints that moved every CheckpointInterval,
// and once more at stop.
func (c *Consumer[TTx]) checkpointer(ctx context.Context) {
	t := time.NewTicker(c.cfg.CheckpointInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := c.save(ctx); err != nil {
			c.log.Warn("kinesisconsumer: saving checkpoints failed; trying again", "err", err)
		}
	}
}

// save saves every checkpoint that moved; a shard saved as ShardEnd is
// done, and its children may start at the next sync.
func (c *Consumer[TTx]) save(ctx context.Context) error {
	c.mu.Lock()
	type cp struct {
		sh  *shard
		seq string
	}
	var todo []cp
	for _, sh := range c.shards {
		if sh.next != "" && sh.next != sh.saved {
			todo = append(todo, cp{sh, sh.next})
		}
	}
	c.mu.Unlock()
	var errs []error
	for _, p := range todo {
		if err := c.cfg.Checkpoints.Set(ctx, c.cfg.Stream, p.sh.id, p.seq); err != nil {
			errs = append(errs, fmt.Errorf("shard %s: %w", p.sh.id, err))
			continue
		}
		c.mu.Lock()
		p.sh.saved = p.seq
		if p.seq == ShardEnd {
			p.sh.done = true
		}
		c.mu.Unlock()
	}
	return errors.Join(errs...)
}

// Stop stops reading, lets the handlers in flight finish, saves the
// checkpoints, and returns when every goroutine has exited. If ctx ends
// first, the handlers in flight are cancelled (their records are read
// again after a restart). Stop is idempotent and safe when Start never ran.
func (c *Consumer[TTx]) Stop(ctx context.Context) error {
	c.mu.Lock()
	if !c.started {
		c.mu.Unlock()
		return nil
	}
	c.stop()
	c.mu.Unlock()
	c.wg.Wait()
	err := c.eng.Stop(ctx)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if serr := c.save(sctx); serr != nil {
		c.log.Warn("kinesisconsumer: saving checkpoints at stop failed; some records are read again after a restart (the inbox suppresses them)", "err", serr)
	}
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
	sh  *shard
	rec *record
	msg inbox.Message
	key string
}

func (c *Consumer[TTx]) delivery(sh *shard, r types.Record) *delivery {
	msg := envelope.Message(c.cfg.Stream, r.Data)
	msg.System = "aws_kinesis"
	if msg.AggregateID == "" {
		msg.AggregateID = aws.ToString(r.PartitionKey)
	}
	return &delivery{c: c, sh: sh, rec: &record{seq: aws.ToString(r.SequenceNumber)}, msg: msg,
		key: aws.ToString(r.PartitionKey)}
}

func (d *delivery) Message() inbox.Message { return d.msg }

func (d *delivery) Key() string { return d.key }

func (d *delivery) Attempts() int { return 0 }

// Ack marks the record handled; the checkpoint moves once every record
// before it in its shard is handled too.
func (d *delivery) Ack(context.Context) error {
	d.c.finish(d, true)
	return nil
}

// Release leaves the record unhandled: it holds its shard's checkpoint
// and is read again after a restart.
func (d *delivery) Release(time.Duration) error {
	d.c.finish(d, false)
	return nil
}

func (d *delivery) KeepAlive() error { return nil }

func (d *delivery) Abandoned() <-chan struct{} { return nil }

func (c *Consumer[TTx]) finish(d *delivery, handled bool) {
	if !handled {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	d.rec.done = true
	c.advance(d.sh)
}
