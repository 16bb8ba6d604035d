package consumer

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/internal/backoff"
	"github.com/outboxkit/outbox/internal/confval"
	"github.com/outboxkit/outbox/internal/tracing"
	"github.com/outboxkit/outbox/sink"
)

// Defaults applied to zero Config fields.
const (
	// DefaultConcurrency is the default number of workers.
	DefaultConcurrency = 8
	// DefaultMaxAttempts is the default number of attempts before a
	// message is dead-lettered.
	DefaultMaxAttempts = 10
	// DefaultRetryBase is the default delay before the second attempt.
	DefaultRetryBase = time.Second
	// DefaultRetryMax is the default longest delay between attempts.
	DefaultRetryMax = time.Minute
	// DefaultMaxPending is the default bound on messages held at once.
	DefaultMaxPending = 256
	// DefaultRetryPoll is how often an Engine looks by default for dead
	// letters an operator marked for retry.
	DefaultRetryPoll = 5 * time.Second
)

// ErrStopped is returned by Submit once the Engine is stopping.
var ErrStopped = errors.New("consumer: stopped")

// Permanent marks err as permanent: handling this message again can never
// succeed (a payload that does not decode, a reference to something that
// will never exist). The Engine dead-letters a message whose handler
// returned a permanent error without further attempts. Permanent(nil) is
// nil. It is the relay's mark, [sink.Permanent]: an error marked with
// either is permanent to both.
func Permanent(err error) error { return sink.Permanent(err) }

// IsPermanent reports whether err, or an error it wraps, was marked
// Permanent (or with [sink.Permanent]) or wraps inbox.ErrInvalidMessage.
func IsPermanent(err error) bool {
	return sink.IsPermanent(err) || errors.Is(err, inbox.ErrInvalidMessage)
}

// Handler applies one message inside the inbox's transaction tx. It must
// not commit or roll back tx. Return an error wrapped with Permanent when
// the message can never be handled; any other error is retried.
type Handler[TTx any] func(ctx context.Context, tx TTx, msg inbox.Message) error

// Stage names a point in the life of a message, for Config.OnStage.
type Stage string

// Stages, in the order a message passes them.
const (
	// StageHandled: the transaction committed (or the inbox reported a
	// duplicate or a stale event); the message is not acknowledged yet.
	StageHandled Stage = "handled"
	// StageFailed: an attempt failed and its transaction rolled back.
	StageFailed Stage = "failed"
	// StageDeadLettered: the dead letter is recorded; the message is not
	// acknowledged yet.
	StageDeadLettered Stage = "dead-lettered"
	// StageAcked: the message was acknowledged (or the broker refused the
	// acknowledgement, which is logged; the inbox then suppresses the
	// redelivery).
	StageAcked Stage = "acked"
	// StageReleased: the message was handed back unacknowledged, at stop.
	StageReleased Stage = "released"
)

// Config configures an Engine. The zero value (or a nil *Config) is usable:
// every zero field takes its documented default.
type Config struct {
	// Concurrency is the number of workers; messages of one key always go
	// to the same worker. Default 8.
	Concurrency int
	// MaxAttempts is how many times a message is handled before it is
	// dead-lettered. A broker's earlier deliveries of the message count
	// (Delivery.Attempts), so a message that crashes its consumer process
	// again and again is dead-lettered too. Default 10.
	MaxAttempts int
	// RetryBase and RetryMax bound the exponential backoff, with jitter,
	// between attempts. Defaults 1s and 1m. With the defaults a message is
	// retried for about four minutes before it is dead-lettered: an outage
	// of the database longer than that dead-letters the messages that
	// failed during it (they are kept in the dead-letter table).
	RetryBase, RetryMax time.Duration
	// MaxPending is the most messages held at once: queued for a worker,
	// being handled or waiting for a retry. Submit blocks while it is
	// reached. Default 256.
	MaxPending int
	// KeepAlive is how often the broker is told that the messages held are
	// still being worked on (Delivery.KeepAlive). Zero never tells it;
	// adapters set it from the broker's redelivery timeout.
	KeepAlive time.Duration
	// Logger receives retries, dead letters and acknowledgement failures.
	// Default: warnings and errors as text on standard error. Payloads
	// are never logged.
	Logger *slog.Logger
	// OnStage, when set, is called at each stage of a message's life. It
	// must not block. Useful for tracing and fault injection.
	OnStage func(stage Stage, msg inbox.Message)
	// RetryPoll is how often the Engine looks for this consumer's dead
	// letters that an operator marked for retry (`outbox inbox dlq
	// retry`, the console): it claims them and handles each again like a
	// new delivery (MaxAttempts afresh); the dead letter is deleted once
	// the message was handled, or dead-lettered anew with its new error.
	// Default 5s; negative never looks.
	RetryPoll time.Duration
}

