package redisconsumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/internal/backoff"
	"github.com/outboxkit/outbox/internal/confval"
)

// Defaults applied to zero Config fields.
const (
	// DefaultCount is the most entries one read asks for by default.
	DefaultCount = 100
	// DefaultBlock is how long one read waits for new entries by default.
	DefaultBlock = time.Second
	// DefaultClaimIdle is how long an entry stays pending with another
	// consumer before it is claimed, by default.
	DefaultClaimIdle = time.Minute
	// DefaultShutdownGrace is how long Run lets handlers in flight finish.
	DefaultShutdownGrace = 30 * time.Second
)

// Config configures a Consumer. Group and Streams are required.
type Config struct {
	// Config holds the concurrency, retry and dead-letter settings. Its
	// Logger defaults to warnings and errors as text on standard error.
	consumer.Config
	// Streams are the streams to read (their full names, prefix
	// included). Required.
	Streams []string
	// StreamPrefix is redissink's Config.StreamPrefix: it is cut from a
	// stream's name to give the message's destination. Default: none.
	StreamPrefix string
	// Group is the consumer group, created (from the start of each
	// stream, and the stream with it) at Start when missing unless
	// NoCreateGroup is set. Required; usually the inbox's consumer name.
	Group string
	// NoCreateGroup makes Start fail when the group does not exist
	// instead of creating it.
	NoCreateGroup bool
	// Consumer is this instance's name in the group. Default: the host
	// name and the process id. A stable name lets a restarted instance
	// resume its pending entries at once.
	Consumer string
	// Count is the most entries one read or claim asks for, at most
	// MaxPending. Default 100, or MaxPending when smaller.
	Count int
	// Block is how long one read waits for new entries; Stop waits for
	// the read in flight to end. Default 1s.
	Block time.Duration
	// ClaimIdle is how long an entry must have been pending with another
	// consumer before this one claims it. Default 1m.
	ClaimIdle time.Duration
	// ClaimInterval is how often pending entries are claimed. Default
	// ClaimIdle/2.
	ClaimInterval time.Duration
	// ShutdownGrace is how long Run lets handlers in flight finish after
	// its context ended. Default 30s.
	ShutdownGrace time.Duration
}

// Consumer reads streams as a member of a group and handles the entries
// through an inbox.
type Consumer[TTx any] struct {
	rdb redis.UniversalClient
	cfg Config
	log *slog.Logger
	eng *consumer.Engine[TTx]

	mu      sync.Mutex
	started bool
	stop    context.CancelFunc
	done    chan struct{}
}

// New returns a Consumer of cfg.Streams through rdb that handles entries
// with h through ib. It does no I/O; Start creates the group if needed.
// Stop does not close rdb. Give rdb a ReadTimeout longer than Config.Block
// (go-redis extends it for blocking reads by default).
func New[TTx any](rdb redis.UniversalClient, ib *inbox.Inbox[TTx], h consumer.Handler[TTx], cfg *Config) (*Consumer[TTx], error) {
	if rdb == nil {
		return nil, errors.New("redisconsumer: Redis client is nil")
	}
	if ib == nil {
		return nil, errors.New("redisconsumer: inbox is nil")
	}
	if h == nil {
		return nil, errors.New("redisconsumer: handler is nil")
	}
	if cfg == nil {
		return nil, errors.New("redisconsumer: config is nil: Streams and Group are required")
	}
	c := *cfg
	c.Streams = append([]string(nil), cfg.Streams...)
	if len(c.Streams) == 0 {
		return nil, errors.New("redisconsumer: no Config.Streams: name the streams to read")
	}
	for _, s := range c.Streams {
		if s == "" {
			return nil, errors.New("redisconsumer: an empty stream name in Config.Streams")
		}
	}
	if strings.TrimSpace(c.Group) == "" {
		return nil, errors.New("redisconsumer: Config.Group is empty: name the consumer group")
	}
	if c.Consumer == "" {
		host, _ := os.Hostname()
		c.Consumer = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	for _, err := range []error{
		confval.PositiveOr("redisconsumer", "Block", &c.Block, DefaultBlock),
		confval.PositiveOr("redisconsumer", "ClaimIdle", &c.ClaimIdle, DefaultClaimIdle),
		confval.PositiveOr("redisconsumer", "ClaimInterval", &c.ClaimInterval, c.ClaimIdle/2),
		confval.PositiveOr("redisconsumer", "ShutdownGrace", &c.ShutdownGrace, DefaultShutdownGrace),
	} {
		if err != nil {
			return nil, err
		}
	}
	if c.ClaimIdle < 3*time.Millisecond {
		return nil, fmt.Errorf("redisconsumer: invalid Config.ClaimIdle %v: want at least 3ms", c.ClaimIdle)
	}
	c.Logger = confval.Logger(c.Logger)
	if c.KeepAlive == 0 || c.KeepAlive > c.ClaimIdle/3 {
		c.KeepAlive = c.ClaimIdle / 3
	}
	eng, err := consumer.New(ib, h, &c.Config)
	if err != nil {
		return nil, fmt.Errorf("redisconsumer: %w", err)
	}
	maxPending := eng.Config().MaxPending
	if c.Count == 0 {
		c.Count = min(DefaultCount, maxPending)
	}
	if c.Count < 0 || c.Count > maxPending {
		return nil, fmt.Errorf("redisconsumer: invalid Config.Count %d: want 1 to MaxPending (%d)", c.Count, maxPending)
	}
	return &Consumer[TTx]{rdb: rdb, cfg: c, log: c.Logger.With("group", c.Group, "consumer_name", c.Consumer), eng: eng}, nil
}

// Start creates the group on every stream where it is missing (unless
// Config.NoCreateGroup), then reads and handles entries in the background,
// and returns. It fails if the Consumer was already started.
func (c *Consumer[TTx]) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started {
		return errors.New("redisconsumer: already started")
	}
	for _, s := range c.cfg.Streams {
		if err := c.ensureGroup(ctx, s); err != nil {
			return err
		}
	}
	if err := c.eng.Start(ctx); err != nil {
		return fmt.Errorf("redisconsumer: %w", err)
	}
	c.started = true
	loopCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	c.stop = stop
	c.done = make(chan struct{})
	go func() {
		defer close(c.done)
		c.loop(loopCtx)
	}()
	return nil
}

