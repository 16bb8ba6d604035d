package outbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/outboxkit/outbox"
)

// The aggregate id is the message key and reaches the broker unchanged, so
// WriteTx refuses one that cannot (a line break would become a space in a
// NATS header) before any SQL runs.
func TestWriteTxRefusesAnAggregateIDThatCannotBeTheKey(t *testing.T) {
	ob, err := outbox.New[struct{}](writerIn("main"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"", " ", "4\r\n2", "4\n2", "4\r2", "4\x002"} {
		e := outbox.Event{AggregateType: "order", AggregateID: id, Type: "OrderPlaced", Payload: []byte(`{}`)}
		if err := ob.WriteTx(context.Background(), struct{}{}, e); !errors.Is(err, outbox.ErrInvalidEvent) {
			t.Errorf("WriteTx with aggregate id %q: %v, want ErrInvalidEvent", id, err)
		}
	}
	ok := outbox.Event{AggregateType: "order", AggregateID: "order 42/a", Type: "OrderPlaced", Payload: []byte(`{}`)}
	if err := ob.WriteTx(context.Background(), struct{}{}, ok); err != nil {
		t.Fatalf("WriteTx with aggregate id %q: %v", ok.AggregateID, err)
	}
}
