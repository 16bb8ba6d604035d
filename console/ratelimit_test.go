package console_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/console"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/ops"
)

// A block after too many failed sign-ins says how long it lasts, in
// Retry-After and in words, on the sign-in page and in the API; and it
// ends by itself once the window has passed.
func TestLoginBlockSaysHowLongAndExpires(t *testing.T) {
	t.Parallel()
	const window = 3 * time.Second
	r := newRig(t, &rigOptions{users: true, cfg: console.Config{LoginAttempts: 2, LoginWindow: window}})
	u := r.users[ops.Viewer]
	b := r.browser()
	for i := range 2 {
		if code := b.signIn(u.name, fmt.Sprintf("wrong-%d-password", i)); code != http.StatusUnauthorized {
			t.Fatalf("wrong password %d: %d, want 401", i, code)
		}
	}
	blockedAt := time.Now()
	// The sign-in page.
	_, form := b.get("/login")
	m := tokenField.FindSubmatch(form)
	if m == nil {
		t.Fatalf("no form token in\n%s", form)
	}
	req, _ := http.NewRequestWithContext(r.ctx, "POST", r.url+"/login", strings.NewReader(url.Values{"token": {string(m[1])}, "name": {u.name}, "password": {u.password}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := b.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	page := readAll(t, resp)
	wait, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.StatusCode != http.StatusTooManyRequests || err != nil || wait < 1 || wait > int(window/time.Second) {
		t.Fatalf("sign-in while blocked: %d, Retry-After %q; want 429 and 1 to %d seconds", resp.StatusCode, resp.Header.Get("Retry-After"), int(window/time.Second))
	}
	if !regexp.MustCompile(`Try again in [1-3] seconds?\.`).MatchString(page) {
		t.Fatalf("the sign-in page while blocked does not say how long:\n%s", page)
	}
	// The API, from the same address.
	req, _ = http.NewRequestWithContext(r.ctx, "GET", r.url+"/api/v1/overview", nil)
	req.Header.Set("Authorization", "Bearer "+u.token)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var e struct {
		Error struct {
			Message           string `json:"message"`
			RetryAfterSeconds int    `json:"retry_after_seconds"`
		} `json:"error"`
	}
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || json.Unmarshal([]byte(body), &e) != nil ||
		e.Error.RetryAfterSeconds < 1 || !strings.Contains(e.Error.Message, "try again in") {
		t.Fatalf("API while blocked: %d, Retry-After %q, %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	// It ends by itself: no restart.
	await.Eventually(t, 4*window, func() error {
		if code := r.browser().signIn(u.name, u.password); code != http.StatusSeeOther {
			return fmt.Errorf("sign-in %s after the block began: %d", time.Since(blockedAt).Round(time.Millisecond), code)
		}
		return nil
	})
	if d := time.Since(blockedAt); d < window-time.Second {
		t.Fatalf("the block ended after %s; the window is %s", d, window)
	}
}
