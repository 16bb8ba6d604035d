package cdc_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/sink"
)

// recordingSink records the value of every message it is asked to publish.
type recordingSink struct {
	sink.Sink
	mu   sync.Mutex
	seen []string
}

func (s *recordingSink) Publish(ctx context.Context, msgs []sink.Message) []error {
	s.mu.Lock()
	for _, m := range msgs {
		s.seen = append(s.seen, string(m.Value))
	}
	s.mu.Unlock()
	return s.Sink.Publish(ctx, msgs)
}

func (s *recordingSink) tries(value string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, v := range s.seen {
		if strings.Contains(v, value) {
			n++
		}
	}
	return n
}

// A message-mode event whose id the dead letters hold for another event
// (no table refuses a reused id in message mode) is not dropped on its way
// there: the first dead letter stays as it is, the relay logs the clash,
// and the event stays unconfirmed in the stream, so a relay started later
// reads it and tries it again.
func TestCDCReusedIDIsNotDroppedOnItsWayToTheDeadLetters(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	var logs testenv.Buffer
	f.log = slog.New(slog.NewTextHandler(io.MultiWriter(&logs, testLog{t}), &slog.HandlerOptions{Level: slog.LevelWarn}))
	f.setup()
	snk := &recordingSink{Sink: &faultySink{Sink: f.natsSink(), tried: map[string]bool{}}}
	start := func(name string) *relay.Relay {
		rl, err := relay.New(f.source(name, nil), snk, &relay.Config{Router: f.router(), Logger: f.log, LeaseTTL: time.Second,
			PollInterval: 100 * time.Millisecond, RetryBase: 10 * time.Millisecond, RetryMax: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if err := rl.Start(f.ctx); err != nil {
			t.Fatal(err)
		}
		return rl
	}
	rl := start("r1")
	f.streaming()
	id := uuid.NewString()
	first := outbox.Event{ID: id, AggregateType: "order", AggregateID: "p", Type: "T", Payload: []byte(`{"say": "poison first"}`)}
	second := outbox.Event{ID: id, AggregateType: "order", AggregateID: "q", Type: "T", Payload: []byte(`{"say": "poison second"}`)}
	later := outbox.Event{ID: uuid.NewString(), AggregateType: "order", AggregateID: "r", Type: "T", Payload: []byte(`{"say": "fine"}`)}
	message := f.writer(modeMessage)
	f.write(message, first)
	f.eventually("the first event is dead-lettered", func() bool { return f.count("_dead_letter") == 1 })
	f.write(message, second)
	f.write(message, later)
	f.waitFor(later.ID)
	f.eventually("the clash is logged", func() bool {
		return strings.Contains(logs.String(), "events not dead-lettered") && strings.Contains(logs.String(), id)
	})
	var agg string
	if err := f.pool.QueryRow(f.ctx, `SELECT aggregateid FROM `+pgx.Identifier{f.tb.Schema, f.tb.Name + "_dead_letter"}.Sanitize()+` WHERE id = $1`, id).Scan(&agg); err != nil || agg != "p" {
		t.Fatalf("the dead letter of %s is aggregate %q (%v), want the first event's, p", id, agg, err)
	}
	if n := f.count("_dead_letter"); n != 1 {
		t.Fatalf("%d dead letters, want the first event's alone", n)
	}
	tried := snk.tries("poison second")
	if err := rl.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	start("r2")
	f.eventually("a relay started later reads the kept event again", func() bool { return snk.tries("poison second") > tried })
}
