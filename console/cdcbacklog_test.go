package console_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/outboxkit/outbox/internal/pgschema"
	"github.com/outboxkit/outbox/ops"
)

// The overview shows the backlog of log tailing in message mode, which the
// table cannot count: the events a slot's streamer recorded as decoded and
// not published, marked as a lower bound with the WAL not confirmed; a
// stale record says so, and the oldest age then grows from it. The slot's
// row is written as a streamer records it (relayd's tests record it from a
// real stream).
func TestOverviewShowsTheBacklogOfLogTailing(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	state := pgschema.CDCNamesOf(r.tb).State
	if _, err := r.pool.Exec(r.ctx, `INSERT INTO `+state+` (slot, publication, backlog_mode, backlog_events, backlog_oldest_commit, backlog_recorded_at)
VALUES ('no_such_slot', 'no_such_publication', 'message', 42, now() - interval '10 seconds', now())`); err != nil {
		t.Fatal(err)
	}
	b := r.browser()
	b.login(r.users[ops.Viewer])
	overview := func() (string, map[string]any) {
		t.Helper()
		code, page := b.get("/")
		acode, api := r.api("GET", "/api/v1/overview", r.users[ops.Viewer].token, nil)
		var js map[string]any
		if code != http.StatusOK || acode != http.StatusOK || json.Unmarshal(api, &js) != nil {
			t.Fatalf("overview %d, API %d: %s", code, acode, api)
		}
		return string(page), js
	}
	page, js := overview()
	for _, want := range []string{`data-k="backlog">≥ 42<`, `id="backlog-in-wal"`, "42 decoded, not published", "not decoded yet, are not counted"} {
		if !strings.Contains(page, want) {
			t.Fatalf("the overview lacks %q:\n%s", want, page)
		}
	}
	if strings.Contains(page, "stale") {
		t.Fatal("the overview calls a fresh record stale")
	}
	if js["backlog"] != 42.0 || js["backlog_exact"] != false || js["oldest_unpublished_age_seconds"].(float64) < 10 || js["oldest_pending_commit_at"] == nil {
		t.Fatalf("API overview = backlog %v, exact %v, oldest %v, oldest commit %v; want 42, false, at least 10s, a time",
			js["backlog"], js["backlog_exact"], js["oldest_unpublished_age_seconds"], js["oldest_pending_commit_at"])
	}

	// The streamer stopped recording a minute ago, with nothing pending.
	if _, err := r.pool.Exec(r.ctx, `UPDATE `+state+` SET backlog_events = 0, backlog_oldest_commit = NULL, backlog_recorded_at = now() - interval '1 minute'`); err != nil {
		t.Fatal(err)
	}
	page, js = overview()
	if !strings.Contains(page, "stale: the streamer stopped recording") || !strings.Contains(page, `data-unit="s">≈ `) {
		t.Fatalf("the overview does not call the record stale, or the age not estimated:\n%s", page)
	}
	if js["backlog"] != 0.0 || js["backlog_exact"] != false || js["oldest_unpublished_age_seconds"].(float64) < 60 || js["oldest_unpublished_age_estimated"] != true {
		t.Fatalf("API overview with a stale record = backlog %v, exact %v, oldest %v (estimated %v); want 0, false, at least 60s, estimated",
			js["backlog"], js["backlog_exact"], js["oldest_unpublished_age_seconds"], js["oldest_unpublished_age_estimated"])
	}
}
