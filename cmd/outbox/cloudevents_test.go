package main

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
)

// received is one message as a broker delivered it.
type received struct {
	headers map[string]string
	value   []byte
	event   *event.Event // parsed by the SDK (webhooks)
}

// parseCloudEvent reads a CloudEvent from a message the way the SDK's
// protocol bindings do: a structured one by the SDK's JSON format, a
// binary one by the SDK's attribute table for the binding's prefix.
func parseCloudEvent(t *testing.T, prefix string, m received) *event.Event {
	t.Helper()
	if m.event != nil {
		return m.event
	}
	if strings.HasPrefix(m.headers["content-type"], "application/cloudevents+json") {
		var e event.Event
		if err := json.Unmarshal(m.value, &e); err != nil {
			t.Fatalf("structured event %s: %v", m.value, err)
		}
		return &e
	}
	vs := spec.WithPrefix(prefix)
	v := vs.Version(m.headers[vs.PrefixedSpecVersionName()])
	if v == nil {
		t.Fatalf("binary event: no %s header in %v", vs.PrefixedSpecVersionName(), m.headers)
	}
	e := event.New(v.String())
	for k, val := range m.headers {
		if err := v.SetAttribute(e.Context, k, val); err != nil {
			t.Fatalf("header %s=%q: %v", k, val, err)
		}
	}
	if ct := m.headers["content-type"]; ct != "" {
		e.SetDataContentType(ct)
	}
	e.DataEncoded = m.value
	return &e
}

// The relay publishes CloudEvents 1.0 in both modes to NATS, Kafka and
// webhooks, every attribute where the binding puts it, parsed back by the
// SDK: id, source, type, subject, time, datacontenttype, dataschema (from
// the contract), the trace context and the event version.
func TestCloudEventsOnNATSKafkaAndWebhooks(t *testing.T) {
	t.Parallel()
	const (
		id          = "00000000-0000-7000-8000-0000000000ce"
		traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		payload     = `{"orderId": 7, "total": 5, "currency": "EUR"}`
	)
	for _, sinkName := range []string{"nats", "kafka", "webhook"} {
		for _, mode := range []string{"binary", "structured"} {
			t.Run(sinkName+"/"+mode, func(t *testing.T) {
				t.Parallel()
				tb, flags := migrated(t)
				ctx := testenv.Context(t, 2*time.Minute)
				var (
					sinkFlags []string
					prefix    = "ce-"
					collect   func() received
				)
				switch sinkName {
				case "nats":
					st, f := natsTarget(t)
					sinkFlags = f
					collect = func() received {
						testenv.WaitStreamMsgs(t, st, 1, 30*time.Second)
						m := testenv.StreamMessages(t, st)[0]
						h := map[string]string{}
						for k := range m.Header {
							h[strings.ToLower(k)] = m.Header.Get(k)
						}
						return received{headers: h, value: m.Data}
					}
				case "kafka":
					prefix = "ce_"
					cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(cluster.Close)
					sinkFlags = []string{"--sink", "kafka://" + strings.Join(cluster.ListenAddrs(), ",")}
					collect = func() received {
						cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("outbox.event.order"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
						if err != nil {
							t.Fatal(err)
						}
						defer cl.Close()
						for {
							fs := cl.PollFetches(ctx)
							if ctx.Err() != nil {
								t.Fatal("no Kafka record")
							}
							var got *received
							fs.EachRecord(func(r *kgo.Record) {
								h := map[string]string{}
								for _, hd := range r.Headers {
									h[hd.Key] = string(hd.Value)
								}
								got = &received{headers: h, value: r.Value}
							})
							if got != nil {
								return *got
							}
						}
					}
				case "webhook":
					var mu sync.Mutex
					var got []received
					srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						e, err := cehttp.NewEventFromHTTPRequest(r)
						if err != nil {
							body, _ := io.ReadAll(r.Body)
							t.Errorf("the SDK cannot read the request: %v (headers %v, body %s)", err, r.Header, body)
							w.WriteHeader(http.StatusBadRequest)
							return
						}
						mu.Lock()
						got = append(got, received{event: e})
						mu.Unlock()
						w.WriteHeader(http.StatusNoContent)
					}))
					t.Cleanup(srv.Close)
					sinkFlags = []string{"--sink", srv.URL + "/hooks/${destination}", "--webhook-allow-private", "--webhook-secret", "whsec_" + base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))}
					collect = func() received {
						await.Eventually(t, 30*time.Second, func() error {
							mu.Lock()
							defer mu.Unlock()
							if len(got) == 0 {
								return errors.New("no webhook request")
							}
							return nil
						})
						mu.Lock()
						defer mu.Unlock()
						return got[0]
					}
				}
				pool := testenv.Pool(t)
				if _, err := pool.Exec(ctx, `INSERT INTO `+tb.Qualified("")+` (id, aggregatetype, aggregateid, type, payload, headers, tracingspancontext)
					VALUES ($1, 'order', '7', 'OrderPlaced', $2, '{"eventVersion": "2"}', $3)`, id, payload, "traceparent="+traceparent); err != nil {
					t.Fatal(err)
				}
				var created time.Time
				if err := pool.QueryRow(ctx, `SELECT created_at FROM `+tb.Qualified("")+` WHERE id = $1`, id).Scan(&created); err != nil {
					t.Fatal(err)
				}
				startRelay(t, append(append(flags, sinkFlags...), "--cloudevents", mode, "--cloudevents-source", "/orders-service", "--contracts", registryDir)...)
				m := collect()
				e := parseCloudEvent(t, prefix, m)
				if err := e.Validate(); err != nil {
					t.Fatalf("not a valid CloudEvent: %v (%v)", err, e)
				}
				ds := ""
				if e.DataSchema() != "" {
					ds = e.DataSchema()
				}
				got := map[string]string{
					"specversion": e.SpecVersion(), "id": e.ID(), "source": e.Source(), "type": e.Type(), "subject": e.Subject(),
					"datacontenttype": e.DataContentType(), "dataschema": ds,
					"traceparent": str(e.Extensions()["traceparent"]), "eventversion": str(e.Extensions()["eventversion"]),
				}
				want := map[string]string{
					"specversion": "1.0", "id": id, "source": "/orders-service", "type": "OrderPlaced", "subject": "7",
					"datacontenttype": "application/json", "dataschema": "https://schemas.example.com/order/OrderPlaced/2",
					"traceparent": traceparent, "eventversion": "2",
				}
				for k, w := range want {
					if got[k] != w {
						t.Errorf("%s = %q, want %q", k, got[k], w)
					}
				}
				if !e.Time().Equal(created) {
					t.Errorf("time %s, want the row's created_at %s", e.Time(), created)
				}
				var data, wantData any
				if err := json.Unmarshal(e.Data(), &data); err != nil {
					t.Fatalf("data %q: %v", e.Data(), err)
				}
				_ = json.Unmarshal([]byte(payload), &wantData)
				if b1, b2 := jsonText(data), jsonText(wantData); b1 != b2 {
					t.Errorf("data %s, want %s", b1, b2)
				}
			})
		}
	}
}

func str(v any) string {
	if v == nil {
		return ""
	}
	s, _ := v.(string)
	return s
}

func jsonText(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
