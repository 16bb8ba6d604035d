package runloop_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outboxkit/outbox/inbox/internal/runloop"
)

type engine struct{ stopped int }

func (e *engine) Stop(context.Context) error { e.stopped++; return nil }

// A loop that ends by itself ends Run with its error, after the engine
// was stopped; a second Start is refused; Stop before Start does nothing.
func TestRunReturnsTheLoopsOwnError(t *testing.T) {
	l := runloop.New("test")
	if err := l.Stop(context.Background()); err != nil {
		t.Fatalf("Stop before Start: %v", err)
	}
	eng := &engine{}
	broke := errors.New("connection closed")
	start := func(ctx context.Context) error {
		return l.Start(ctx, func(context.Context) (runloop.Engine, func(context.Context) error, error) {
			return eng, func(context.Context) error { return broke }, nil
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := l.Run(ctx, start, time.Second); !errors.Is(err, broke) {
		t.Fatalf("Run = %v, want the loop's error", err)
	}
	if eng.stopped != 1 || !errors.Is(l.Err(), broke) {
		t.Fatalf("engine stopped %d times, Err %v; want once and the loop's error", eng.stopped, l.Err())
	}
	if err := start(ctx); err == nil || err.Error() != "test: already started" {
		t.Fatalf("second Start = %v", err)
	}
}

// Stop ends a loop that runs until its context ends, and Err stays nil.
func TestStopEndsTheLoop(t *testing.T) {
	l := runloop.New("test")
	eng := &engine{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	running := make(chan struct{})
	err := l.Start(ctx, func(context.Context) (runloop.Engine, func(context.Context) error, error) {
		return eng, func(ctx context.Context) error { close(running); <-ctx.Done(); return nil }, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	<-running
	if err := l.Stop(ctx); err != nil || eng.stopped != 1 || l.Err() != nil {
		t.Fatalf("Stop = %v, engine stopped %d, Err %v", err, eng.stopped, l.Err())
	}
}
