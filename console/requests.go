package console

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
)

// The requests: replays and repairs that one user proposes and another
// approves (docs/console.md, Requests).

// requestRoutes are the pages and API calls of requests.
func (s *Server) requestRoutes(html, api routeMaker) []route {
	const (
		approve, reject, cancel = "approve a request", "reject a request", "cancel a request"
		replay, repair          = "request a replay", "propose a repair"
	)
	return []route{
		html("GET", "/requests", s.requestsPage),
		html("GET", "/requests/{id}", s.requestPage),
		needs(ops.Approve, approve, html("POST", "/requests/{id}/approve", s.decidePage("approve"))),
		needs(ops.Approve, reject, html("POST", "/requests/{id}/reject", s.decidePage("reject"))),
		needs(ops.Act, cancel, html("POST", "/requests/{id}/cancel", s.decidePage("cancel"))),
		html("GET", "/replay", s.replayPage),
		needs(ops.Act, replay, html("POST", "/replay", s.replayCreatePage)),
		html("GET", "/dead-letters/{id}/repair", s.repairPage),
		needs(ops.Act, repair, html("POST", "/dead-letters/{id}/repair", s.repairCreatePage)),
		api("GET", "/api/v1/requests", s.requestsAPI),
		api("GET", "/api/v1/requests/{id}", s.requestAPI),
		api("GET", "/api/v1/replay/preview", s.previewAPI),
		needs(ops.Act, replay, api("POST", "/api/v1/requests/replay", s.replayAPI)),
		needs(ops.Act, repair, api("POST", "/api/v1/requests/repair", s.repairAPI)),
		needs(ops.Approve, approve, api("POST", "/api/v1/requests/{id}/approve", s.decideAPI("approve"))),
		needs(ops.Approve, reject, api("POST", "/api/v1/requests/{id}/reject", s.decideAPI("reject"))),
		needs(ops.Act, cancel, api("POST", "/api/v1/requests/{id}/cancel", s.decideAPI("cancel"))),
	}
}

// requestJSON is a request as the API and the pages show it: a repair's
// payloads masked.
type requestJSON struct {
	outboxdriver.Request
	Params any `json:"params"`
}

// requestView is what the page of a request shows.
type requestView struct {
	requestJSON
	Replay    *ops.ReplayParams
	Preview   *ops.ReplayPreview
	Repair    *repairView
	Percent   int
	Open      bool // pending, approved or executing: it can be cancelled
	Pending   bool
	Expired   bool
	MayAct    bool
	MayDecide bool
}

type repairView struct {
	EventID                 string
	Current, Proposed       string
	CurrentNote             string
	CurrentHdr, ProposedHdr map[string]string
	Gone                    bool
	// Changes is what the repair changes, when the dead letter is there.
	Changes []ops.Change
	More    int
}

func (s *Server) requestJSON(ctx context.Context, r outboxdriver.Request) requestJSON {
	js := requestJSON{Request: r}
	js.Params = json.RawMessage(r.Params)
	if r.Kind == outboxdriver.RequestRepair {
		var p ops.RepairParams
		if json.Unmarshal(r.Params, &p) == nil {
			m := map[string]any{"event_id": p.EventID}
			if p.Payload != nil {
				m["payload"] = s.ops.MaskJSON(ctx, p.Payload)
			}
			if p.Headers != nil {
				m["headers"] = p.Headers
			}
			js.Params = m
		}
	}
	return js
}

func (s *Server) requestsAPI(q *req) {
	state, limit, err := s.requestsQuery(q.r.URL.Query())
	if err != nil {
		q.failErr(err)
		return
	}
	rs, err := s.ops.Requests(q.ctx(), q.actor, state, limit)
	if err != nil {
		q.failErr(err)
		return
	}
	out := make([]requestJSON, len(rs))
	for i, r := range rs {
		out[i] = s.requestJSON(q.ctx(), r)
	}
	q.json(http.StatusOK, map[string]any{"requests": out})
}

func (s *Server) requestsQuery(v url.Values) (string, int, error) {
	if err := known(v, "state", "limit", "done"); err != nil {
		return "", 0, err
	}
	limit, err := parseLimit(v.Get("limit"), s.cfg.PageSize)
	return v.Get("state"), limit, err
}

func (s *Server) requestAPI(q *req) {
	r, err := s.ops.Request(q.ctx(), q.actor, q.r.PathValue("id"))
	if err != nil {
		q.failErr(err)
		return
	}
	q.json(http.StatusOK, s.requestJSON(q.ctx(), r))
}

// replayQuery reads a replay's selection from query parameters or a
// form.
func replayQuery(v url.Values, extra ...string) (ops.ReplayParams, error) {
	var p ops.ReplayParams
	if err := known(v, append([]string{"since", "until", "aggregatetype", "aggregateid", "type", "destination", "ids"}, extra...)...); err != nil {
		return p, err
	}
	var err error
	if p.Since, err = parseTime("since", v.Get("since")); err != nil {
		return p, err
	}
	if p.Until, err = parseTime("until", v.Get("until")); err != nil {
		return p, err
	}
	p.AggregateType, p.AggregateID, p.Type, p.Destination = v.Get("aggregatetype"), v.Get("aggregateid"), v.Get("type"), v.Get("destination")
	switch v.Get("ids") {
	case "", "original":
	case "new":
		p.NewIDs = true
	default:
		return p, &ops.InputError{Field: "ids", Reason: "original or new"}
	}
	return p, nil
}

