package console_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/contract"
	"github.com/outboxkit/outbox/internal/driverkit"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/ops"
	"github.com/outboxkit/outbox/outboxdriver"
)

// Dead letters of one event type whose errors differ only in ids and long
// numbers form one failure group; retrying the group moves exactly its
// members back into the outbox, each audited.
func TestFailureGroups(t *testing.T) {
	t.Parallel()
	onEveryDB(t, nil, func(t *testing.T, r *rig) {
		row := func(typ, err string) testenv.DeadLetterRow {
			return testenv.DeadLetterRow{AggregateType: "order", AggregateID: testenv.Hex(t), Type: typ, Payload: `{}`, LastError: err, Attempts: 20}
		}
		timeouts := r.fx.addDeadLetters(t, r.tb,
			row("OrderPlaced", "publish 0190a0a0-0000-7000-8000-000000000001: timeout after 30000ms"),
			row("OrderPlaced", "publish 0190a0a0-0000-7000-8000-000000000002: timeout after 31000ms"),
			row("OrderPlaced", "publish 0190a0a0-0000-7000-8000-000000000003: timeout after 30500ms"))
		r.fx.addDeadLetters(t, r.tb,
			row("OrderShipped", "publish 0190a0a0-0000-7000-8000-000000000004: timeout after 30000ms"), // another type
			row("OrderPlaced", "broker refused: 400 Bad Request"))                                      // another class
		op := r.users[ops.Operator].token
		code, body := r.api("GET", "/api/v1/failure-groups", r.users[ops.Viewer].token, nil)
		if code != http.StatusOK {
			t.Fatalf("list groups: %d %s", code, body)
		}
		var list struct{ Groups []outboxdriver.FailureGroup }
		if err := json.Unmarshal(body, &list); err != nil {
			t.Fatal(err)
		}
		if len(list.Groups) != 3 || list.Groups[0].Count != 3 || list.Groups[0].Type != "OrderPlaced" || list.Groups[0].Example != timeouts[0] {
			t.Fatalf("groups %+v; want 3, the largest OrderPlaced timeouts (3) with the oldest as example", list.Groups)
		}
		if c := list.Groups[0].ErrorClass; c != "publish <id>: timeout after <n>ms" || c != driverkit.ErrorClass("publish 0190a0a0-0000-7000-8000-000000000001: timeout after 30000ms") {
			t.Fatalf("error class %q", c)
		}
		// Every database names a group as driverkit.FailureGroupKey does.
		for _, g := range list.Groups {
			if g.Key != driverkit.FailureGroupKey(g.Type, g.ErrorClass) {
				t.Fatalf("group %+v: key %s, want %s", g, g.Key, driverkit.FailureGroupKey(g.Type, g.ErrorClass))
			}
		}
		mark := r.lastAuditID()
		code, body = r.api("POST", "/api/v1/failure-groups/"+list.Groups[0].Key+"/retry", op, map[string]string{"reason": "receiver back"})
		if code != http.StatusOK {
			t.Fatalf("retry group: %d %s", code, body)
		}
		var done struct {
			IDs   []string
			Count int
		}
		if err := json.Unmarshal(body, &done); err != nil {
			t.Fatal(err)
		}
		if done.Count != 3 || len(done.IDs) != 3 {
			t.Fatalf("retried %+v, want the 3 timeouts", done)
		}
		st := r.state()
		if st.backlog != 3 || st.dead != 2 {
			t.Fatalf("after the group retry: backlog %d, dead letters %d; want 3 and 2", st.backlog, st.dead)
		}
		rows := r.auditSince(mark)
		if len(rows) != 3 {
			t.Fatalf("%d audit rows for a group of 3: %+v", len(rows), rows)
		}
		for _, a := range rows {
			if a.Action != "retry" || a.Actor != "otto" || a.Reason != "receiver back" {
				t.Errorf("audit %+v", a)
			}
		}
	})
}

// A held aggregate shows in the list; releasing it removes the hold (the
// claim skips only aggregates with one), keeps the dead letter, and is
// audited.
func TestHeldRelease(t *testing.T) {
	t.Parallel()
	onEveryDB(t, nil, func(t *testing.T, r *rig) {
		id := r.deadLetter() // holds order/<hex>
		code, body := r.api("GET", "/api/v1/held", r.users[ops.Viewer].token, nil)
		var list struct{ Held []outboxdriver.HeldAggregate }
		if code != http.StatusOK || json.Unmarshal(body, &list) != nil || len(list.Held) != 1 || list.Held[0].EventID != id || list.Held[0].Reason != "dead-lettered" {
			t.Fatalf("held list: %d %s", code, body)
		}
		code, body = r.api("POST", "/api/v1/held/"+id+"/release", r.users[ops.Operator].token, map[string]string{"reason": "ship the rest"})
		if code != http.StatusOK {
			t.Fatalf("release: %d %s", code, body)
		}
		st := r.state()
		if st.held != 0 || st.dead != 1 {
			t.Fatalf("after release: %+v; want nothing held, the dead letter kept", st)
		}
		d, err := r.st.DeadLetter(r.ctx, r.tb, id)
		if err != nil || d.Held {
			t.Fatalf("dead letter after release: held=%v, %v", d.Held, err)
		}
		if a := r.audit()[0]; a.Action != "release" || a.EventID != id || a.Reason != "ship the rest" || a.Role != "operator" {
			t.Fatalf("audit %+v", a)
		}
		// Released once: a second release finds nothing held.
		if code, _ := r.api("POST", "/api/v1/held/"+id+"/release", r.users[ops.Operator].token, map[string]string{"reason": "again"}); code != http.StatusNotFound {
			t.Fatalf("second release: %d, want 404", code)
		}
	})
}

