// Command outbox migrates outbox tables, runs the relay that publishes their
// events to a broker, and reports their state.
//
//	outbox migrate --db postgres://localhost/app
//	outbox relay   --db postgres://localhost/app --sink nats://localhost:4222
//	outbox status  --db postgres://localhost/app --json
//
// OUTBOX_DB and OUTBOX_SINK stand in for --db and --sink.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRoot().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "outbox:", err)
		if ee, ok := errors.AsType[*exitError](err); ok {
			os.Exit(ee.code)
		}
		os.Exit(1)
	}
}