// normalize returns a copy of cfg with defaults applied.
func normalize(cfg *Config) (Config, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	for _, err := range []error{
		confval.PositiveOr("consumer", "Concurrency", &c.Concurrency, DefaultConcurrency),
		confval.PositiveOr("consumer", "MaxAttempts", &c.MaxAttempts, DefaultMaxAttempts),
		confval.PositiveOr("consumer", "MaxPending", &c.MaxPending, DefaultMaxPending),
		confval.PositiveOr("consumer", "RetryBase", &c.RetryBase, DefaultRetryBase),
		confval.PositiveOr("consumer", "RetryMax", &c.RetryMax, DefaultRetryMax),
	} {
		if err != nil {
			return c, err
		}
	}
	if c.RetryMax < c.RetryBase {
		return c, fmt.Errorf("consumer: Config.RetryMax %v is shorter than Config.RetryBase %v", c.RetryMax, c.RetryBase)
	}
	if c.RetryPoll == 0 {
		c.RetryPoll = DefaultRetryPoll
	}
	if c.KeepAlive < 0 {
		return c, fmt.Errorf("consumer: invalid Config.KeepAlive %v: must be positive (or 0 for none)", c.KeepAlive)
	}
	c.Logger = confval.Logger(c.Logger)
	return c, nil
}

// Delivery is one received message, as a broker adapter sees it.
type Delivery interface {
	// Message returns the message as the inbox reads it.
	Message() inbox.Message
	// Key is the ordering key: messages with equal keys are handled one at
	// a time in submission order. Usually the aggregate type and id.
	Key() string
	// Attempts is how many times the message was handled before this
	// delivery (JetStream: its delivery count minus one; 0 when unknown).
	Attempts() int
	// Ack acknowledges the message. The Engine calls it only after the
	// message's transaction committed, or after its dead letter was
	// recorded.
	Ack(ctx context.Context) error
	// Release hands the message back unacknowledged, to be delivered again
	// after delay (0: at once). The Engine calls it for a message it does
	// not finish because it is stopping or because Abandoned was closed.
	Release(delay time.Duration) error
	// KeepAlive tells the broker that the message is still being worked
	// on, so that it does not redeliver it yet.
	KeepAlive() error
	// Abandoned returns a channel closed when the message no longer
	// belongs to this consumer (its Kafka partition was revoked); the
	// Engine then releases it instead of starting another attempt. Nil
	// when that never happens.
	Abandoned() <-chan struct{}
}

// item is one submitted delivery.
type item struct {
	d   Delivery
	msg inbox.Message
}

// Engine handles submitted deliveries through an inbox: see the package
// documentation.
type Engine[TTx any] struct {
	ib  *inbox.Inbox[TTx]
	h   Handler[TTx]
	cfg Config
	log *slog.Logger
	sem chan struct{}

	mu       sync.Mutex
	started  bool
	stopped  bool
	lanes    []chan *item
	held     map[*item]struct{}
	stopping chan struct{} // closed by Stop
	work     context.Context
	cancel   context.CancelFunc // cancels work: handlers in flight
	done     chan struct{}      // closed when every goroutine has exited
}

// New returns an Engine that handles messages with h through ib. It does no
// I/O and starts nothing; call Start.
func New[TTx any](ib *inbox.Inbox[TTx], h Handler[TTx], cfg *Config) (*Engine[TTx], error) {
	if ib == nil {
		return nil, errors.New("consumer: inbox is nil")
	}
	if h == nil {
		return nil, errors.New("consumer: handler is nil")
	}
	c, err := normalize(cfg)
	if err != nil {
		return nil, err
	}
	return &Engine[TTx]{ib: ib, h: h, cfg: c, log: c.Logger.With("consumer", ib.Consumer()),
		sem: make(chan struct{}, c.MaxPending), held: map[*item]struct{}{}, stopping: make(chan struct{})}, nil
}

// Config returns the Engine's configuration with defaults applied.
func (e *Engine[TTx]) Config() Config { return e.cfg }

// Start starts the workers and returns at once. It fails if the Engine was
// already started.
func (e *Engine[TTx]) Start(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.started {
		return errors.New("consumer: already started")
	}
	e.started = true
	e.work, e.cancel = context.WithCancel(context.WithoutCancel(ctx))
	e.done = make(chan struct{})
	e.lanes = make([]chan *item, e.cfg.Concurrency)
	var wg sync.WaitGroup
	for i := range e.lanes {
		lane := make(chan *item, e.cfg.MaxPending)
		e.lanes[i] = lane
		wg.Go(func() {
			for it := range lane {
				e.process(it)
				e.mu.Lock()
				delete(e.held, it)
				e.mu.Unlock()
				<-e.sem
			}
		})
	}
	lanesDone := make(chan struct{})
	var keep, poll sync.WaitGroup
	if e.cfg.KeepAlive > 0 {
		keep.Go(func() { e.keepAlive(lanesDone) })
	}
	if e.cfg.RetryPoll > 0 {
		poll.Go(e.pollRetries)
	}
	go func() {
		poll.Wait()
		wg.Wait()
		close(lanesDone)
		keep.Wait()
		e.cancel()
		close(e.done)
	}()
	return nil
}

