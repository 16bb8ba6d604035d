package contract_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxkit/outbox/contract"
	"github.com/outboxkit/outbox/outboxdriver"
)

func load(t *testing.T, dir string) *contract.Registry {
	t.Helper()
	r, err := contract.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// writeRegistry writes an index and schema files into a new folder.
func writeRegistry(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestCheckValidatesAgainstTheNamedOrLatestVersion(t *testing.T) {
	r := load(t, "testdata/orders")
	const secret = "4111-SECRET-VALUE"
	cases := []struct {
		name, version, payload string
		raw                    bool
		wantVersion            string
		wantErr                string // "" for valid
	}{
		{"latest valid", "", `{"orderId": 1, "total": 9.5, "currency": "EUR"}`, false, "2", ""},
		{"v1 valid", "1", `{"orderId": 1, "total": 9.5}`, false, "1", ""},
		{"latest misses a required field", "", `{"orderId": 1, "total": 9.5}`, false, "", "at /: fails required"},
		{"wrong type", "1", `{"orderId": "one", "total": 9.5}`, false, "", "at /orderId: fails type"},
		{"enum", "2", `{"orderId": 1, "total": 1, "currency": "` + secret + `"}`, false, "", "at /currency: fails enum"},
		{"nested array item", "2", `{"orderId": 1, "total": 1, "currency": "EUR", "lines": [{"sku": "a", "qty": 0}]}`, false, "", "at /lines/0/qty: fails minimum"},
		{"unknown version", "3", `{"orderId": 1, "total": 1}`, false, "", "has no contract version 3 (the registry holds 1, 2)"},
		{"version not a number", "v1", `{"orderId": 1, "total": 1}`, false, "", "is not a positive integer"},
		{"not JSON", "", `{"orderId": `, false, "", "the payload is not JSON"},
		{"raw payload", "", `abc`, true, "", "the payload is not JSON (RawPayload)"},
		{"forbidden field", "1", `{"orderId": 1, "total": 1, "card": {"token": "` + secret + `"}}`, false, "", "holds card.token, which must never enter the outbox"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v, err := r.Check("order", "OrderPlaced", c.version, []byte(c.payload), c.raw)
			if c.wantErr == "" {
				if err != nil || v != c.wantVersion {
					t.Fatalf("Check: version %q, err %v; want %q, nil", v, err, c.wantVersion)
				}
				return
			}
			if !errors.Is(err, contract.ErrViolation) || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("Check: %v; want ErrViolation saying %q", err, c.wantErr)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("the error shows a payload value: %v", err)
			}
		})
	}
}

func TestMissingContractIsRefusedOrAllowedAndCounted(t *testing.T) {
	r := load(t, "testdata/orders")
	if _, err := r.Check("order", "OrderShipped", "", []byte(`{}`), false); !errors.Is(err, contract.ErrViolation) || !strings.Contains(err.Error(), "has no contract") {
		t.Fatalf("refuse: %v", err)
	}
	if err := r.SetMissing(contract.MissingAllow); err != nil {
		t.Fatal(err)
	}
	if v, err := r.Check("order", "OrderShipped", "", []byte(`{}`), false); err != nil || v != "" {
		t.Fatalf("allow: %q, %v", v, err)
	}
	// The registry-wide forbidden paths hold even without a contract.
	if _, err := r.Check("order", "OrderShipped", "", []byte(`{"card": {"token": "x"}}`), false); !errors.Is(err, contract.ErrViolation) {
		t.Fatalf("allow, forbidden field: %v", err)
	}
	if n := r.Uncovered(); n != 1 {
		t.Fatalf("Uncovered %d, want 1: the event let through, not the one refused", n)
	}
}

