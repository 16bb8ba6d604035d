package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/inbox/consumer"
	"github.com/outboxkit/outbox/internal/testenv"
)

// TestRetryRequestedDeadLetterReachesTheHandlerAgain: a message
// dead-lettered for a permanent error, once an operator marks it for
// retry, is claimed by the running Engine and handed to the handler again;
// handled, it leaves the dead-letter table and its event is recorded, so a
// later copy is a duplicate. A retry that fails again leaves one dead
// letter, with the new error.
func TestRetryRequestedDeadLetterReachesTheHandlerAgain(t *testing.T) {
	t.Parallel()
	ib := newInbox(t)
	var fix atomic.Int32 // 0: permanent error; 1: another permanent error; 2: handled
	var handled atomic.Int32
	h := func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		switch fix.Load() {
		case 0:
			return consumer.Permanent(errors.New("unknown customer"))
		case 1:
			return consumer.Permanent(errors.New("still unknown"))
		}
		handled.Add(1)
		return nil
	}
	e, err := consumer.New(ib, h, &consumer.Config{RetryPoll: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testenv.Context(t, 60*time.Second)
	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer e.Stop(ctx)
	d := newDelivery("a")
	d.msg.Headers = map[string]string{"id": d.msg.EventID}
	if err := e.Submit(ctx, d); err != nil {
		t.Fatal(err)
	}
	<-d.ended
	dls := waitDeadLetters(t, ctx, ib, 1, func(dl inbox.DeadLetter) bool { return dl.Error == "unknown customer" })
	first := dls[0]

	// Retried while the handler still fails: one dead letter, the new error.
	fix.Store(1)
	if got, err := ib.RequestRetry(ctx, first.ID); err != nil || len(got) != 1 {
		t.Fatalf("RequestRetry = %v, %v", got, err)
	}
	dls = waitDeadLetters(t, ctx, ib, 1, func(dl inbox.DeadLetter) bool { return dl.Error == "still unknown" })
	second := dls[0]
	if second.ID == first.ID || second.EventID != first.EventID || second.Headers["id"] != first.EventID || !second.RetryRequestedAt.IsZero() {
		t.Fatalf("after a failed retry: %+v; want a new dead letter of the same event, not marked", second)
	}

	// Retried once fixed: handled, no dead letter left.
	fix.Store(2)
	if _, err := ib.RequestRetry(ctx, second.ID); err != nil {
		t.Fatal(err)
	}
	waitDeadLetters(t, ctx, ib, 0, nil)
	if n := handled.Load(); n != 1 {
		t.Fatalf("handler applied the message %d times, want 1", n)
	}
	res, err := ib.Handle(ctx, d.msg, func(context.Context, pgx.Tx) error { return nil })
	if err != nil || !res.Duplicate {
		t.Fatalf("a later copy of the retried event: %+v, %v; want a duplicate", res, err)
	}
}

// waitDeadLetters polls until the consumer has n dead letters, each
// satisfying ok (when set).
func waitDeadLetters(t *testing.T, ctx context.Context, ib *inbox.Inbox[pgx.Tx], n int, ok func(inbox.DeadLetter) bool) []inbox.DeadLetter {
	t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for {
		dls, err := ib.DeadLetters(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		good := len(dls) == n
		for _, dl := range dls {
			good = good && (ok == nil || ok(dl))
		}
		if good {
			return dls
		}
		if time.Now().After(deadline) {
			t.Fatalf("dead letters %+v; want %d matching", dls, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
