package console

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Pauses and held aggregates: pages and API.

type pausesJSON struct {
	Pauses []outboxdriver.Pause `json:"pauses"`
}

type pauseResultJSON struct {
	Scope   string `json:"scope"`
	Action  string `json:"action"`
	Changed bool   `json:"changed"`
}

type heldJSON struct {
	Held []outboxdriver.HeldAggregate `json:"held"`
}

type releaseJSON struct {
	outboxdriver.HeldAggregate
	Action string `json:"action"`
}

// errNotPaused answers a resume of a scope that is not paused.
var errNotPaused = fmt.Errorf("that scope is not paused: %w", outboxdriver.ErrNotFound)

// scopeOf reads the {scope} of a path: all, destination=X or
// aggregatetype=Y.
func scopeOf(q *req) (outboxdriver.PauseScope, error) {
	s, err := outboxdriver.ParsePauseScope(q.r.PathValue("scope"))
	if err != nil {
		return s, &ops.InputError{Field: "scope", Reason: err.Error()}
	}
	return s, nil
}

// pauses reads the pauses in force (parameters: none but also), or
// answers the error itself.
func (s *Server) pauses(q *req, also ...string) ([]outboxdriver.Pause, bool) {
	err := known(q.r.URL.Query(), also...)
	var ps []outboxdriver.Pause
	if err == nil {
		ps, err = s.ops.Pauses(q.ctx(), q.actor)
	}
	if err != nil {
		q.failErr(err)
		return nil, false
	}
	return ps, true
}

func (s *Server) pausesAPI(q *req) {
	ps, ok := s.pauses(q)
	if !ok {
		return
	}
	q.json(http.StatusOK, pausesJSON{Pauses: append([]outboxdriver.Pause{}, ps...)})
}

// pauseAPI pauses (pause true) or resumes the scope of the path; the
// body is {"reason": "..."}, required to pause.
func (s *Server) pauseAPI(pause bool) func(*req) {
	return func(q *req) {
		reason, ok := q.reason()
		if !ok {
			return
		}
		sc, err := scopeOf(q)
		if err != nil {
			q.failErr(err)
			return
		}
		changed, err := s.changePause(q, sc, reason, pause)
		if err != nil {
			q.failErr(err)
			return
		}
		action := map[bool]string{true: ops.ActionPause, false: ops.ActionResume}[pause]
		q.json(http.StatusOK, pauseResultJSON{Scope: sc.String(), Action: action, Changed: changed})
	}
}

// changePause pauses or resumes sc; resuming what is not paused is
// errNotPaused.
func (s *Server) changePause(q *req, sc outboxdriver.PauseScope, reason string, pause bool) (bool, error) {
	if pause {
		return s.ops.Pause(q.ctx(), q.actor, sc, reason)
	}
	changed, err := s.ops.Resume(q.ctx(), q.actor, sc, reason)
	if err == nil && !changed {
		err = errNotPaused
	}
	return changed, err
}

// list reads a list's limit (other parameters: none but also), calls
// read with it, and answers an error itself; a list is never null.
func list[T any](s *Server, q *req, read func(limit int) ([]T, error), also ...string) ([]T, bool) {
	v := q.r.URL.Query()
	limit, err := 0, known(v, append([]string{"limit", "done"}, also...)...)
	if err == nil {
		limit, err = parseLimit(v.Get("limit"), s.cfg.PageSize)
	}
	var xs []T
	if err == nil {
		xs, err = read(limit)
	}
	if err != nil {
		q.failErr(err)
		return nil, false
	}
	return append([]T{}, xs...), true
}

// held reads the held aggregates the request asks for.
func (s *Server) held(q *req) ([]outboxdriver.HeldAggregate, bool) {
	return list(s, q, func(limit int) ([]outboxdriver.HeldAggregate, error) { return s.ops.Held(q.ctx(), q.actor, limit) })
}

func (s *Server) heldAPI(q *req) {
	if hs, ok := s.held(q); ok {
		q.json(http.StatusOK, heldJSON{Held: hs})
	}
}

// releaseAPI releases the aggregate held behind the dead letter {id}; the
// body is {"reason": "..."}, required.
func (s *Server) releaseAPI(q *req) {
	reason, ok := q.reason()
	if !ok {
		return
	}
	h, err := s.ops.Release(q.ctx(), q.actor, q.r.PathValue("id"), reason)
	if err != nil {
		q.failErr(err)
		return
	}
	q.json(http.StatusOK, releaseJSON{HeldAggregate: h, Action: ops.ActionRelease})
}

// pausesView is what the pauses page shows.
type pausesView struct {
	Pauses []pauseRow
	Kinds  []outboxdriver.PauseKind
}

type pauseRow struct {
	outboxdriver.Pause
	Resume string // the path that resumes it
}

func (s *Server) pausesPage(q *req) {
	ps, ok := s.pauses(q, "done")
	if !ok {
		return
	}
	v := pausesView{Kinds: []outboxdriver.PauseKind{outboxdriver.PauseAggregateType, outboxdriver.PauseDestination, outboxdriver.PauseAll}}
	for _, p := range ps {
		v.Pauses = append(v.Pauses, pauseRow{p, "/pauses/" + url.PathEscape(p.PauseScope.String()) + "/resume"})
	}
	q.render(http.StatusOK, "pauses", "Pauses", v)
}