// Submit hands d to the worker of its key. It blocks while Config.MaxPending
// messages are held, and returns an error without taking d when ctx ends or
// the Engine is stopping (the caller then releases d itself). Once Submit
// returned nil, the Engine calls exactly one of d.Ack and d.Release.
func (e *Engine[TTx]) Submit(ctx context.Context, d Delivery) error {
	select {
	case e.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-e.stopping:
		return ErrStopped
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.started || e.stopped {
		<-e.sem
		if !e.started {
			return errors.New("consumer: Submit before Start")
		}
		return ErrStopped
	}
	it := &item{d: d, msg: d.Message()}
	e.held[it] = struct{}{}
	h := fnv.New32a()
	_, _ = h.Write([]byte(d.Key()))
	// The lane has room for MaxPending items and the semaphore admits no
	// more, so this send never blocks.
	e.lanes[h.Sum32()%uint32(len(e.lanes))] <- it
	return nil
}

// Stop stops taking messages, lets the handlers in flight finish and
// acknowledge, releases every message not finished, and returns when every
// goroutine has exited. If ctx ends first, handlers in flight are cancelled
// (their transactions roll back and their messages are released) and Stop
// still waits for them. Stop is idempotent and safe when Start never ran.
func (e *Engine[TTx]) Stop(ctx context.Context) error {
	e.mu.Lock()
	if !e.started {
		e.mu.Unlock()
		return nil
	}
	if !e.stopped {
		e.stopped = true
		close(e.stopping)
		for _, l := range e.lanes {
			close(l)
		}
	}
	done := e.done
	e.mu.Unlock()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		e.cancel()
		<-done
		return fmt.Errorf("consumer: stop: handlers in flight cancelled: %w", ctx.Err())
	}
}

func (e *Engine[TTx]) stage(s Stage, msg inbox.Message) {
	if e.cfg.OnStage != nil {
		e.cfg.OnStage(s, msg)
	}
}

// process handles one delivery to its end: Ack or Release.
func (e *Engine[TTx]) process(it *item) {
	d, msg := it.d, it.msg
	attempts := max(d.Attempts(), 0)
	for {
		if e.quit(d) {
			e.release(d, msg, 0)
			return
		}
		attempts++
		err := e.handle(msg)
		if err == nil {
			e.stage(StageHandled, msg)
			e.ack(d, msg)
			return
		}
		e.stage(StageFailed, msg)
		if e.work.Err() != nil {
			// Stop's deadline cancelled the handler: nothing committed.
			e.release(d, msg, 0)
			return
		}
		permanent := IsPermanent(err)
		if permanent || attempts >= e.cfg.MaxAttempts {
			cause := err
			if !permanent {
				cause = fmt.Errorf("gave up after %d attempts: %w", attempts, err)
			}
			if dlErr := e.ib.DeadLetter(e.work, msg, cause); dlErr != nil {
				e.log.Error("consumer: cannot record a dead letter; the message stays unacknowledged and is tried again",
					"event_id", msg.EventID, "destination", msg.Destination, "cause", cause, "err", dlErr, traceAttr(&msg))
			} else {
				e.log.Warn("consumer: message dead-lettered", "event_id", msg.EventID, "destination", msg.Destination,
					"attempts", attempts, "err", cause, traceAttr(&msg))
				e.stage(StageDeadLettered, msg)
				e.ack(d, msg)
				return
			}
		}
		delay := backoff.Delay(attempts, e.cfg.RetryBase, e.cfg.RetryMax)
		e.log.Warn("consumer: handler failed; retrying", "event_id", msg.EventID, "destination", msg.Destination,
			"attempt", attempts, "retry_in", delay, "err", err, traceAttr(&msg))
		if left, ok := e.wait(d, delay); !ok {
			e.release(d, msg, left)
			return
		}
	}
}

// handle runs one attempt. A panicking handler fails the attempt (its
// transaction rolls back) instead of the process.
func (e *Engine[TTx]) handle(msg inbox.Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("handler panicked: %v", p)
			e.log.Error("consumer: handler panicked", "event_id", msg.EventID, "panic", p, "stack", string(debug.Stack()), traceAttr(&msg))
		}
	}()
	_, err = e.ib.Handle(e.work, msg, func(ctx context.Context, tx TTx) error { return e.h(ctx, tx, msg) })
	return err
}