// Only an operator may reveal a masked payload field, only with a reason,
// and the reveal is audited; the viewer's request shows nothing, and the
// dead letter is masked again for everyone afterwards.
func TestReveal(t *testing.T) {
	t.Parallel()
	onEveryDB(t, nil, func(t *testing.T, r *rig) {
		id := r.deadLetter() // customer.email is sensitive in the rig
		const secret = "ada@example.com"
		path := "/api/v1/dead-letters/" + id + "/reveal"
		for _, role := range []ops.Role{ops.Viewer, ops.Approver} {
			code, body := r.api("POST", path, r.users[role].token, map[string]string{"path": "customer.email", "reason": "curious"})
			if code != http.StatusForbidden || strings.Contains(string(body), secret) {
				t.Fatalf("reveal by the %s: %d %s", role, code, body)
			}
		}
		op := r.users[ops.Operator].token
		if code, body := r.api("POST", path, op, map[string]string{"path": "customer.email"}); code != http.StatusBadRequest || strings.Contains(string(body), secret) {
			t.Fatalf("reveal without a reason: %d %s", code, body)
		}
		if code, _ := r.api("POST", path, op, map[string]string{"path": "customer.name", "reason": "x"}); code != http.StatusBadRequest {
			t.Fatalf("reveal of a path that is not sensitive: %d", code)
		}
		code, body := r.api("POST", path, op, map[string]string{"path": "customer.email", "reason": "customer asked support"})
		if code != http.StatusOK || !strings.Contains(string(body), secret) || !strings.Contains(string(body), `"revealed": "customer.email"`) {
			t.Fatalf("reveal by the operator: %d %s", code, body)
		}
		if a := r.audit()[0]; a.Action != "reveal" || a.EventID != id || a.Actor != "otto" || a.Reason != "customer asked support" || !strings.Contains(a.Detail, "customer.email") {
			t.Fatalf("audit of the reveal: %+v", a)
		}
		for _, role := range ops.Roles() {
			if code, body := r.api("GET", "/api/v1/dead-letters/"+id, r.users[role].token, nil); code != http.StatusOK || strings.Contains(string(body), secret) {
				t.Fatalf("the dead letter for the %s after the reveal: %d %s", role, code, body)
			}
		}
	})
}

// The overview shows the backlog by aggregate type and event type, the
// pauses in force, and a chart drawn from the samples the console
// records; the publish rate follows from inserts, backlog and dead
// letters between samples.
func TestOverviewInsight(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	r.scenery() // 40 pending OrderPlaced events of order, an hour of samples
	if _, err := r.st.SetPause(r.ctx, r.tb, outboxdriver.PauseScope{Kind: outboxdriver.PauseDestination, Value: "outbox.event.order"},
		outboxdriver.Acting{Name: "otto", Role: "operator", Reason: "broker upgrade"}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := r.srv.SampleOnce(r.ctx); err != nil {
			t.Fatal(err)
		}
	}
	since := time.Now().Add(-time.Minute) // scenery's own samples are older
	ss, err := r.st.Samples(r.ctx, r.tb, since)
	if err != nil || len(ss) < 2 || ss[len(ss)-1].Backlog != 40 || ss[len(ss)-1].LastSeq < 40 {
		t.Fatalf("samples %+v, %v; want the two just taken, with the backlog of 40", ss, err)
	}
	b := r.browser()
	b.login(r.users[ops.Viewer])
	code, page := b.get("/")
	body := string(page)
	acode, api := r.api("GET", "/api/v1/overview", r.users[ops.Viewer].token, nil)
	var ov struct {
		BacklogByKind []struct {
			AggregateType string `json:"aggregatetype"`
			Type          string `json:"type"`
			Backlog       int64  `json:"backlog"`
		} `json:"backlog_by_kind"`
		Pauses []outboxdriver.Pause `json:"pauses"`
	}
	if acode != http.StatusOK || json.Unmarshal(api, &ov) != nil || len(ov.BacklogByKind) != 1 || ov.BacklogByKind[0].Backlog != 40 || len(ov.Pauses) != 1 {
		t.Fatalf("overview API: %d %s", acode, api)
	}
	for _, want := range []string{`id="chart"`, `<polyline points="`, `id="backlog-by-kind"`, `<td>OrderPlaced</td><td class="num">40</td>`, `destination=outbox.event.order`, `broker upgrade`} {
		if code != http.StatusOK || !strings.Contains(body, want) {
			t.Fatalf("overview: %d, no %q in\n%s", code, want, body)
		}
	}
}