// pausePage pauses the scope of the form (fields kind and value).
func (s *Server) pausePage(q *req) {
	sc := outboxdriver.PauseScope{Kind: outboxdriver.PauseKind(q.formValue("kind")), Value: q.formValue("value")}
	if sc.Kind == outboxdriver.PauseAll {
		sc.Value = ""
	}
	if err := sc.Validate(); err != nil {
		q.failErr(&ops.InputError{Field: "scope", Reason: err.Error()})
		return
	}
	if _, err := s.changePause(q, sc, q.formValue("reason"), true); err != nil {
		q.failErr(err)
		return
	}
	http.Redirect(q.w, q.r, "/pauses?done=paused", http.StatusSeeOther)
}

// resumePage resumes the scope of the path.
func (s *Server) resumePage(q *req) {
	sc, err := scopeOf(q)
	if err == nil {
		_, err = s.changePause(q, sc, q.formValue("reason"), false)
	}
	if err != nil {
		q.failErr(err)
		return
	}
	http.Redirect(q.w, q.r, "/pauses?done=resumed", http.StatusSeeOther)
}

func (s *Server) heldPage(q *req) {
	if hs, ok := s.held(q); ok {
		q.render(http.StatusOK, "held", "Held aggregates", hs)
	}
}

func (s *Server) releasePage(q *req) {
	if _, err := s.ops.Release(q.ctx(), q.actor, q.r.PathValue("id"), q.formValue("reason")); err != nil {
		q.failErr(err)
		return
	}
	http.Redirect(q.w, q.r, "/held?done=released", http.StatusSeeOther)
}

// notFoundText says what was not found, for failErr.
func notFoundText(err error) string {
	switch {
	case errors.Is(err, errNotPaused):
		return "that scope is not paused (it may have been resumed meanwhile)"
	case errors.Is(err, ops.ErrNotHeld):
		return "that dead letter holds no aggregate (it may have been released, retried or discarded)"
	}
	return "no such dead letter (it may have been retried or discarded)"
}

// Failure groups: dead letters of one event type with one class of error.

type failureGroupsJSON struct {
	Groups []outboxdriver.FailureGroup `json:"groups"`
}

type groupActionJSON struct {
	Group  string   `json:"group"`
	Action string   `json:"action"`
	IDs    []string `json:"ids"`
	Count  int      `json:"count"`
}

func (s *Server) failureGroups(q *req) ([]outboxdriver.FailureGroup, bool) {
	return list(s, q, func(limit int) ([]outboxdriver.FailureGroup, error) {
		return s.ops.FailureGroups(q.ctx(), q.actor, limit)
	}, "n")
}

func (s *Server) failureGroupsAPI(q *req) {
	if gs, ok := s.failureGroups(q); ok {
		q.json(http.StatusOK, failureGroupsJSON{Groups: gs})
	}
}

func (s *Server) groupAct(q *req, action, reason string) ([]string, error) {
	do := s.ops.RetryGroup
	if action == "discard" {
		do = s.ops.DiscardGroup
	}
	return do(q.ctx(), q.actor, q.r.PathValue("group"), reason)
}

// groupActAPI retries or discards the dead letters of a failure group;
// the body, optional, is {"reason": "..."}.
func (s *Server) groupActAPI(action string) func(*req) {
	return func(q *req) {
		reason, ok := q.reason()
		if !ok {
			return
		}
		ids, err := s.groupAct(q, action, reason)
		if err != nil {
			q.failErr(err)
			return
		}
		q.json(http.StatusOK, groupActionJSON{Group: q.r.PathValue("group"), Action: action, IDs: ids, Count: len(ids)})
	}
}

func (s *Server) failureGroupsPage(q *req) {
	if gs, ok := s.failureGroups(q); ok {
		q.render(http.StatusOK, "failure_groups", "Failure groups", gs)
	}
}

func (s *Server) groupActPage(action string) func(*req) {
	return func(q *req) {
		ids, err := s.groupAct(q, action, q.formValue("reason"))
		if err != nil {
			q.failErr(err)
			return
		}
		done := map[string]string{"retry": "group-retried", "discard": "group-discarded"}[action]
		http.Redirect(q.w, q.r, fmt.Sprintf("/failure-groups?done=%s&n=%d", done, len(ids)), http.StatusSeeOther)
	}
}

// revealAPI shows a dead letter with one sensitive path revealed; the
// body is {"path": "...", "reason": "..."} (path may be left out when only
// one is configured). Audited before anything is shown.
func (s *Server) revealAPI(q *req) {
	var body struct {
		Path   string `json:"path"`
		Reason string `json:"reason"`
	}
	if err := readJSON(q.r, &body); err != nil {
		q.failErr(err)
		return
	}
	v, err := s.ops.Reveal(q.ctx(), q.actor, q.r.PathValue("id"), body.Path, body.Reason)
	if err != nil {
		q.failErr(err)
		return
	}
	q.deadLetterJSON(v)
}

// revealPage shows the dead letter's page with one sensitive path
// revealed (the form's path and reason). The page is not kept: reloading
// the dead letter masks it again.
func (s *Server) revealPage(q *req) {
	v, err := s.ops.Reveal(q.ctx(), q.actor, q.r.PathValue("id"), q.formValue("path"), q.formValue("reason"))
	if err != nil {
		q.failErr(err)
		return
	}
	q.render(http.StatusOK, "dead_letter", "Dead letter "+v.ID, v)
}

// reason reads the optional body {"reason": "..."} of an action, or
// answers the error itself.
func (q *req) reason() (string, bool) {
	var body struct {
		Reason string `json:"reason"`
	}
	if err := readJSON(q.r, &body); err != nil {
		q.failErr(err)
		return "", false
	}
	return body.Reason, true
}
