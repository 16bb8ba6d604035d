package relay_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/sink"
	"github.com/outboxkit/outbox/sink/natssink"
	"github.com/outboxkit/outbox/sink/stdoutsink"
)

// Rows written by plain SQL that cannot become the message their writer
// meant (an aggregate id that cannot be the key unchanged, a headers
// column that is not a JSON object of values) are dead-lettered at once
// with a cause that says so, on every sink; the others flow.
func TestRowsThatCannotBePublishedAsWrittenAreDeadLettered(t *testing.T) {
	t.Parallel()
	testenv.ForSources(t, testRowsThatCannotBePublishedAsWrittenAreDeadLettered)
}

func testRowsThatCannotBePublishedAsWrittenAreDeadLettered(t *testing.T, source string) {
	for _, name := range []string{"nats", "stdout"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnvFor(t, source)
			var out testenv.Buffer
			var wrap func(sink.Sink) sink.Sink
			if name == "stdout" {
				wrap = func(sink.Sink) sink.Sink { return stdoutsink.New(&out) }
			}
			e.start(t, wrap, relay.Config{})
			causes := map[string]string{
				"00000000-0000-7000-8000-000000000001": "the aggregate id is empty",
				"00000000-0000-7000-8000-000000000002": "the aggregate id contains a line break",
				"00000000-0000-7000-8000-000000000003": "the headers column holds a JSON array",
				"00000000-0000-7000-8000-000000000004": `header(s) ["tenant"] the value null`,
			}
			_, err := e.pool.Exec(context.Background(), `INSERT INTO `+e.table.Qualified("")+` (id, aggregatetype, aggregateid, type, payload, headers) VALUES
				('00000000-0000-7000-8000-000000000001', 'order', '', 'OrderPlaced', '{}', '{}'),
				('00000000-0000-7000-8000-000000000002', 'order', E'4\r\n2', 'OrderPlaced', '{}', '{}'),
				('00000000-0000-7000-8000-000000000003', 'order', '7', 'OrderPlaced', '{}', '[1, 2]'),
				('00000000-0000-7000-8000-000000000004', 'order', '8', 'OrderPlaced', '{}', '{"tenant": null}'),
				('00000000-0000-7000-8000-000000000005', 'order', '42', 'OrderPlaced', '{}', '{"tenant": "acme"}')`)
			if err != nil {
				t.Fatal(err)
			}
			for id, dl := range e.waitDeadLetters(t, len(causes)) {
				if want := causes[id]; want == "" || !strings.Contains(dl.lastErr, want) || dl.attempts != 1 {
					t.Errorf("dead letter %s: attempts %d, last_error %q; want 1 attempt (permanent) and a cause saying %q", id, dl.attempts, dl.lastErr, want)
				}
			}
			// The one good event arrived, its key the aggregate id.
			var keys []string
			if name == "nats" {
				for _, m := range testenv.StreamMessages(t, e.stream) {
					keys = append(keys, m.Header.Get(natssink.KeyHeader))
				}
			} else {
				for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
					var line struct{ Key string }
					if err := json.Unmarshal([]byte(l), &line); err != nil {
						t.Fatalf("stdout line %q: %v", l, err)
					}
					keys = append(keys, line.Key)
				}
			}
			if len(keys) != 1 || keys[0] != "42" {
				t.Fatalf("published keys %q, want only [\"42\"]", keys)
			}
		})
	}
}
