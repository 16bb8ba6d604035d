package console_test

import (
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/outboxkit/outbox/ops"
)

// A real browser on the consumers page: the viewer sees a hostile dead
// letter's fields as text (no element of its markup exists in the page)
// and no way to act, and a retry posted from the page is refused; the
// operator retries it from its form, and the dead letter is marked for
// retry.
func TestBrowserConsumers(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	id, event := r.hostileConsumerDeadLetter()
	page := "/consumers/billing/dead-letters/" + id
	c := newChrome(t, r)
	do, shot, signIn, eval, post := c.do, c.shot, c.signIn, c.eval, c.post

	do("viewer signs in", signIn(r.users[ops.Viewer]),
		chromedp.Navigate(r.url+"/consumers?consumer=billing"), chromedp.WaitVisible(chromedp.ID("consumer-dead-letters")), shot("consumers.png"),
		chromedp.Navigate(r.url+page), chromedp.WaitVisible(chromedp.ID("no-actions")))
	if n := eval("injected elements", `String(document.querySelectorAll("#pwned").length)`); n != "0" {
		t.Fatalf("%s elements of the dead letter's markup exist in the page", n)
	}
	if got := eval("event id", `document.querySelector("#event-id").textContent`); got != event {
		t.Fatalf("event id shown as %q, want the text %q", got, event)
	}
	if forms := eval("forms", `String(document.querySelectorAll("#retry, #discard").length)`); forms != "0" {
		t.Fatalf("the viewer's page has %s retry or discard forms", forms)
	}
	if code := post(page+"/retry", true); code != "403" {
		t.Fatalf("retry posted by the viewer: %s, want 403", code)
	}
	do("viewer signs out", chromedp.Click(chromedp.CSS(`form[action="/logout"] button`)), chromedp.WaitVisible(chromedp.ID("login")))

	do("operator retries", signIn(r.users[ops.Operator]),
		chromedp.Navigate(r.url+page), chromedp.WaitVisible(chromedp.ID("retry")), shot("consumer-dead-letter.png"),
		chromedp.SendKeys(chromedp.CSS(`#retry input[name=reason]`), "customer imported"),
		chromedp.Click(chromedp.CSS(`#retry button`)),
		chromedp.WaitVisible(chromedp.ID("flash")), chromedp.WaitVisible(chromedp.ID("consumer-status")))
	st, err := r.ib.Status(r.ctx, ops.Actor{Name: "check", Role: ops.Viewer}, "billing")
	if err != nil || st.DeadLetters != 1 || st.RetryRequested != 1 {
		t.Fatalf("after the operator's retry: %+v, %v; want the dead letter marked for retry", st, err)
	}
	if a := r.audit()[0]; a.Action != ops.ActionInboxRetry || a.Actor != "otto" || a.Reason != "customer imported" {
		t.Fatalf("newest audit row %+v; want otto's inbox-retry", a)
	}
}
