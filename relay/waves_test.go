package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/outboxkit/outbox/outboxdriver"
	"github.com/outboxkit/outbox/sink"
)

// ids runs a plan to its end, advancing every aggregate of a wave except
// those whose event block names, and returns each wave's event ids.
func ids(recs []outboxdriver.Record, block ...string) [][]string {
	plan := newWaves(recs)
	var out [][]string
	for {
		wave := plan.next()
		if len(wave) == 0 {
			return out
		}
		var w []string
		for _, a := range wave {
			id := recs[a.at()].ID
			w = append(w, id)
			if slices.Contains(block, id) {
				a.block()
			} else {
				a.advance()
			}
		}
		out = append(out, w)
	}
}

func wantWaves(t *testing.T, got [][]string, want ...[]string) {
	t.Helper()
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("waves %v, want %v", got, want)
	}
}

// Wave k holds the k-th event of every aggregate, aggregates in the order
// of their first events.
func TestWavesTakeOneEventOfEachAggregateAtATime(t *testing.T) {
	got := ids(records("a1", "b1", "a2", "c1", "b2", "a3"))
	wantWaves(t, got, []string{"a1", "b1", "c1"}, []string{"a2", "b2"}, []string{"a3"})
}

// A blocked aggregate has no event in later waves; the others go on.
func TestWavesBlockedAggregateStops(t *testing.T) {
	got := ids(records("a1", "b1", "a2", "c1", "b2", "a3"), "a2")
	wantWaves(t, got, []string{"a1", "b1", "c1"}, []string{"a2", "b2"})
}

// An aggregate is its type and id together.
func TestWavesAggregateIsTypeAndID(t *testing.T) {
	recs := records("a1", "a2")
	recs[1].AggregateType = "invoice"
	wantWaves(t, ids(recs), []string{"a1", "a2"})
}

// An empty batch has no wave.
func TestWavesEmptyBatch(t *testing.T) {
	wantWaves(t, ids(nil))
}

// processBatch runs one batch of records through a relay whose sink fails the
// events fail names, and returns the waves the sink was given and the
// outcome recorded.
func processBatch(t *testing.T, policy Policy, recs []outboxdriver.Record, fail map[string]error) ([][]string, outboxdriver.Outcome) {
	t.Helper()
	src := &fakeSource{queue: [][]outboxdriver.Record{recs}}
	snk := &fakeSink{fail: fail}
	r, err := New(src, snk, &Config{Poison: policy, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	b, err := src.Claim(context.Background(), nil, len(recs))
	if err != nil {
		t.Fatal(err)
	}
	r.process(context.Background(), b, b.Records())
	if len(src.outcomes) != 1 {
		t.Fatalf("%d outcomes recorded, want 1", len(src.outcomes))
	}
	return snk.waves, src.outcomes[0]
}

func failures(out outboxdriver.Outcome) []string {
	var s []string
	for _, f := range out.Failed {
		s = append(s, fmt.Sprintf("%s dead-letter=%v hold=%v", f.ID, f.DeadLetter, f.Hold))
	}
	return s
}

// A failed event holds its aggregate's later events back for the rest of
// the batch (they are recorded neither way, so claimed again later),
// while other aggregates flow on.
func TestProcessFailedEventHoldsItsAggregateBack(t *testing.T) {
	recs := records("a1", "b1", "a2", "b2", "a3")
	waves, out := processBatch(t, Hold, recs, map[string]error{"a1": errors.New("nack")})
	wantWaves(t, waves, []string{"a1", "b1"}, []string{"b2"})
	if !slices.Equal(out.Published, []string{"b1", "b2"}) {
		t.Errorf("published %v, want [b1 b2]", out.Published)
	}
	if got := failures(out); !slices.Equal(got, []string{"a1 dead-letter=false hold=false"}) {
		t.Errorf("failed %v, want a1 to be retried", got)
	}
}

// Under the Continue policy, a dead-lettered event lets its aggregate's
// later events go out in the following waves; under Hold they stay back.
func TestProcessDeadLetterPolicy(t *testing.T) {
	recs := records("a1", "b1", "a2", "b2", "a3")
	fail := map[string]error{"a1": sink.Permanent(errors.New("too large"))}

	waves, out := processBatch(t, Continue, recs, fail)
	wantWaves(t, waves, []string{"a1", "b1"}, []string{"a2", "b2"}, []string{"a3"})
	if !slices.Equal(out.Published, []string{"b1", "a2", "b2", "a3"}) {
		t.Errorf("continue: published %v, want [b1 a2 b2 a3]", out.Published)
	}
	if got := failures(out); !slices.Equal(got, []string{"a1 dead-letter=true hold=false"}) {
		t.Errorf("continue: failed %v", got)
	}

	waves, out = processBatch(t, Hold, recs, fail)
	wantWaves(t, waves, []string{"a1", "b1"}, []string{"b2"})
	if !slices.Equal(out.Published, []string{"b1", "b2"}) {
		t.Errorf("hold: published %v, want [b1 b2]", out.Published)
	}
	if got := failures(out); !slices.Equal(got, []string{"a1 dead-letter=true hold=true"}) {
		t.Errorf("hold: failed %v", got)
	}
}
