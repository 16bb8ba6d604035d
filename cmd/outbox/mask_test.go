package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
)

// The issue's scenario: a path stored with the table is masked by `outbox
// dlq show ID` without any flag, as the console and its JSON API mask it,
// and the relay's log (at debug level) never prints it. The paths come
// from `outbox mask add` and from a contract registry (`outbox mask
// import`); a path added while the console runs is masked there within
// seconds; a hostile path is refused with a clear error and stores
// nothing; every change is in the audit.
func TestMaskStoredWithTheTable(t *testing.T) {
	t.Parallel()
	const phone = "PHONE-SECRET-0160-55"          // stored by hand: shipping.phone of orders
	const email = "EMAIL-SECRET-a1b2@example.com" // the registry's own sensitive path
	const iban = "DE00IBAN0SECRET0x7e"            // x-sensitive in the contract's schema
	const late = "LATE-SECRET-9911"               // stored while the console runs
	const marker = "MARKER-VISIBLE-42"            // not sensitive: shown
	ctx := testenv.Context(t, 2*time.Minute)
	tb, flags := migrated(t)
	cli := func(args ...string) (string, string, int) {
		return run(t, nil, append(args, flags...)...)
	}
	mustCLI := func(args ...string) string {
		t.Helper()
		out, stderr, code := cli(args...)
		if code != 0 {
			t.Fatalf("outbox %s: exit %d: %s", strings.Join(args, " "), code, stderr)
		}
		return out
	}

	if out := mustCLI("mask", "add", "shipping.phone", "--aggregate-type", "order", "--reason", "GDPR"); !strings.Contains(out, "masked shipping.phone (aggregatetype=order)") {
		t.Fatalf("mask add: %q", out)
	}
	if out := mustCLI("mask", "add", "shipping.phone", "--aggregate-type", "order"); !strings.Contains(out, "masked already") {
		t.Fatalf("mask add twice: %q", out)
	}
	if out := mustCLI("mask", "import", "--contracts", registryDir); !strings.Contains(out, "stored") {
		t.Fatalf("mask import: %q", out)
	}
	for _, bad := range []string{"shipping..phone", "a.b\x1b]0;pwned\x07", strings.Repeat("p", 300)} {
		_, stderr, code := cli("mask", "add", bad)
		if code == 0 || !strings.Contains(stderr, "path") || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
			t.Errorf("mask add %q: exit %d, %q; want a one-line error on the path", bad, code, stderr)
		}
	}
	var listed struct {
		Paths []struct{ AggregateType, Type, Path, Source string }
	}
	if err := json.Unmarshal([]byte(mustCLI("mask", "list", "--json")), &listed); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, p := range listed.Paths {
		got[p.AggregateType+"/"+p.Type+"/"+p.Path] = p.Source
	}
	if got["order//shipping.phone"] != "operator" || got["//customer.email"] != "contract registry" ||
		got["//card.token"] != "contract registry" || got["order/OrderPlaced/billing.iban"] != "contract order/OrderPlaced" {
		t.Fatalf("mask list: %v; want the added path, the registry's two and the schema's billing.iban among them", got)
	}

	// A dead letter holding them all: an order that breaks its contract.
	const id = "00000000-0000-7000-8000-00000000a5c1"
	pool := testenv.Pool(t)
	if _, err := pool.Exec(ctx, `INSERT INTO `+tb.Qualified("")+` (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', '1', 'OrderPlaced', $2)`, id,
		`{"orderId": 1, "total": -1, "currency": "`+marker+`", "customer": {"email": "`+email+`"}, "billing": {"iban": "`+iban+`"},
		  "shipping": {"phone": "`+phone+`", "note": "`+late+`"}}`); err != nil {
		t.Fatal(err)
	}
	st, sinkFlags := natsTarget(t)
	relay := startRelay(t, append(append(flags, sinkFlags...), "--contracts", registryDir, "--log-level", "debug")...)
	await.Eventually(t, 30*time.Second, func() error {
		out, _, code := cli("dlq", "list", "--json")
		if code != 0 || !strings.Contains(out, id) {
			return fmt.Errorf("not dead-lettered yet: %s", out)
		}
		return nil
	})
	_ = relay.cmd.Process.Signal(syscall.SIGTERM)
	if code := relay.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("relay exit %d", code)
	}
	if n := len(testenv.StreamMessages(t, st)); n != 0 {
		t.Fatalf("broker got %d message(s); want none (the event breaks its contract)", n)
	}

	shown := map[string]string{"relay log": relay.stderr.String()}
	shown["dlq show"] = mustCLI("dlq", "show", id)
	shown["dlq show --json"] = mustCLI("dlq", "show", id, "--json")
	for _, where := range []string{"dlq show", "dlq show --json"} {
		if !strings.Contains(shown[where], marker) || !strings.Contains(shown[where], late) || !strings.Contains(shown[where], "3 sensitive value(s) masked") {
			t.Errorf("%s: want the payload with its three sensitive values masked, shipping.note not yet:\n%s", where, shown[where])
		}
		shown[where] = strings.ReplaceAll(shown[where], late, "")
	}

	base := startConsole(t, ctx, tb.Schema, "--table", tb.Name)
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	browser := &http.Client{Jar: jar}
	get := func(path string) string {
		t.Helper()
		resp, err := browser.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("console %s: %d %s", path, resp.StatusCode, body)
		}
		return string(body)
	}
	for _, path := range []string{"/dead-letters/" + id, "/api/v1/dead-letters/" + id} {
		body := get(path)
		if !strings.Contains(body, marker) || !strings.Contains(body, late) {
			t.Fatalf("console %s: want the payload, shipping.note not yet masked:\n%s", path, body)
		}
		shown["console "+path] = strings.ReplaceAll(body, late, "")
	}

	// Stored while the console runs: masked there within seconds.
	mustCLI("mask", "add", "shipping.note")
	await.Eventually(t, 30*time.Second, func() error {
		if body := get("/api/v1/dead-letters/" + id); strings.Contains(body, late) {
			return fmt.Errorf("the console still shows shipping.note")
		}
		return nil
	})
	shown["dlq show, later"] = mustCLI("dlq", "show", id)

	for where, text := range shown {
		for _, secret := range []string{phone, email, iban, late} {
			if strings.Contains(text, secret) {
				t.Errorf("%s shows %s:\n%s", where, secret, text)
			}
		}
	}

	if _, stderr, code := cli("mask", "remove", "shipping.note"); code == 0 || !strings.Contains(stderr, "reason") {
		t.Fatalf("mask remove without a reason: exit %d, %q", code, stderr)
	}
	mustCLI("mask", "remove", "shipping.note", "--reason", "not personal data")
	if _, stderr, code := cli("mask", "remove", "shipping.note", "--reason", "again"); code == 0 || !strings.Contains(stderr, "not stored") {
		t.Fatalf("mask remove of a path not stored: exit %d, %q", code, stderr)
	}
	audit := mustCLI("audit", "--json")
	if n := strings.Count(audit, `"action":"mask-add"`); n != len(got)+1 {
		t.Errorf("audit: %d mask-add rows; want %d (one per path stored, none for what was stored already):\n%s", n, len(got)+1, audit)
	}
	if n := strings.Count(audit, `"action":"mask-remove"`); n != 1 {
		t.Errorf("audit: %d mask-remove rows; want 1:\n%s", n, audit)
	}
}
