package cdc_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/relay"
)

// The log-tailing source honours pauses as the polling one does (the
// relay engine does the honouring): events of a paused aggregate type
// wait while another type flows past them, and resume publishes them in
// order.
func TestCDCHonoursPause(t *testing.T) {
	t.Parallel()
	f := newCDC(t)
	f.setup()
	const poll = 200 * time.Millisecond
	f.relay(f.source("r1", nil), relay.Config{PollInterval: poll})
	f.streaming()
	ob := f.writer(modeTable)
	warm := cdcEvent("w", 0)
	f.write(ob, warm)
	f.waitFor(warm.ID)

	scope := outboxdriver.PauseScope{Kind: outboxdriver.PauseAggregateType, Value: "order"}
	by := outboxdriver.Acting{Name: "test", Role: "operator", Reason: "maintenance"}
	if ok, err := f.drv.SetPause(f.ctx, f.tb, scope, by); err != nil || !ok {
		t.Fatalf("pause: %v %v", ok, err)
	}
	// Every claim that starts a poll interval after the pause sees it;
	// events committed after that must wait.
	time.Sleep(poll + 50*time.Millisecond)
	var held []string
	for n := range 5 {
		e := cdcEvent("o1", n)
		held = append(held, e.ID)
		f.write(ob, e)
	}
	marker := outbox.Event{ID: uuid.NewString(), AggregateType: "invoice", AggregateID: "i1", Type: "Issued", Payload: []byte(`{}`)}
	f.write(ob, marker)
	got := f.waitFor(marker.ID) // the other type flows past the paused one
	for _, id := range held {
		if slices.Contains(got, id) {
			t.Fatalf("an event of the paused aggregate type was published: %s", id)
		}
	}
	if ok, err := f.drv.LiftPause(f.ctx, f.tb, scope, by); err != nil || !ok {
		t.Fatalf("resume: %v %v", ok, err)
	}
	got = f.waitFor(held...)
	var order []string
	for _, id := range got {
		if slices.Contains(held, id) {
			order = append(order, id)
		}
	}
	if fmt.Sprint(order) != fmt.Sprint(held) {
		t.Fatalf("after resume: %v, want %v (each once, in order)", order, held)
	}
}