func (c *Consumer[TTx]) ensureGroup(ctx context.Context, stream string) error {
	groups, err := c.rdb.XInfoGroups(ctx, stream).Result()
	if err != nil && !isNoStream(err) {
		return fmt.Errorf("redisconsumer: XINFO GROUPS %s: %w", stream, err)
	}
	for _, g := range groups {
		if g.Name == c.cfg.Group {
			return nil
		}
	}
	if c.cfg.NoCreateGroup {
		return fmt.Errorf("redisconsumer: stream %q has no consumer group %q; create it (XGROUP CREATE %s %s 0 MKSTREAM) or leave Config.NoCreateGroup unset", stream, c.cfg.Group, stream, c.cfg.Group)
	}
	if err := c.rdb.XGroupCreateMkStream(ctx, stream, c.cfg.Group, "0").Err(); err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("redisconsumer: XGROUP CREATE %s %s: %w", stream, c.cfg.Group, err)
	}
	return nil
}

// isNoStream reports the error of XINFO on a key that does not exist.
func isNoStream(err error) bool {
	return err != nil && strings.Contains(err.Error(), "no such key")
}

// loop reads the own pending entries, then new ones, and claims idle ones,
// until stopped.
func (c *Consumer[TTx]) loop(ctx context.Context) {
	// The entries this name still holds from an earlier run, read once,
	// stream by stream, from a cursor that moves past each.
	own := map[string]string{}
	for _, st := range c.cfg.Streams {
		own[st] = "0"
	}
	lastClaim := time.Now()
	failures := 0
	for ctx.Err() == nil {
		var err error
		switch {
		case len(own) > 0:
			err = c.readOwn(ctx, own)
		case time.Since(lastClaim) >= c.cfg.ClaimInterval:
			err = c.claim(ctx)
			lastClaim = time.Now()
		default:
			err = c.read(ctx)
		}
		if err == nil || ctx.Err() != nil {
			failures = 0
			continue
		}
		failures++
		d := backoff.Delay(failures, 100*time.Millisecond, 10*time.Second)
		c.log.Warn("redisconsumer: reading failed; trying again", "err", err, "retry_in", d)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// readOwn reads the next entries this name holds pending on one stream of
// own, from its cursor, and submits them; a stream with none left leaves
// own.
func (c *Consumer[TTx]) readOwn(ctx context.Context, own map[string]string) error {
	for st, cursor := range own {
		res, err := c.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: c.cfg.Group, Consumer: c.cfg.Consumer,
			Count: int64(c.cfg.Count), Streams: []string{st, cursor}}).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("XREADGROUP %s %s: %w", st, cursor, err)
		}
		n := 0
		for _, r := range res {
			for _, m := range r.Messages {
				n++
				own[st] = m.ID
				c.submit(ctx, r.Stream, m, true)
			}
		}
		if n == 0 {
			delete(own, st)
		}
		return nil
	}
	return nil
}

// read reads new entries with XREADGROUP >, blocking up to Block, and
// submits them.
func (c *Consumer[TTx]) read(ctx context.Context) error {
	args := &redis.XReadGroupArgs{Group: c.cfg.Group, Consumer: c.cfg.Consumer, Count: int64(c.cfg.Count), Block: c.cfg.Block}
	args.Streams = append(args.Streams, c.cfg.Streams...)
	for range c.cfg.Streams {
		args.Streams = append(args.Streams, ">")
	}
	res, err := c.rdb.XReadGroup(ctx, args).Result()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("XREADGROUP: %w", err)
	}
	for _, st := range res {
		for _, m := range st.Messages {
			c.submit(ctx, st.Stream, m, false)
		}
	}
	return nil
}

