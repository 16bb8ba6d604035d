package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/contract"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/internal/testenv/await"
	"github.com/outboxkit/outbox/outboxpgx"
)

const registryDir = "../../contract/testdata/orders"

// `outbox contract check` exits 0 for a compatible registry, 1 with the
// list for a breaking one, 2 for one that cannot be loaded.
func TestContractCheckExitStatus(t *testing.T) {
	t.Parallel()
	next := t.TempDir()
	for _, name := range []string{"contracts.json", "order/OrderPlaced.v1.json", "order/OrderPlaced.v2.json"} {
		b, err := os.ReadFile(filepath.Join(registryDir, name))
		if err != nil {
			t.Fatal(err)
		}
		if name == "order/OrderPlaced.v2.json" { // currency loses USD: breaking
			b = []byte(strings.Replace(string(b), `["EUR", "USD"]`, `["EUR"]`, 1))
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(next, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(next, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if out, stderr, code := run(t, nil, "contract", "check", registryDir, registryDir); code != 0 || !strings.Contains(out, "compatible") {
		t.Fatalf("same registry: exit %d, %q %q", code, out, stderr)
	}
	out, stderr, code := run(t, nil, "contract", "check", registryDir, next)
	if code != 1 || !strings.Contains(out, `order/OrderPlaced/v2 currency: narrowed-enum: enum value(s) "USD" removed`) || !strings.Contains(stderr, "1 breaking change(s)") {
		t.Fatalf("narrowed enum: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	out, _, code = run(t, nil, "contract", "check", "--json", registryDir, next)
	var res struct {
		Compatible bool
		Breaking   []contract.Change
	}
	if err := json.Unmarshal([]byte(out), &res); code != 1 || err != nil || res.Compatible || len(res.Breaking) != 1 || res.Breaking[0].Kind != "narrowed-enum" {
		t.Fatalf("--json: exit %d, %q, %v", code, out, err)
	}
	if err := os.WriteFile(filepath.Join(next, "order/OrderPlaced.v1.json"), []byte(`{"type": `), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := run(t, nil, "contract", "check", registryDir, next); code != 2 || !strings.Contains(stderr, "NEW_DIR") || !strings.Contains(stderr, "does not parse as JSON") {
		t.Fatalf("broken registry: exit %d, stderr %q", code, stderr)
	}
}

// `outbox contract list` names each contract's masked and forbidden
// fields and how its events are checked: in one pass, or by the library
// alone, with the keyword and the place that keep them there.
func TestContractListShowsHowEachContractIsChecked(t *testing.T) {
	t.Parallel()
	out, stderr, code := run(t, nil, "contract", "list", registryDir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{
		"order/OrderPlaced/v1  order/OrderPlaced.v1.json  one pass",
		"order/OrderPlaced/v2  order/OrderPlaced.v2.json  one pass",
		"card.token,payment.cvv", // the registry's forbidden path and v2's own
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("no %q in:\n%s", want, out)
		}
	}
	dir := t.TempDir()
	files := map[string]string{
		"contracts.json": `{"contracts": [{"aggregatetype": "stock", "type": "Counted", "version": 1, "schema": "counted.json"}]}`,
		"counted.json":   `{"type": "object", "properties": {"n": {"type": "integer", "not": {"const": 0}}}}`,
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, stderr, code = run(t, nil, "contract", "list", "--json", dir)
	var list []struct {
		AggregateType, Type string
		Version             int
		OnePass             bool   `json:"one_pass"`
		Library             string `json:"library_because"`
		Sensitive           []string
		Forbidden           []string
	}
	if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil || len(list) != 1 {
		t.Fatalf("--json: exit %d, %q, %v, %s", code, out, err, stderr)
	}
	if l := list[0]; l.AggregateType != "stock" || l.Version != 1 || l.OnePass || l.Library != "not at counted.json#/properties/n" || l.Sensitive == nil || l.Forbidden == nil {
		t.Fatalf("--json: %+v", l)
	}
	if _, stderr, code := run(t, nil, "contract", "list", filepath.Join(dir, "missing")); code != 2 || !strings.Contains(stderr, "contracts.json") {
		t.Fatalf("a missing registry: exit %d, %q", code, stderr)
	}
}

// A recognisable secret in a sensitive field reaches the broker and
// nothing else: not the relay's log (at debug level), not the refusal of
// a forbidden field, not the dead letters as dlq list, dlq show and the
// console (API and page) show them, not status. The fields are marked in
// both ways: customer.email in the registry's index, billing.iban by the
// schema's own x-sensitive; card.token forbidden by the index,
// payment.cvv by the schema's x-forbidden.
func TestSecretAppearsOnlyInTheBrokerMessage(t *testing.T) {
	t.Parallel()
	const secret = "SECRET-7f3a9c1e-do-not-leak@example.com"
	const token = "tok_live_SECRET_4e1b"
	const iban = "DE00SECRET0IBAN0x9d4c" // x-sensitive in the schema
	const cvv = "CVV-SECRET-0417"        // x-forbidden in the schema
	const marker = "GBP-MARKER-51"       // not sensitive: shown in the payload, never in an error
	ctx := testenv.Context(t, 2*time.Minute)
	tb, flags := migrated(t)
	st, sinkFlags := natsTarget(t)
	pool := testenv.Pool(t)
	reg, err := contract.Load(registryDir)
	if err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(outboxpgx.New(pool), &outbox.Config{Schema: tb.Schema, Table: tb.Name, Contracts: reg})
	if err != nil {
		t.Fatal(err)
	}
	// Refused at write time: the forbidden field, and the error does not
	// show it.
	err = ob.Write(ctx, outbox.Event{AggregateType: "order", AggregateID: "9", Type: "OrderPlaced",
		Payload: []byte(`{"orderId": 9, "total": 1, "currency": "EUR", "card": {"token": "` + token + `"}}`)})
	if !errors.Is(err, outbox.ErrInvalidEvent) || strings.Contains(err.Error(), token) {
		t.Fatalf("Write with a forbidden field: %v", err)
	}
	err = ob.Write(ctx, outbox.Event{AggregateType: "order", AggregateID: "9", Type: "OrderPlaced",
		Payload: []byte(`{"orderId": 9, "total": 1, "currency": "EUR", "payment": {"cvv": "` + cvv + `"}}`)})
	if !errors.Is(err, outbox.ErrInvalidEvent) || !strings.Contains(err.Error(), "payment.cvv") || strings.Contains(err.Error(), cvv) {
		t.Fatalf("Write with a field the schema marks x-forbidden: %v", err)
	}
	// Published: a valid event with the secret in a sensitive field.
	if err := ob.Write(ctx, outbox.Event{AggregateType: "order", AggregateID: "1", Type: "OrderPlaced",
		Payload: []byte(`{"orderId": 1, "total": 5, "currency": "EUR", "customer": {"email": "` + secret + `"}, "billing": {"iban": "` + iban + `"}}`)}); err != nil {
		t.Fatal(err)
	}
	// Dead-lettered by the relay: rows written by plain SQL that break the
	// contract, all holding the secrets; the third holds the field the
	// schema forbids.
	const bad1, bad2, bad3 = "00000000-0000-7000-8000-0000000000b1", "00000000-0000-7000-8000-0000000000b2", "00000000-0000-7000-8000-0000000000b3"
	if _, err := pool.Exec(ctx, `INSERT INTO `+tb.Qualified("")+` (id, aggregatetype, aggregateid, type, payload) VALUES
		($1, 'order', '2', 'OrderPlaced', $4),
		($2, 'order', '3', 'OrderPlaced', $5),
		($3, 'order', '4', 'OrderPlaced', $6)`, bad1, bad2, bad3,
		`{"orderId": 2, "total": -1, "currency": "EUR", "customer": {"email": "`+secret+`"}, "billing": {"iban": "`+iban+`"}}`,
		`{"orderId": 3, "total": 1, "currency": "`+marker+`", "customer": {"email": "`+secret+`"}, "billing": {"iban": "`+iban+`"}}`,
		`{"orderId": 4, "total": 1, "currency": "EUR", "payment": {"cvv": "`+cvv+`"}, "billing": {"iban": "`+iban+`"}}`); err != nil {
		t.Fatal(err)
	}
	relayProc := startRelay(t, append(append(flags, sinkFlags...), "--contracts", registryDir, "--log-level", "debug")...)
	testenv.WaitStreamMsgs(t, st, 1, 30*time.Second)
	waitBacklogZero(t, tb, 30*time.Second)
	msgs := testenv.StreamMessages(t, st)
	if len(msgs) != 1 || !strings.Contains(string(msgs[0].Data), secret) || !strings.Contains(string(msgs[0].Data), iban) || msgs[0].Header.Get("eventVersion") != "2" {
		t.Fatalf("broker: %d message(s); want the one event, with the secrets and eventVersion 2", len(msgs))
	}
	_ = relayProc.cmd.Process.Signal(syscall.SIGTERM)
	if code := relayProc.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("relay exit %d", code)
	}
	shown := map[string]string{"relay log": relayProc.stderr.String()}
	cli := func(name string, args ...string) {
		out, stderr, code := run(t, nil, append(args, flags...)...)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", name, code, stderr)
		}
		shown[name] = out + stderr
	}
	cli("dlq list", "dlq", "list")
	cli("dlq list --json", "dlq", "list", "--json")
	cli("dlq show", "dlq", "show", bad1, "--contracts", registryDir)
	cli("dlq show --json", "dlq", "show", bad2, "--json", "--contracts", registryDir)
	cli("dlq show forbidden", "dlq", "show", bad3, "--contracts", registryDir)
	cli("status", "status")
	cli("status --json", "status", "--json")
	if !strings.Contains(shown["dlq list"], "contract: event "+bad1) || !strings.Contains(shown["dlq list"], "contract: event "+bad3) ||
		!strings.Contains(shown["dlq show"], `"email": "***"`) || !strings.Contains(shown["dlq show"], `"iban": "***"`) ||
		!strings.Contains(shown["dlq show forbidden"], `"cvv": "***"`) {
		t.Fatalf("dlq list %q / dlq show %q / %q: want the cause contract and masked email, iban and cvv", shown["dlq list"], shown["dlq show"], shown["dlq show forbidden"])
	}
	// The console, --dev, with the registry: the API and the page.
	base := startConsole(t, ctx, tb.Schema, "--contracts", registryDir)
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	browser := &http.Client{Jar: jar} // dev mode signs a browser in on its first page
	for _, path := range []string{"/dead-letters/" + bad1, "/dead-letters/" + bad3, "/api/v1/dead-letters/" + bad1, "/api/v1/dead-letters/" + bad2, "/api/v1/dead-letters/" + bad3, "/api/v1/dead-letters"} {
		resp, err := browser.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("console %s: %d %s", path, resp.StatusCode, body)
		}
		shown["console "+path] = string(body)
	}
	if !strings.Contains(shown["console /api/v1/dead-letters/"+bad1], `***`) {
		t.Fatalf("console API shows no mask: %s", shown["console /api/v1/dead-letters/"+bad1])
	}
	for _, where := range []string{"relay log", "dlq list", "dlq list --json", "console /api/v1/dead-letters"} {
		if strings.Contains(shown[where], marker) {
			t.Errorf("%s quotes a payload value in an error:\n%s", where, shown[where])
		}
	}
	for where, text := range shown {
		if strings.Contains(text, secret) || strings.Contains(text, token) || strings.Contains(text, iban) || strings.Contains(text, cvv) {
			t.Errorf("%s shows the secret:\n%s", where, text)
		}
	}
}

// startConsole runs `outbox console --dev` in process on a free loopback
// port until the test ends, and returns its base URL.
func startConsole(t *testing.T, ctx context.Context, schema string, args ...string) string {
	t.Helper()
	users := filepath.Join(t.TempDir(), "users.json")
	sctx, stop := context.WithCancel(ctx)
	var stderr testenv.Buffer
	done := make(chan error, 1)
	go func() {
		done <- inProcess(sctx, strings.NewReader(""), io.Discard, &stderr, append([]string{"console", "--db", testenv.DatabaseURL(), "--schema", schema,
			"--users", users, "--dev", "--addr", "127.0.0.1:0"}, args...)...)
	}()
	t.Cleanup(func() { stop(); <-done })
	listening := regexp.MustCompile(`on (http://127\.0\.0\.1:\d+)`)
	var base string
	await.Eventually(t, 30*time.Second, func() error {
		if m := listening.FindStringSubmatch(stderr.String()); m != nil {
			base = m[1]
			return nil
		}
		select {
		case err := <-done:
			done <- err
			t.Fatalf("console ended before listening: %v; stderr %q", err, stderr.String())
		default:
		}
		return fmt.Errorf("console not listening; stderr %q", stderr.String())
	})
	return base
}
