package testenv

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox/internal/testenv/await"
)

// JetStream connects to the test NATS server, closed when the test ends.
func JetStream(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(NATSURL(), nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("cannot reach NATS at %s (set %s to use another): %v; %s", NATSURL(), EnvNATS, err, NATSHelp)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// Stream creates a stream of its own for the test on subjects "<prefix>.>"
// and deletes it when the test ends. It returns the stream and the prefix.
func Stream(t testing.TB, js jetstream.JetStream) (jetstream.Stream, string) {
	t.Helper()
	prefix := Name("s")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: prefix, Subjects: []string{prefix + ".>"}, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatalf("create stream: %v; %s", err, NATSHelp)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, prefix)
	})
	return st, prefix
}

// StreamMessages returns every message in the stream, in stream order.
func StreamMessages(t testing.TB, st jetstream.Stream) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]*jetstream.RawStreamMsg, 0, info.State.Msgs)
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatalf("get message %d: %v", seq, err)
		}
		out = append(out, m)
	}
	return out
}

// WaitStreamMsgs waits until the stream holds at least n messages.
func WaitStreamMsgs(t testing.TB, st jetstream.Stream, n uint64, timeout time.Duration) {
	t.Helper()
	await.Eventually(t, timeout, func() error {
		info, err := st.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs < n {
			return fmt.Errorf("stream holds %d messages, want %d", info.State.Msgs, n)
		}
		return nil
	})
}