// claim takes over the entries idle for ClaimIdle with other consumers.
func (c *Consumer[TTx]) claim(ctx context.Context) error {
	for _, s := range c.cfg.Streams {
		start := "0-0"
		for ctx.Err() == nil {
			msgs, next, deleted, err := c.rdb.XAutoClaimWithDeleted(ctx, &redis.XAutoClaimArgs{Stream: s, Group: c.cfg.Group,
				Consumer: c.cfg.Consumer, MinIdle: c.cfg.ClaimIdle, Start: start, Count: int64(c.cfg.Count)}).Result()
			if err != nil {
				return fmt.Errorf("XAUTOCLAIM %s: %w", s, err)
			}
			if len(deleted) > 0 {
				c.log.Warn("redisconsumer: pending entries were trimmed from the stream before they were handled", "stream", s, "ids", deleted)
			}
			if len(msgs) > 0 {
				c.log.Info("redisconsumer: claimed entries idle with another consumer", "stream", s, "count", len(msgs))
			}
			for _, m := range msgs {
				c.submit(ctx, s, m, true)
			}
			if next == "0-0" || next == "" {
				break
			}
			start = next
		}
	}
	return nil
}

// submit hands one entry to the engine; pending says it was delivered
// before, so its delivery count is looked up.
func (c *Consumer[TTx]) submit(ctx context.Context, stream string, m redis.XMessage, pending bool) {
	if m.Values == nil { // trimmed while pending: nothing left to handle
		c.log.Warn("redisconsumer: a pending entry was trimmed from the stream before it was handled; acknowledging it", "stream", stream, "entry", m.ID)
		_ = c.rdb.XAck(ctx, stream, c.cfg.Group, m.ID).Err()
		return
	}
	d := c.delivery(stream, m)
	if pending {
		if p, err := c.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: c.cfg.Group, Start: m.ID, End: m.ID, Count: 1}).Result(); err == nil && len(p) == 1 {
			d.attempts = int(max(p[0].RetryCount-1, 0))
		}
	}
	if err := c.eng.Submit(ctx, d); err != nil {
		// Stopping: the entry stays pending for this name.
		return
	}
}

// Stop stops reading, lets the handlers in flight finish and acknowledge,
// and returns when every goroutine has exited; the read in flight ends
// within Config.Block. Entries not finished stay pending (see the package
// documentation). If ctx ends first, the handlers in flight are cancelled.
// Stop is idempotent and safe when Start never ran.
func (c *Consumer[TTx]) Stop(ctx context.Context) error {
	c.mu.Lock()
	if !c.started {
		c.mu.Unlock()
		return nil
	}
	c.stop()
	done := c.done
	c.mu.Unlock()
	err := c.eng.Stop(ctx)
	<-done
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

// delivery adapts a stream entry to consumer.Delivery.
type delivery struct {
	rdb      redis.UniversalClient
	stream   string
	group    string
	consumer string
	id       string
	msg      inbox.Message
	key      string
	attempts int
}

func (c *Consumer[TTx]) delivery(stream string, m redis.XMessage) *delivery {
	str := func(k string) string {
		switch v := m.Values[k].(type) {
		case string:
			return v
		case nil:
			return ""
		default:
			return fmt.Sprint(v)
		}
	}
	hdr := map[string]string{}
	var multi map[string][]string
	if h := str("headers"); h != "" && json.Unmarshal([]byte(h), &multi) == nil {
		for k, vs := range multi {
			if len(vs) > 0 {
				hdr[k] = vs[0]
			}
		}
	}
	if id := str("id"); id != "" {
		hdr[inbox.HeaderID] = id
	}
	dest := strings.TrimPrefix(stream, c.cfg.StreamPrefix)
	msg := inbox.NewMessage(dest, []byte(str("key")), hdr, []byte(str("payload")))
	msg.Type = str("type")
	msg.System = "redis"
	return &delivery{rdb: c.rdb, stream: stream, group: c.cfg.Group, consumer: c.cfg.Consumer, id: m.ID, msg: msg,
		key: stream + "\x00" + msg.AggregateID}
}

func (d *delivery) Message() inbox.Message { return d.msg }

func (d *delivery) Key() string { return d.key }

func (d *delivery) Attempts() int { return d.attempts }

// Ack acknowledges the entry with XACK.
func (d *delivery) Ack(ctx context.Context) error {
	return d.rdb.XAck(ctx, d.stream, d.group, d.id).Err()
}

// Release leaves the entry pending: this name takes it back at its next
// start, another consumer claims it after ClaimIdle. Redis has no delay.
func (d *delivery) Release(time.Duration) error { return nil }

// KeepAlive resets the entry's idle time (XCLAIM to itself, JUSTID), so no
// other consumer claims it while it is worked on.
func (d *delivery) KeepAlive() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return d.rdb.XClaimJustID(ctx, &redis.XClaimArgs{Stream: d.stream, Group: d.group, Consumer: d.consumer,
		MinIdle: 0, Messages: []string{d.id}}).Err()
}

func (d *delivery) Abandoned() <-chan struct{} { return nil }
