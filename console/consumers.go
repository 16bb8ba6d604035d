package console

import (
	"fmt"
	"net/http"
	"net/url"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
)

// The consumers page: one consumer's inbox figures and dead letters
// (Config.Inbox), with the outbox pages' roles, CSRF and audit.

const (
	opInboxRetry   = "retry a consumer's dead letters"
	opInboxDiscard = "discard a consumer's dead letters"
)

// consumersView is what the consumers page shows.
type consumersView struct {
	Configured  bool
	Table       string
	Consumer    string
	Stats       inbox.Stats
	DeadLetters []inbox.DeadLetter
}

// consumerDeadLetterView is what a consumer's dead letter page shows.
type consumerDeadLetterView struct {
	ops.InboxView
	Path string // the dead letter's page, escaped
}

func (s *Server) consumerRoutes(html routeMaker) []route {
	return []route{
		html("GET", "/consumers", s.consumersPage),
		html("GET", "/consumers/{consumer}/dead-letters/{id}", s.consumerDeadLetterPage),
		needs(ops.Act, opInboxRetry, html("POST", "/consumers/{consumer}/dead-letters/{id}/retry", s.consumerActPage("retry"))),
		needs(ops.Act, opInboxDiscard, html("POST", "/consumers/{consumer}/dead-letters/{id}/discard", s.consumerActPage("discard"))),
	}
}

// consumerPath is the escaped path of consumer's dead letter id, or of
// the consumer's page when id is 0.
func consumerPath(consumer string, id int64) string {
	if id == 0 {
		return "/consumers?consumer=" + url.QueryEscape(consumer)
	}
	return fmt.Sprintf("/consumers/%s/dead-letters/%d", url.PathEscape(consumer), id)
}

func (s *Server) consumersPage(q *req) {
	v := consumersView{Configured: s.cfg.Inbox != nil, Consumer: q.r.URL.Query().Get("consumer")}
	if !v.Configured {
		q.render(http.StatusOK, "consumers", "Consumers", v)
		return
	}
	x := s.cfg.Inbox
	v.Table = x.Table().String()
	if v.Consumer != "" {
		var err error
		if v.Stats, err = x.Status(q.ctx(), q.actor, v.Consumer); err != nil {
			q.failErr(err)
			return
		}
		if v.DeadLetters, err = x.DeadLetters(q.ctx(), q.actor, v.Consumer, s.cfg.PageSize); err != nil {
			q.failErr(err)
			return
		}
	}
	q.render(http.StatusOK, "consumers", "Consumers", v)
}

// inboxTarget reads the consumer and dead letter a request's path names.
func (s *Server) inboxTarget(q *req) (*ops.Inbox, string, int64, bool) {
	if s.cfg.Inbox == nil {
		q.fail(http.StatusNotFound, "no inbox table is configured: start the console with --inbox-table")
		return nil, "", 0, false
	}
	id, err := ops.ParseDeadLetterID(q.r.PathValue("id"))
	if err != nil {
		q.failErr(err)
		return nil, "", 0, false
	}
	return s.cfg.Inbox, q.r.PathValue("consumer"), id, true
}

func (s *Server) consumerDeadLetterPage(q *req) {
	x, consumer, id, ok := s.inboxTarget(q)
	if !ok {
		return
	}
	v, err := x.DeadLetter(q.ctx(), q.actor, consumer, id)
	if err != nil {
		q.failErr(err)
		return
	}
	q.render(http.StatusOK, "consumer_dead_letter", "Dead letter of "+consumer, consumerDeadLetterView{InboxView: v, Path: consumerPath(consumer, id)})
}

func (s *Server) consumerActPage(action string) func(*req) {
	return func(q *req) {
		x, consumer, id, ok := s.inboxTarget(q)
		if !ok {
			return
		}
		do := x.Retry
		if action == "discard" {
			do = x.Discard
		}
		done, err := do(q.ctx(), q.actor, consumer, []int64{id}, q.formValue("reason"))
		if err == nil && len(done) == 0 {
			err = fmt.Errorf("consumer %s, dead letter %d: %w", consumer, id, outboxdriver.ErrNotFound)
		}
		if err != nil {
			q.failErr(err)
			return
		}
		http.Redirect(q.w, q.r, consumerPath(consumer, 0)+"&done=consumer-"+map[string]string{"retry": "retried", "discard": "discarded"}[action], http.StatusSeeOther)
	}
}
