// Package runloop is the life cycle the adapters that receive in a loop of
// their own (natsconsumer, pubsubconsumer) share: Start once, a receive
// loop in one goroutine beside a consumer.Engine, Stop that ends both, Run
// until the context ends with a grace period, and the error that ended the
// loop by itself.
package runloop

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Engine is what Stop stops besides the loop: a *consumer.Engine.
type Engine interface {
	Stop(ctx context.Context) error
}

// Loop runs one receive loop. The zero value is not usable: use New.
type Loop struct {
	name string

	mu      sync.Mutex
	started bool
	eng     Engine
	stop    context.CancelFunc
	done    chan struct{}
	err     error
}

// New returns a Loop whose errors start with name ("natsconsumer").
func New(name string) *Loop { return &Loop{name: name} }

// Start calls begin, once (a second Start fails), with the Loop's lock
// held. begin checks what it must, starts the engine and returns it with
// the receive loop; receive then runs in a goroutine of its own, on a
// context that Stop cancels. The error receive returns (nil when it ended
// because of Stop) becomes Err's.
func (l *Loop) Start(ctx context.Context, begin func(ctx context.Context) (Engine, func(ctx context.Context) error, error)) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.started {
		return errors.New(l.name + ": already started")
	}
	eng, receive, err := begin(ctx)
	if err != nil {
		return err
	}
	l.started, l.eng = true, eng
	loopCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	l.stop, l.done = stop, make(chan struct{})
	go func() {
		defer close(l.done)
		if err := receive(loopCtx); err != nil {
			l.mu.Lock()
			l.err = err
			l.mu.Unlock()
		}
	}()
	return nil
}

// Stop ends the receive loop, stops the engine (ctx bounds how long its
// handlers in flight may take) and returns when the loop has exited.
// Stop is idempotent and safe when Start never ran.
func (l *Loop) Stop(ctx context.Context) error {
	l.mu.Lock()
	if !l.started {
		l.mu.Unlock()
		return nil
	}
	l.stop()
	done, eng := l.done, l.eng
	l.mu.Unlock()
	err := eng.Stop(ctx)
	<-done
	return err
}

// Run calls start, waits until ctx ends or the loop ends by itself, and
// stops, letting handlers in flight finish for at most grace. It returns
// the error that ended the loop, else Stop's.
func (l *Loop) Run(ctx context.Context, start func(ctx context.Context) error, grace time.Duration) error {
	if err := start(ctx); err != nil {
		return err
	}
	l.mu.Lock()
	done := l.done
	l.mu.Unlock()
	select {
	case <-ctx.Done():
	case <-done:
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	err := l.Stop(sctx)
	if e := l.Err(); e != nil {
		return e
	}
	return err
}

// Err returns the error that ended the receive loop by itself, or nil.
func (l *Loop) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}