// An event's contract adds sensitive paths to the configured ones: they
// are masked, listed, and each may be revealed (the others stay masked).
func TestRevealContractPath(t *testing.T) {
	t.Parallel()
	onEveryDB(t, nil, func(t *testing.T, r *rig) {
		reg, err := contract.Load("../contract/testdata/orders")
		if err != nil {
			t.Fatal(err)
		}
		o, err := ops.New(r.st, r.tb, &ops.Config{SensitivePaths: []string{"customer.email"}, Contracts: reg})
		if err != nil {
			t.Fatal(err)
		}
		id := r.fx.addDeadLetters(t, r.tb, testenv.DeadLetterRow{
			AggregateType: "order", AggregateID: testenv.Hex(t), Type: "OrderPlaced",
			Payload:   `{"orderId":42,"customer":{"email":"ada@example.com"},"shipping":{"address":"1 Analytical Way"}}`,
			LastError: "refused", Attempts: 1,
		})[0]
		otto := ops.Actor{Name: "otto", Role: ops.Operator}
		v, err := o.DeadLetter(r.ctx, otto, id)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(v.Payload, "Analytical") || strings.Contains(v.Payload, "ada@") || !slices.Contains(v.Sensitive, "shipping.address") || !slices.Contains(v.Sensitive, "customer.email") {
			t.Fatalf("masked view: sensitive %v, payload %s", v.Sensitive, v.Payload)
		}
		v, err = o.Reveal(r.ctx, otto, id, "shipping.address", "courier lost the parcel")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(v.Payload, "1 Analytical Way") || strings.Contains(v.Payload, "ada@") || v.Revealed != "shipping.address" {
			t.Fatalf("revealed shipping.address: revealed %q, payload %s", v.Revealed, v.Payload)
		}
		if a := r.audit()[0]; a.Action != ops.ActionReveal || a.EventID != id || !strings.Contains(a.Detail, "shipping.address") {
			t.Fatalf("audit of the reveal: %+v", a)
		}
		if _, err := o.Reveal(r.ctx, otto, id, "orderId", "not sensitive"); !errors.As(err, new(*ops.InputError)) {
			t.Fatalf("reveal of a path that is not sensitive: %v, want an input error", err)
		}
	})
}

// The overview lists each relay with the release and schema version it
// runs with and when it last renewed its registration (issue 40): a relay
// of this release as its heartbeat records it, and one of a release that
// records none, as unknown; the JSON API carries the same.
func TestOverviewShowsRelaysReleaseVersionAndRenewal(t *testing.T) {
	t.Parallel()
	r := newRig(t, nil)
	src, err := r.st.NewSource(r.tb, &outboxdriver.SourceConfig{RelayName: "relay-new"})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if _, _, err := src.Heartbeat(r.ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := r.pool.Exec(r.ctx, `INSERT INTO `+r.tb.Qualified("_relays")+` (relay, expires_at) VALUES ('relay-old', now() + interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	latest := r.st.LatestVersion()
	b := r.browser()
	b.login(r.users[ops.Viewer])
	code, page := b.get("/")
	body := string(page)
	for _, want := range []string{
		`<th>Release</th><th class="num">Schema version</th><th>Running since</th><th>Last renewal</th>`,
		`<code>relay-new</code>`, fmt.Sprintf(`<td class="num relay-schema">%d</td>`, latest),
		`<code>relay-old</code>`, `<td class="num relay-schema"><span class="muted">unknown (older)</span></td>`,
		`<td class="relay-renewed"><span class="muted">unknown</span></td>`,
	} {
		if code != http.StatusOK || !strings.Contains(body, want) {
			t.Fatalf("overview: %d, no %q in\n%s", code, want, body)
		}
	}
	if !regexp.MustCompile(`<td class="relay-renewed">\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ \([0-9.]+(ns|µs|ms|s|m) ago\)</td>`).MatchString(body) {
		t.Fatalf("overview: no last renewal time for relay-new in\n%s", body)
	}
	acode, api := r.api("GET", "/api/v1/overview", r.users[ops.Viewer].token, nil)
	var ov struct {
		Relays []outboxdriver.RelayStatus `json:"relays"`
	}
	if acode != http.StatusOK || json.Unmarshal(api, &ov) != nil || len(ov.Relays) != 2 {
		t.Fatalf("overview API: %d %s", acode, api)
	}
	byName := map[string]outboxdriver.RelayStatus{}
	for _, x := range ov.Relays {
		byName[x.Name] = x
	}
	if n := byName["relay-new"]; n.SchemaVersion != latest || n.Release == "" || n.RenewedAt.IsZero() {
		t.Fatalf("relay-new in the API: %+v; want schema version %d, a release and a renewal", n, latest)
	}
	if o := byName["relay-old"]; o.SchemaVersion != 0 || o.Release != "" || !o.RenewedAt.IsZero() {
		t.Fatalf("relay-old in the API: %+v; want everything unknown", o)
	}
}
