package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/outboxkit/outbox/relay"
)

// faultEnv makes the relay kill itself with SIGKILL at a named stage, for
// crash testing: OUTBOX_FAULT=published:3 dies the third time a batch was
// acknowledged by the broker but not yet recorded. Stages: acquired,
// claimed, published, recorded.
const faultEnv = "OUTBOX_FAULT"

func faultFromEnv() (func(relay.Stage, int), error) {
	spec := os.Getenv(faultEnv)
	if spec == "" {
		return nil, nil
	}
	name, nth, ok := strings.Cut(spec, ":")
	n, err := strconv.Atoi(nth)
	stage := relay.Stage(name)
	switch stage {
	case relay.StageAcquired, relay.StageClaimed, relay.StagePublished, relay.StageRecorded:
	default:
		ok = false
	}
	if !ok || err != nil || n < 1 {
		return nil, fmt.Errorf("%s=%q: use STAGE:N with STAGE one of acquired, claimed, published, recorded and N >= 1", faultEnv, spec)
	}
	var seen atomic.Int64
	return func(s relay.Stage, _ int) {
		if s == stage && seen.Add(1) == int64(n) {
			fmt.Fprintf(os.Stderr, "outbox: %s: killing myself at %s #%d\n", faultEnv, s, n)
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // never return into the relay
		}
	}, nil
}