func TestCheckRecordSetsTheVersionHeader(t *testing.T) {
	r := load(t, "testdata/orders")
	rec := outboxdriver.Record{AggregateType: "order", Type: "OrderPlaced", Payload: []byte(`{"orderId": 1, "total": 2, "currency": "USD"}`), Headers: map[string]string{"tenant": "a"}}
	if err := r.CheckRecord(&rec); err != nil {
		t.Fatal(err)
	}
	if rec.Headers[contract.VersionHeader] != "2" || rec.Headers["tenant"] != "a" {
		t.Fatalf("headers %v", rec.Headers)
	}
	rec = outboxdriver.Record{AggregateType: "order", Type: "OrderPlaced", Payload: []byte(`{"orderId": 1, "total": 2}`), Headers: map[string]string{contract.VersionHeader: "1"}}
	if err := r.CheckRecord(&rec); err != nil {
		t.Fatalf("a v1 event checked as v1: %v", err)
	}
}

func TestLoadRefusesABadRegistry(t *testing.T) {
	schema := `{"type": "object"}`
	cases := map[string]struct {
		files map[string]string
		want  string
	}{
		"no index":            {map[string]string{"a.json": schema}, "contracts.json: no such file"},
		"index not JSON":      {map[string]string{"contracts.json": `{`}, "contracts.json"},
		"unknown index field": {map[string]string{"contracts.json": `{"contract": []}`}, `unknown field "contract"`},
		"schema not JSON":     {map[string]string{"contracts.json": `{"contracts": [{"aggregatetype": "a", "type": "T", "version": 1, "schema": "a.json"}]}`, "a.json": `{"type": `}, "schema a.json does not parse as JSON"},
		"schema not a schema": {map[string]string{"contracts.json": `{"contracts": [{"aggregatetype": "a", "type": "T", "version": 1, "schema": "a.json"}]}`, "a.json": `{"type": 7}`}, "is not a valid JSON Schema"},
		"schema file missing": {map[string]string{"contracts.json": `{"contracts": [{"aggregatetype": "a", "type": "T", "version": 1, "schema": "b.json"}]}`}, "b.json"},
		"schema outside":      {map[string]string{"contracts.json": `{"contracts": [{"aggregatetype": "a", "type": "T", "version": 1, "schema": "../a.json"}]}`}, "inside the registry's folder"},
		"version zero":        {map[string]string{"contracts.json": `{"contracts": [{"aggregatetype": "a", "type": "T", "version": 0, "schema": "a.json"}]}`, "a.json": schema}, "want a positive integer"},
		"duplicate":           {map[string]string{"contracts.json": `{"contracts": [{"aggregatetype": "a", "type": "T", "version": 1, "schema": "a.json"}, {"aggregatetype": "a", "type": "T", "version": 1, "schema": "a.json"}]}`, "a.json": schema}, "listed twice"},
		"bad missing policy":  {map[string]string{"contracts.json": `{"missing": "skip"}`}, `missing "skip"`},
		"bad sensitive path":  {map[string]string{"contracts.json": `{"sensitive": ["a..b"]}`}, "an empty segment"},
		"no type":             {map[string]string{"contracts.json": `{"contracts": [{"aggregatetype": "a", "version": 1, "schema": "a.json"}]}`, "a.json": schema}, "aggregatetype and type are required"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := contract.Load(writeRegistry(t, c.files))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Load: %v; want an error saying %q", err, c.want)
			}
		})
	}
}

func TestSensitivePathsJoinRegistryAndContract(t *testing.T) {
	r := load(t, "testdata/orders")
	got := strings.Join(r.SensitivePaths("order", "OrderPlaced"), ",")
	if got != "billing.iban,card.token,customer.email,payment.cvv,shipping.address" {
		t.Fatalf("SensitivePaths %q", got)
	}
}

