package pubsubsink

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/pstest"
	"go.uber.org/goleak"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/outboxkit/outbox/internal/faultproxy"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/sinktest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The OpenCensus stats worker the client imports starts at init.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"))
}

const project = "outbox-test"

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// failPublish is a pstest reactor that fails every Publish request with
// code while it is on.
type failPublish struct {
	on   atomic.Bool
	code codes.Code
}

func (f *failPublish) React(any) (bool, any, error) {
	if f.on.Load() {
		return true, nil, status.Error(f.code, "injected failure")
	}
	return false, nil, nil
}

// env is one test's Pub/Sub: a pstest server of its own, reached through a
// fault proxy, and a client connected to it.
type env struct {
	srv    *pstest.Server
	proxy  *faultproxy.Proxy
	client *pubsub.Client
	fail   *failPublish
}

func newEnv(t *testing.T) *env {
	t.Helper()
	fail := &failPublish{code: codes.FailedPrecondition}
	srv := pstest.NewServer(pstest.ServerReactorOption{FuncName: "Publish", Reactor: fail})
	t.Cleanup(func() { srv.Close() })
	proxy, err := faultproxy.Start(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	conn, err := grpc.NewClient(proxy.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client, err := pubsub.NewClient(context.Background(), project, option.WithGRPCConn(conn))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return &env{srv: srv, proxy: proxy, client: client, fail: fail}
}

// newSink returns a sink on e's client, closed when the test ends.
func (e *env) newSink(t *testing.T, cfg *Config) *Sink {
	t.Helper()
	if cfg == nil {
		cfg = &Config{CreateTopics: true, Timeout: 3 * time.Second}
	}
	cfg.Logger = quiet
	s, err := New(e.client, project, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// held returns what the server stores on topics, in publish order.
func (e *env) held(t *testing.T, topics []string) []sinktest.Received {
	t.Helper()
	want := map[string]bool{}
	for _, tp := range topics {
		want["projects/"+project+"/topics/"+tp] = true
	}
	var got []sinktest.Received
	for _, m := range e.srv.Messages() {
		if !want[m.Topic] {
			continue
		}
		got = append(got, received(t, m))
	}
	return got
}

// received decodes a stored message as the package doc describes.
func received(t *testing.T, m *pstest.Message) sinktest.Received {
	t.Helper()
	var repeated []string
	if v, ok := m.Attributes[RepeatedAttr]; ok {
		if err := json.Unmarshal([]byte(v), &repeated); err != nil {
			t.Errorf("attribute %s = %q: %v", RepeatedAttr, v, err)
		}
	}
	hs := map[string][]string{}
	for k, v := range m.Attributes {
		if k == RepeatedAttr {
			continue
		}
		hs[k] = []string{v}
	}
	for _, n := range repeated {
		var vs []string
		if err := json.Unmarshal([]byte(m.Attributes[n]), &vs); err != nil {
			t.Errorf("repeated attribute %s = %q: %v", n, m.Attributes[n], err)
		}
		hs[n] = vs
	}
	var key []byte
	if m.OrderingKey != "" {
		key = []byte(m.OrderingKey)
	}
	return sinktest.Received{
		ID: m.Attributes[IDAttr], Destination: strings.TrimPrefix(m.Topic, "projects/"+project+"/topics/"),
		Key: key, Value: m.Data, Headers: hs,
	}
}

// read waits up to 10s for want messages, then 200ms for no more.
func (e *env) read(t *testing.T, topics []string, want int) []sinktest.Received {
	t.Helper()
	// The suite judges what arrived.
	_ = await.Poll(10*time.Second, func() error {
		if n := len(e.held(t, topics)); n < want {
			return fmt.Errorf("%d of %d messages arrived", n, want)
		}
		return nil
	})
	time.Sleep(200 * time.Millisecond)
	return e.held(t, topics)
}

// TestConformance runs the sink conformance suite against a pstest server
// per test, behind a fault proxy that makes the outage.
func TestConformance(t *testing.T) {
	e := sinktest.PerTest(newEnv)
	sinktest.Run(t, sinktest.Harness{
		New:  func(t *testing.T) sink.Sink { return e(t).newSink(t, nil) },
		Dest: func(t *testing.T, name string) string { return "outbox." + name },
		Read: func(t *testing.T, dests []string, want int) []sinktest.Received {
			return e(t).read(t, dests, want)
		},
		DedupeKey: false, // Pub/Sub does not de-duplicate on publish
		KeyHeader: "",    // the ordering key is the key
		TooLarge: func(t *testing.T, dest string) *sink.Message {
			return &sink.Message{Destination: dest, Key: []byte("k"), Value: make([]byte, pubsub.MaxPublishRequestBytes)}
		},
		Outage: func(t *testing.T) func() {
			p := e(t).proxy
			p.Cut()
			return p.Restore
		},
	})
}