func (s *Server) previewAPI(q *req) {
	p, err := replayQuery(q.r.URL.Query())
	if err != nil {
		q.failErr(err)
		return
	}
	pv, err := s.ops.PreviewReplay(q.ctx(), q.actor, p)
	if err != nil {
		q.failErr(err)
		return
	}
	q.json(http.StatusOK, pv)
}

// replayBody is the body of POST /api/v1/requests/replay.
type replayBody struct {
	ops.ReplayParams
	Reason string `json:"reason"`
}

func (s *Server) replayAPI(q *req) {
	var b replayBody
	if err := readJSON(q.r, &b); err != nil {
		q.failErr(err)
		return
	}
	q.created(s.ops.RequestReplay(q.ctx(), q.actor, b.ReplayParams, b.Reason))
}

// created answers a request just made, or the error that prevented it.
func (q *req) created(r outboxdriver.Request, err error) {
	if err != nil {
		q.failErr(err)
		return
	}
	q.json(http.StatusCreated, q.s.requestJSON(q.ctx(), r))
}

type repairBody struct {
	ops.RepairParams
	Reason string `json:"reason"`
}

func (s *Server) repairAPI(q *req) {
	var b repairBody
	if err := readJSON(q.r, &b); err != nil {
		q.failErr(err)
		return
	}
	q.created(s.ops.RequestRepair(q.ctx(), q.actor, b.RepairParams, b.Reason))
}

func (s *Server) decide(q *req, action, reason string) (outboxdriver.Request, error) {
	id := q.r.PathValue("id")
	switch action {
	case "approve":
		return s.ops.Approve(q.ctx(), q.actor, id, reason)
	case "reject":
		return s.ops.Reject(q.ctx(), q.actor, id, reason)
	default:
		return s.ops.Cancel(q.ctx(), q.actor, id, reason)
	}
}

func (s *Server) decideAPI(action string) func(*req) {
	return func(q *req) {
		var body struct {
			Reason string `json:"reason"`
		}
		if err := readJSON(q.r, &body); err != nil {
			q.failErr(err)
			return
		}
		r, err := s.decide(q, action, body.Reason)
		if err != nil {
			q.failErr(err)
			return
		}
		q.json(http.StatusOK, s.requestJSON(q.ctx(), r))
	}
}

// The pages.

type requestsView struct {
	State    string
	States   []string
	Requests []requestJSON
}

func (s *Server) requestsPage(q *req) {
	state, limit, err := s.requestsQuery(q.r.URL.Query())
	if err != nil {
		q.failErr(err)
		return
	}
	rs, err := s.ops.Requests(q.ctx(), q.actor, state, limit)
	if err != nil {
		q.failErr(err)
		return
	}
	v := requestsView{State: state, States: []string{outboxdriver.StatePending, outboxdriver.StateApproved, outboxdriver.StateExecuting,
		outboxdriver.StateDone, outboxdriver.StateFailed, outboxdriver.StateCancelled, outboxdriver.StateRejected, outboxdriver.StateExpired}}
	for _, r := range rs {
		v.Requests = append(v.Requests, s.requestJSON(q.ctx(), r))
	}
	q.render(http.StatusOK, "requests", "Requests", v)
}

func (s *Server) requestPage(q *req) {
	r, err := s.ops.Request(q.ctx(), q.actor, q.r.PathValue("id"))
	if err != nil {
		q.failErr(err)
		return
	}
	v := requestView{requestJSON: s.requestJSON(q.ctx(), r), MayAct: q.actor.Role.May(ops.Act), MayDecide: q.actor.Role.May(ops.Approve)}
	v.Pending = r.State == outboxdriver.StatePending
	v.Open = v.Pending || r.State == outboxdriver.StateApproved || r.State == outboxdriver.StateExecuting
	v.Expired = r.State == outboxdriver.StateExpired
	if r.Total != nil && *r.Total > 0 {
		v.Percent = int(r.Done * 100 / *r.Total)
	}
	switch r.Kind {
	case outboxdriver.RequestReplay:
		var p ops.ReplayParams
		if json.Unmarshal(r.Params, &p) == nil {
			v.Replay = &p
			if v.Pending {
				if pv, err := s.ops.PreviewReplay(q.ctx(), q.actor, p); err == nil {
					v.Preview = &pv
				}
			}
		}
	case outboxdriver.RequestRepair:
		var p ops.RepairParams
		if json.Unmarshal(r.Params, &p) == nil {
			rv := &repairView{EventID: p.EventID, ProposedHdr: p.Headers}
			if p.Payload != nil {
				rv.Proposed = s.ops.MaskJSON(q.ctx(), p.Payload)
			}
			if d, err := s.ops.DeadLetter(q.ctx(), q.actor, p.EventID); err == nil {
				rv.Current, rv.CurrentNote, rv.CurrentHdr = d.Payload, d.PayloadNote, d.Headers
			} else {
				rv.Gone = true
			}
			if diff, err := s.ops.DiffRepair(q.ctx(), q.actor, p); err == nil {
				rv.Changes, rv.More = diff.Changes, diff.More
				if p.Payload != nil {
					rv.Proposed = diff.Proposed // masked with the event's own paths
				}
			}
			v.Repair = rv
		}
	}
	q.render(http.StatusOK, "request", "Request "+r.ID, v)
}

