package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"

	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
)

// The JSON shapes of the API; openapi.json describes them.

type overviewJSON struct {
	Table string `json:"table"`
	ops.StatusJSON
	BacklogByKind []backlogGroupJSON `json:"backlog_by_kind"`
	// BacklogByDestination is null when it was not counted; the note
	// says why (or what it leaves out).
	BacklogByDestination     []destinationJSON `json:"backlog_by_destination"`
	BacklogByDestinationNote string            `json:"backlog_by_destination_note,omitempty"`
	Relays                   []relayJSON       `json:"relays"`
}

type destinationJSON struct {
	ops.DestinationBacklog
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
}

type backlogGroupJSON struct {
	outboxdriver.KindBacklog
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
}

type relayJSON struct {
	outboxdriver.RelayStatus
	ExpiresInSeconds float64 `json:"expires_in_seconds"`
}

type deadLettersJSON struct {
	DeadLetters []outboxdriver.DeadLetter `json:"dead_letters"`
	// Next is the after parameter of the next page, null on the last.
	Next *string `json:"next"`
}

type auditJSON struct {
	Entries []outboxdriver.AuditRecord `json:"entries"`
	// NextBefore is the before parameter of the next page, null on the
	// last.
	NextBefore *int64 `json:"next_before"`
}

type actionJSON struct {
	ID     string `json:"id"`
	Action string `json:"action"`
}

func (s *Server) overviewAPI(q *req) {
	st, err := s.ops.Overview(q.ctx(), q.actor)
	if err != nil {
		q.failErr(err)
		return
	}
	in, err := s.ops.Insight(q.ctx(), q.actor, 0)
	if err != nil {
		q.failErr(err)
		return
	}
	js := overviewJSON{Table: st.Table.String(), StatusJSON: ops.NewStatusJSON(st),
		BacklogByKind: []backlogGroupJSON{}, Relays: []relayJSON{}}
	for _, g := range in.Backlog {
		js.BacklogByKind = append(js.BacklogByKind, backlogGroupJSON{g, g.OldestAge.Seconds()})
	}
	if in.Destinations != nil {
		js.BacklogByDestination = []destinationJSON{}
	}
	for _, d := range in.Destinations {
		js.BacklogByDestination = append(js.BacklogByDestination, destinationJSON{d, d.OldestAge.Seconds()})
	}
	js.BacklogByDestinationNote = in.DestinationsNote
	for _, r := range in.Relays {
		js.Relays = append(js.Relays, relayJSON{r, r.ExpiresIn.Seconds()})
	}
	q.json(http.StatusOK, js)
}

func (s *Server) deadLettersAPI(q *req) {
	dq, err := s.deadLetterQuery(q.r.URL.Query())
	if err != nil {
		q.failErr(err)
		return
	}
	pg, err := s.ops.DeadLetters(q.ctx(), q.actor, dq)
	if err != nil {
		q.failErr(err)
		return
	}
	js := deadLettersJSON{DeadLetters: pg.DeadLetters}
	if js.DeadLetters == nil {
		js.DeadLetters = []outboxdriver.DeadLetter{}
	}
	if pg.Next != nil {
		n := pg.Next.String()
		js.Next = &n
	}
	q.json(http.StatusOK, js)
}

func (s *Server) deadLetterAPI(q *req) {
	v, err := s.ops.DeadLetter(q.ctx(), q.actor, q.r.PathValue("id"))
	if err != nil {
		q.failErr(err)
		return
	}
	q.deadLetterJSON(v)
}

func (q *req) deadLetterJSON(v ops.View) {
	if v.Headers == nil {
		v.Headers = map[string]string{}
	}
	q.json(http.StatusOK, v) // ops.View: the same fields as outbox dlq show --json
}

// actAPI retries or discards one dead letter; the body, optional, is
// {"reason": "..."}.
func (s *Server) actAPI(action string) func(*req) {
	return func(q *req) {
		reason, ok := q.reason()
		if !ok {
			return
		}
		do := s.ops.Retry
		if action == "discard" {
			do = s.ops.Discard
		}
		id := q.r.PathValue("id")
		done, err := do(q.ctx(), q.actor, []string{id}, reason)
		if err == nil && len(done) == 0 {
			err = fmt.Errorf("dead letter %s: %w", id, outboxdriver.ErrNotFound)
		}
		if err != nil {
			q.failErr(err)
			return
		}
		q.json(http.StatusOK, actionJSON{ID: done[0], Action: action})
	}
}

func (s *Server) auditAPI(q *req) {
	aq, err := s.auditQuery(q.r.URL.Query())
	if err != nil {
		q.failErr(err)
		return
	}
	recs, err := s.ops.Audit(q.ctx(), q.actor, aq)
	if err != nil {
		q.failErr(err)
		return
	}
	js := auditJSON{Entries: recs}
	if js.Entries == nil {
		js.Entries = []outboxdriver.AuditRecord{}
	}
	if len(recs) == aq.Limit {
		js.NextBefore = &recs[len(recs)-1].ID
	}
	q.json(http.StatusOK, js)
}

// readJSON reads an optional JSON body into v: empty is fine, anything
// else must be JSON with known fields only.
func readJSON(r *http.Request, v any) error {
	b, err := io.ReadAll(r.Body)
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return &ops.InputError{Field: "body", Reason: fmt.Sprintf("larger than %d bytes", tooBig.Limit)}
	}
	if err != nil {
		return &ops.InputError{Field: "body", Reason: "could not be read"}
	}
	if len(b) == 0 {
		return nil
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		return &ops.InputError{Field: "body", Reason: "send Content-Type: application/json"}
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &ops.InputError{Field: "body", Reason: "not the JSON object this call takes: " + oneLine(err.Error(), 120)}
	}
	return nil
}
