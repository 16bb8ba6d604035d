package cdc

import (
	"errors"
	"reflect"
	"testing"
	"time"
)

// A streamed transaction's events come back from its spill file as they
// went in: every field the queue and the publish use, a delayed event's
// deliver_at included (without it, a delayed event of a large
// transaction was published at once), and none of a rolled-back
// subtransaction.
func TestSpillKeepsEveryEventField(t *testing.T) {
	sp, err := newSpill(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer sp.close()
	commit := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	due := commit.Add(time.Hour)
	in := []*event{
		{row: true, Seq: 7, CreatedAt: commit.Add(-time.Second), deliverAt: due},
		{row: true, Seq: 8}, // no created_at: the commit time on replay
		{orphan: true, Seq: 9, bad: errors.New("the message is not an event")},
		{row: true, Seq: 10}, // of a subtransaction rolled back below
	}
	in[0].ID, in[0].AggregateType, in[0].AggregateID, in[0].Type = "e1", "order", "42", "Placed"
	in[0].Payload, in[0].HeadersJSON, in[0].TraceContext = []byte(`{"n":1}`), []byte(`{"k":"v"}`), "00-abc-def-01"
	in[1].ID, in[1].AggregateType, in[1].AggregateID, in[1].Type, in[1].RawPayload = "e2", "order", "42", "Paid", []byte{0, 1, 2}
	in[2].ID = "e3"
	in[3].ID = "e4"
	for i, e := range in {
		xid := uint32(100)
		if i == 3 {
			xid = 101
		}
		if err := sp.add(xid, e); err != nil {
			t.Fatal(err)
		}
	}
	sp.aborted[101] = true
	var out []*event
	if err := sp.replay(commit, func(e *event) error { out = append(out, e); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(out) != 3 {
		t.Fatalf("replayed %d events, want 3 (the rolled-back one left out)", len(out))
	}
	in[1].CreatedAt, in[2].CreatedAt = commit, commit // none stored: the commit time
	for i, got := range out {
		want := in[i]
		if got.bad != nil && want.bad != nil && got.bad.Error() == want.bad.Error() {
			got.bad = want.bad
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("event %d replayed as\n%+v\nwant\n%+v", i, got, want)
		}
	}
	if !out[0].deliverAt.Equal(due) {
		t.Fatalf("the delayed event's deliver_at replayed as %v, want %v", out[0].deliverAt, due)
	}
}
