package outboxdrivertest

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxdriver"
)

// testDuplicateID: the table refuses a second event with an id it holds,
// from WriteTx, Insert and plain SQL alike, naming the id and writing
// nothing of the refused call; two events of one call with one id are
// refused before any SQL runs; and an event whose id the dead letters
// hold already is never dropped on its way there: it stays in the table,
// its aggregate held, its error saying why.
func (s *suite) testDuplicateID(t *testing.T) {
	e := s.newEnv(t, 1)
	st := s.h.Store
	a0 := ev("a", 0)
	e.write(a0)

	// WriteTx: the id the table holds, beside a new event that must not
	// be written either.
	again, fresh := ev("b", 0), ev("b", 1)
	again.ID = a0.ID
	err := s.h.Write(e.ctx, e.table, true, fresh, again)
	var dup *outboxdriver.DuplicateIDError
	if !errors.Is(err, outbox.ErrDuplicateID) || !errors.As(err, &dup) {
		t.Fatalf("WriteTx of an id the table holds: %v; want an error wrapping outbox.ErrDuplicateID", err)
	}
	if dup.ID != a0.ID && !slices.Contains(dup.IDs, a0.ID) {
		t.Fatalf("WriteTx of an id the table holds: %+v names neither the id %s nor the ids of the write", dup, a0.ID)
	}
	if dup.ID == a0.ID && !strings.Contains(err.Error(), a0.ID) {
		t.Fatalf("error %q does not name the id %s", err, a0.ID)
	}
	// Insert (a statement of its own) of one row: the id is the row's.
	err = st.Insert(e.ctx, e.table, []outboxdriver.Row{{ID: a0.ID, AggregateType: "order", AggregateID: "c", Type: "Placed"}})
	if !errors.As(err, &dup) || dup.ID != a0.ID || !strings.Contains(err.Error(), a0.ID) {
		t.Fatalf("Insert of an id the table holds: %v; want a DuplicateIDError naming %s", err, a0.ID)
	}
	// Two events of one call with one id: refused before any SQL.
	c0, c1 := ev("c", 0), ev("c", 1)
	c1.ID = c0.ID
	if err := s.h.Write(e.ctx, e.table, true, c0, c1); !errors.Is(err, outbox.ErrInvalidEvent) || !errors.Is(err, outbox.ErrDuplicateID) {
		t.Fatalf("WriteTx of two events with one id: %v; want ErrInvalidEvent and ErrDuplicateID", err)
	}
	// Plain SQL, as a program without this module writes.
	if err := s.h.ExecInsert(e.ctx, e.table, a0.ID, "order", "d", "Placed", `{}`); err == nil {
		t.Fatal("a plain SQL INSERT of an id the table holds succeeded")
	}
	if st := e.status(); st.Backlog != 1 {
		t.Fatalf("backlog %d after the refused writes, want 1 (a/0 alone)", st.Backlog)
	}

	// a/0 goes to the dead letters; a second event with its id is then
	// written (the table no longer holds it) and fails for good too: it
	// must stay in the table, not vanish behind the first one's dead
	// letter.
	src := e.source(outboxdriver.SourceConfig{})
	leases := e.leaseAll(src)
	b := e.open(src, leases, 10)
	if got := b.Records(); !sameIDs(ids(got), []string{a0.ID}) {
		t.Fatalf("claimed %v, want a/0", describe(got))
	}
	e.finish(b, outboxdriver.Outcome{Failed: []outboxdriver.Failure{{ID: a0.ID, Err: errors.New("poison"), DeadLetter: true}}})
	second := ev("e", 0)
	second.ID = a0.ID
	e.write(second)
	b = e.open(src, leases, 10)
	if got := b.Records(); len(got) != 1 || got[0].ID != a0.ID || got[0].AggregateID != "e" {
		t.Fatalf("claimed %v, want the second event with a/0's id", describe(got))
	}
	e.finish(b, outboxdriver.Outcome{Failed: []outboxdriver.Failure{{ID: a0.ID, Err: errors.New("poison again"), DeadLetter: true, Hold: true}}})
	if st := e.status(); st.Backlog != 1 || st.DeadLetters != 1 {
		t.Fatalf("status %+v after dead-lettering an id the dead letters hold; want the event kept (backlog 1) beside the first dead letter", st)
	}
	d, err := st.DeadLetter(e.ctx, e.table, a0.ID)
	if err != nil || d.AggregateID != "a" {
		t.Fatalf("dead letter %s = %+v (err %v); want the first event's, a/0, unchanged", a0.ID, d, err)
	}
	held, err := st.HeldAggregates(e.ctx, e.table, 10)
	if err != nil {
		t.Fatalf("held aggregates: %v", err)
	}
	if len(held) != 1 || held[0].AggregateID != "e" || held[0].EventID != a0.ID || held[0].Reason != "retrying" ||
		!strings.Contains(held[0].LastError, "not dead-lettered") || !strings.Contains(held[0].LastError, "poison again") {
		t.Fatalf("held aggregates %+v; want e held behind its kept event, retrying, its error saying it was not dead-lettered and why it failed", held)
	}
}