func (s *Server) decidePage(action string) func(*req) {
	return func(q *req) {
		r, err := s.decide(q, action, q.formValue("reason"))
		if err != nil {
			q.failErr(err)
			return
		}
		http.Redirect(q.w, q.r, "/requests/"+r.ID+"?done="+map[string]string{"approve": "approved", "reject": "rejected", "cancel": "cancelled"}[action], http.StatusSeeOther)
	}
}

// replayView is the form of a new replay, with its preview.
type replayView struct {
	Filter  url.Values
	Preview *ops.ReplayPreview
	Error   string
	MayAct  bool
}

func (s *Server) replayPage(q *req) {
	v := replayView{Filter: q.r.URL.Query(), MayAct: q.actor.Role.May(ops.Act)}
	if v.Filter.Get("since") != "" {
		p, err := replayQuery(v.Filter)
		if err != nil {
			q.failErr(err)
			return
		}
		pv, err := s.ops.PreviewReplay(q.ctx(), q.actor, p)
		switch {
		case errors.Is(err, ops.ErrNoKeptRows):
			v.Error = err.Error()
		case err != nil:
			q.failErr(err)
			return
		default:
			v.Preview = &pv
		}
	}
	q.render(http.StatusOK, "replay", "Replay", v)
}

func (s *Server) replayCreatePage(q *req) {
	if err := q.r.ParseForm(); err != nil {
		q.fail(http.StatusBadRequest, "the form could not be read")
		return
	}
	p, err := replayQuery(q.r.PostForm, "csrf", "reason")
	if err != nil {
		q.failErr(err)
		return
	}
	r, err := s.ops.RequestReplay(q.ctx(), q.actor, p, q.formValue("reason"))
	if err != nil {
		q.failErr(err)
		return
	}
	http.Redirect(q.w, q.r, "/requests/"+r.ID+"?done=requested", http.StatusSeeOther)
}

func (s *Server) repairPage(q *req) {
	d, err := s.ops.DeadLetter(q.ctx(), q.actor, q.r.PathValue("id"))
	if err != nil {
		q.failErr(err)
		return
	}
	keys := make([]string, 0, len(d.Headers))
	for k := range d.Headers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var hdr strings.Builder
	for _, k := range keys {
		hdr.WriteString(k + ": " + d.Headers[k] + "\n")
	}
	q.render(http.StatusOK, "repair", "Repair "+d.ID, struct {
		ops.View
		HeaderText string
		MayAct     bool
		Max        int
	}{d, hdr.String(), q.actor.Role.May(ops.Act), maxBody})
}

func (s *Server) repairCreatePage(q *req) {
	p := ops.RepairParams{EventID: q.r.PathValue("id")}
	if pl := strings.TrimSpace(q.formValue("payload")); pl != "" {
		p.Payload = json.RawMessage(pl)
	}
	if q.formValue("change_headers") == "on" {
		p.Headers = map[string]string{}
		for i, line := range strings.Split(q.formValue("headers"), "\n") {
			line = strings.TrimRight(line, "\r")
			if strings.TrimSpace(line) == "" {
				continue
			}
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				q.failErr(&ops.InputError{Field: "headers", Reason: "line " + strconv.Itoa(i+1) + ": write name: value"})
				return
			}
			p.Headers[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	r, err := s.ops.RequestRepair(q.ctx(), q.actor, p, q.formValue("reason"))
	if err != nil {
		q.failErr(err)
		return
	}
	http.Redirect(q.w, q.r, "/requests/"+r.ID+"?done=requested", http.StatusSeeOther)
}

// requestErr answers the errors of requests; false when err is none of
// them.
func (q *req) requestErr(err error) bool {
	var self *ops.SelfApprovalError
	switch {
	case errors.As(err, &self):
		q.fail(http.StatusForbidden, self.Error())
	case errors.Is(err, ops.ErrNoRequest):
		q.fail(http.StatusNotFound, "no such request")
	case errors.Is(err, ops.ErrRequestState):
		q.fail(http.StatusConflict, err.Error())
	case errors.Is(err, ops.ErrNoKeptRows):
		q.fail(http.StatusConflict, err.Error())
	default:
		return false
	}
	return true
}

// untilNow is the default of a replay form's until field.
func untilNow() string { return time.Now().UTC().Format("2006-01-02T15:04") }