// quit reports whether the Engine is stopping or d was abandoned.
func (e *Engine[TTx]) quit(d Delivery) bool {
	select {
	case <-e.stopping:
		return true
	case <-d.Abandoned():
		return true
	default:
		return false
	}
}

// wait sleeps for delay; it returns false and what was left of delay when
// the Engine stops or d is abandoned first.
func (e *Engine[TTx]) wait(d Delivery, delay time.Duration) (time.Duration, bool) {
	end := time.Now().Add(delay)
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
		return 0, true
	case <-e.stopping:
	case <-d.Abandoned():
	}
	return max(time.Until(end), 0), false
}

func (e *Engine[TTx]) ack(d Delivery, msg inbox.Message) {
	// The acknowledgement is sent even while stopping: the transaction
	// committed, and a lost acknowledgement only costs a suppressed
	// duplicate.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(e.work), 30*time.Second)
	defer cancel()
	if err := d.Ack(ctx); err != nil {
		e.log.Warn("consumer: acknowledgement failed; the broker will redeliver the message and the inbox will suppress it",
			"event_id", msg.EventID, "err", err, traceAttr(&msg))
	}
	e.stage(StageAcked, msg)
}

func (e *Engine[TTx]) release(d Delivery, msg inbox.Message, delay time.Duration) {
	if err := d.Release(delay); err != nil {
		e.log.Warn("consumer: releasing an unfinished message failed; the broker redelivers it after its timeout",
			"event_id", msg.EventID, "err", err, traceAttr(&msg))
	}
	e.stage(StageReleased, msg)
}

// traceAttr is the trace_id attribute of a log line about msg, or none.
func traceAttr(msg *inbox.Message) slog.Attr { return tracing.LogAttr(msg.TraceID()) }

// keepAlive tells the broker every KeepAlive that the held messages are
// still being worked on, until the workers have exited.
func (e *Engine[TTx]) keepAlive(lanesDone <-chan struct{}) {
	t := time.NewTicker(e.cfg.KeepAlive)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-lanesDone:
			return
		}
		e.mu.Lock()
		ds := make([]Delivery, 0, len(e.held))
		for it := range e.held {
			ds = append(ds, it.d)
		}
		e.mu.Unlock()
		for _, d := range ds {
			if err := d.KeepAlive(); err != nil {
				e.log.Debug("consumer: keep-alive failed", "err", err)
			}
		}
	}
}

// pollRetries submits, every RetryPoll until the Engine stops, the dead
// letters an operator marked for retry.
func (e *Engine[TTx]) pollRetries() {
	t := time.NewTicker(e.cfg.RetryPoll)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-e.stopping:
			return
		}
		dls, err := e.ib.ClaimRetries(e.work, 100)
		if err != nil {
			e.log.Warn("consumer: cannot look for dead letters to retry", "err", err)
		}
		for i, dl := range dls {
			d := &retryDelivery[TTx]{e: e, dl: dl}
			e.log.Info("consumer: handling a dead letter again on request", "dead_letter", dl.ID, "event_id", dl.EventID)
			if err := e.Submit(e.work, d); err != nil {
				// Stopping: hand back what was claimed and not taken.
				for _, rest := range dls[i:] {
					(&retryDelivery[TTx]{e: e, dl: rest}).unclaim()
				}
				return
			}
		}
	}
}

// retryDelivery is a dead letter handed to the handler again.
type retryDelivery[TTx any] struct {
	e  *Engine[TTx]
	dl inbox.DeadLetter
}

func (d *retryDelivery[TTx]) Message() inbox.Message { return d.dl.Message() }

func (d *retryDelivery[TTx]) Key() string { return d.dl.AggregateType + "\x00" + d.dl.AggregateID }

func (d *retryDelivery[TTx]) Attempts() int { return 0 }

// Ack deletes the dead letter: its message was handled, or recorded as a
// new dead letter.
func (d *retryDelivery[TTx]) Ack(ctx context.Context) error {
	return d.e.ib.ResolveDeadLetter(ctx, d.dl.ID)
}

// Release marks the dead letter for retry again, for the next poll (here
// or in another instance).
func (d *retryDelivery[TTx]) Release(time.Duration) error { return d.unclaim() }

func (d *retryDelivery[TTx]) unclaim() error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(d.e.work), 30*time.Second)
	defer cancel()
	_, err := d.e.ib.RequestRetry(ctx, d.dl.ID)
	if err != nil {
		d.e.log.Warn("consumer: cannot mark a claimed dead letter for retry again; it stays a dead letter, unmarked",
			"dead_letter", d.dl.ID, "err", err)
	}
	return err
}

func (d *retryDelivery[TTx]) KeepAlive() error { return nil }

func (d *retryDelivery[TTx]) Abandoned() <-chan struct{} { return nil }