// Fields a schema marks x-sensitive (or writeOnly) join the contract's
// sensitive paths, x-forbidden ones its forbidden paths, through $ref,
// array items and nested objects; a forbidden one is refused.
func TestSchemaMarksSensitiveAndForbiddenFields(t *testing.T) {
	dir := writeRegistry(t, map[string]string{
		"contracts.json": `{"missing": "allow", "sensitive": ["note"], "contracts": [
			{"aggregatetype": "user", "type": "SignedUp", "version": 1, "schema": "user.json"}]}`,
		"user.json": `{
			"type": "object",
			"properties": {
				"email": {"type": "string", "x-sensitive": true},
				"password": {"type": "string", "x-forbidden": true},
				"apiKey": {"type": "string", "writeOnly": true},
				"home": {"$ref": "#/$defs/address"},
				"cards": {"type": "array", "items": {"type": "object", "properties": {"number": {"type": "string", "x-sensitive": true}}}},
				"plain": {"type": "string", "x-sensitive": false}
			},
			"$defs": {"address": {"type": "object", "properties": {"street": {"type": "string", "x-sensitive": true}}}}
		}`,
	})
	r := load(t, dir)
	got := strings.Join(r.SensitivePaths("user", "SignedUp"), ",")
	if want := "apiKey,cards.*.number,email,home.street,note,password"; got != want {
		t.Fatalf("SensitivePaths %q, want %q", got, want)
	}
	if _, err := r.Check("user", "SignedUp", "", []byte(`{"email": "a@example.com", "home": {"street": "x"}}`), false); err != nil {
		t.Fatalf("a payload without the forbidden field: %v", err)
	}
	_, err := r.Check("user", "SignedUp", "", []byte(`{"password": "hunter2-SECRET"}`), false)
	if !errors.Is(err, contract.ErrViolation) || !strings.Contains(err.Error(), "holds password, which must never enter the outbox") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("a payload with the x-forbidden field: %v", err)
	}
	if got := strings.Join(r.AllSensitivePaths(), ","); !strings.Contains(got, "home.street") {
		t.Fatalf("AllSensitivePaths %q lacks home.street", got)
	}

	for name, c := range map[string]struct{ schema, want string }{
		"not a boolean":  {`{"properties": {"a": {"x-sensitive": "yes"}}}`, "is not a valid JSON Schema"},
		"the whole root": {`{"x-sensitive": true}`, "the whole payload is marked sensitive or forbidden"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := contract.Load(writeRegistry(t, map[string]string{
				"contracts.json": `{"contracts": [{"aggregatetype": "a", "type": "T", "version": 1, "schema": "a.json"}]}`,
				"a.json":         c.schema,
			}))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Load: %v; want an error saying %q", err, c.want)
			}
		})
	}
}

// Events without a contract under MissingAllow are counted by aggregate
// type and type, past MaxUncoveredTypes pairs under Other.
func TestUncoveredEventsAreCountedByType(t *testing.T) {
	r := load(t, "testdata/orders")
	if err := r.SetMissing(contract.MissingAllow); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := r.Check("order", "OrderShipped", "", []byte(`{}`), false); err != nil {
			t.Fatal(err)
		}
	}
	rec := outboxdriver.Record{AggregateType: "user", Type: "SignedUp", Payload: []byte(`not JSON`)}
	if err := r.CheckRecord(&rec); err != nil {
		t.Fatalf("the relay, an uncovered raw payload: %v", err)
	}
	for i := range contract.MaxUncoveredTypes {
		if _, err := r.Check("bulk", fmt.Sprint("T", i), "", nil, false); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]int64{}
	r.EachUncovered(func(a, typ string, n int64) { got[a+"/"+typ] = n })
	if got["order/OrderShipped"] != 2 || got["user/SignedUp"] != 1 || got["other/other"] != 2 || len(got) != contract.MaxUncoveredTypes+1 {
		t.Fatalf("uncovered by type: order/OrderShipped %d, user/SignedUp %d, other/other %d, %d pairs",
			got["order/OrderShipped"], got["user/SignedUp"], got["other/other"], len(got))
	}
	if r.Uncovered() != 3+contract.MaxUncoveredTypes {
		t.Fatalf("Uncovered %d", r.Uncovered())
	}
}
