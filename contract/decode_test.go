package contract

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// benchPayload is a 1 KB OrderPlaced payload that meets the contract in
// testdata/bench: 14 order lines, a customer, a shipping address, tags.
const benchPayload = "testdata/bench/order-placed.json"

func orderPayload(tb testing.TB) []byte {
	tb.Helper()
	p, err := os.ReadFile(benchPayload)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// stdDecode is the reference path: encoding/json with exact numbers, as
// the JSON Schema library's own jsonschema.UnmarshalJSON decodes.
func stdDecode(p []byte) (any, error) {
	return jsonschema.UnmarshalJSON(bytes.NewReader(p))
}

// verdict is what a check says of a payload: "not JSON", "valid", or the
// failing locations and keywords.
func verdict(c *Contract, doc any, err error) string {
	if err != nil {
		return "not JSON"
	}
	if err := c.schema.Validate(doc); err != nil {
		return describe(err)
	}
	return "valid"
}

// The fast decoder gives every payload of a table of valid, invalid and
// malformed ones the verdict that encoding/json and the library give, and,
// where the JSON is valid UTF-8, the very same value (numbers exact).
func TestFastDecodeGivesTheVerdictsOfEncodingJSON(t *testing.T) {
	r, err := Load("testdata/bench")
	if err != nil {
		t.Fatal(err)
	}
	c, err := r.Lookup("order", "OrderPlaced", "")
	if err != nil || c == nil {
		t.Fatalf("Lookup: %v, %v", c, err)
	}
	good := string(orderPayload(t))
	swap := func(old, nw string) string {
		if !strings.Contains(good, old) {
			t.Fatalf("the payload has no %q", old)
		}
		return strings.Replace(good, old, nw, 1)
	}
	cases := map[string]string{
		"valid":                    good,
		"integer as float":         swap(`"qty": 1,`, `"qty": 1.0,`),
		"integer with exponent":    swap(`"qty": 1,`, `"qty": 1e0,`),
		"integer beyond int64":     swap(`4611686018427387904`, `123456789012345678901234567890`),
		"fraction":                 swap(`"qty": 1,`, `"qty": 1.5,`),
		"negative zero minimum":    swap(`"total": 1234.5`, `"total": -0`),
		"below minimum":            swap(`"total": 1234.5`, `"total": -0.000000000000000000001`),
		"huge number":              swap(`"total": 1234.5`, `"total": 1e400`),
		"above maximum":            swap(`"qty": 1,`, `"qty": 1001,`),
		"wrong type":               swap(`"qty": 1,`, `"qty": "1",`),
		"enum":                     swap(`"EUR"`, `"eur"`),
		"pattern":                  swap(`"SKU-0000"`, `"sku-0000"`),
		"missing required":         swap(`"status": "placed", `, ``),
		"additional property":      swap(`"status": "placed", `, `"status": "placed", "note": 1, `),
		"nested ref":               swap(`"country": "DE"`, `"country": "Germany"`),
		"empty array":              swap(`"lines": [`, `"lines": [], "x": [`),
		"null":                     `null`,
		"empty object":             `{}`,
		"string escapes":           swap(`"Sometown"`, `"Some\u0074own \"q\" \\ \/ \n \ud83d\ude00"`),
		"lone surrogate":           swap(`"Sometown"`, `"Some\ud800town"`),
		"invalid UTF-8":            swap(`"Sometown"`, "\"Some\xfftown\""),
		"invalid UTF-8 in pattern": swap(`"DE"`, "\"D\xff\""),
		"duplicate key":            swap(`"currency": "EUR"`, `"currency": "EUR", "currency": "XXX"`),
		"whitespace around":        " \n\t" + good + " \r\n",
		"trailing garbage":         good + "x",
		"two values":               good + " {}",
		"truncated":                good[:len(good)-2],
		"trailing comma":           swap(`"gift"`, `"gift",`),
		"leading zero":             swap(`"total": 1234.5`, `"total": 01234.5`),
		"plus sign":                swap(`"total": 1234.5`, `"total": +1234.5`),
		"bare dot":                 swap(`"total": 1234.5`, `"total": 1234.`),
		"NaN":                      swap(`"total": 1234.5`, `"total": NaN`),
		"single quotes":            swap(`"gift"`, `'gift'`),
		"control character":        swap(`"Sometown"`, "\"Some\ttown\""),
		"bad escape":               swap(`"Sometown"`, `"Some\xtown"`),
		"empty":                    ``,
		"deep nesting":             strings.Repeat(`[`, 5000) + strings.Repeat(`]`, 5000),
		"too deep":                 strings.Repeat(`[`, 20000) + strings.Repeat(`]`, 20000),
	}
	for name, p := range cases {
		t.Run(name, func(t *testing.T) {
			ref, refErr := stdDecode([]byte(p))
			fast, fastErr := decode([]byte(p))
			want, got := verdict(c, ref, refErr), verdict(c, fast, fastErr)
			if strings.HasPrefix(name, "too deep") {
				// encoding/json stops at 10000 levels, the fast decoder
				// at 4096: both refuse.
				if refErr == nil || fastErr == nil {
					t.Fatalf("a payload nested 20000 deep: encoding/json %v, fast %v; want both to refuse it", refErr, fastErr)
				}
				return
			}
			if got != want {
				t.Fatalf("fast path %q, encoding/json + library %q", got, want)
			}
			if refErr == nil && utf8.ValidString(p) && !reflect.DeepEqual(ref, fast) {
				t.Fatalf("decoded values differ:\nencoding/json %#v\nfast          %#v", ref, fast)
			}
		})
	}
	if doc, err := decode([]byte(good)); verdict(c, doc, err) != "valid" {
		t.Fatalf("the benchmark's payload does not meet its contract: %s", verdict(c, doc, err))
	}
}

// FuzzDecodeAgreesWithEncodingJSON: the fast decoder accepts exactly what
// json.Valid accepts (up to its depth limit) and, on valid UTF-8, decodes
// to the same value as encoding/json.
func FuzzDecodeAgreesWithEncodingJSON(f *testing.F) {
	for _, s := range []string{`{}`, `[1, 2.5, -0, 1e400, "a\u00e9"]`, `{"a": {"b": [true, false, null]}}`, `{"a": [1, {"b": "c"}]}`, `{"a": 1,}`, "\"\xff\"", `01`, `"\ud800"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		if bytes.Count(p, []byte("["))+bytes.Count(p, []byte("{")) > 4000 {
			return // past the fast decoder's depth limit, where they differ on purpose
		}
		ref, refErr := stdDecode(p)
		fast, fastErr := decode(p)
		if (refErr == nil) != (fastErr == nil) {
			t.Fatalf("%q: encoding/json %v, fast %v", p, refErr, fastErr)
		}
		if refErr == nil && utf8.Valid(p) && !reflect.DeepEqual(ref, fast) {
			t.Fatalf("%q: encoding/json %#v, fast %#v", p, ref, fast)
		}
	})
}

// BenchmarkCheck measures checking one 1 KB event against its compiled
// contract (testdata/bench: 2020-12, required fields, enums, formats,
// patterns, a $ref, nested objects, an array of 14 objects), as WriteTx
// and the relay pay it per event, and its parts: json.Valid over the same
// bytes (what WriteTx does without contracts), decoding with encoding/json
// (the library's own UnmarshalJSON, as before) and with the fast decoder,
// and validating an already decoded payload. one-pass is the check of a
// valid payload without the library (onepass.go), one-pass-forbidden the
// same looking for two forbidden paths, check-library the check through
// the library alone. check-formats and one-pass-formats compile the
// schema with format assertions on.
func BenchmarkCheck(b *testing.B) {
	r, err := Load("testdata/bench")
	if err != nil {
		b.Fatal(err)
	}
	p := orderPayload(b)
	if len(p) < 1024 || len(p) > 1100 {
		b.Fatalf("payload of %d bytes", len(p))
	}
	c, _ := r.Lookup("order", "OrderPlaced", "")
	doc, err := decode(p)
	if err != nil {
		b.Fatal(err)
	}
	comp := jsonschema.NewCompiler()
	comp.AssertFormat()
	if err := comp.AddResource("bench.json", c.doc); err != nil {
		b.Fatal(err)
	}
	asserted, err := comp.Compile("bench.json")
	if err != nil {
		b.Fatal(err)
	}
	run := func(name string, f func() error) {
		if err := f(); err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(p)))
			b.ReportAllocs()
			for b.Loop() {
				if err := f(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	run("json.Valid", func() error {
		if !json.Valid(p) {
			return fmt.Errorf("not JSON")
		}
		return nil
	})
	run("decode=encoding-json", func() error { _, err := stdDecode(p); return err })
	run("decode=fast", func() error { _, err := decode(p); return err })
	run("validate", func() error { return c.schema.Validate(doc) })
	if c.onePass == nil || !c.onePass.accepts(p) {
		b.Fatal("the one-pass check does not take the bench contract and payload")
	}
	run("one-pass", func() error {
		if !c.onePass.accepts(p) {
			return fmt.Errorf("refused")
		}
		return nil
	})
	forbidden := [][]string{{"card", "token"}, {"lines", "*", "card"}}
	run("one-pass-forbidden", func() error {
		if !c.onePass.accepts(p, forbidden) {
			return fmt.Errorf("refused")
		}
		return nil
	})
	run("check", func() error { _, err := r.Check("order", "OrderPlaced", "", p, false); return err })
	run("check-library", func() error {
		d, err := decode(p)
		if err != nil {
			return err
		}
		return r.validate(c, d)
	})
	run("check-encoding-json", func() error {
		d, err := stdDecode(p)
		if err != nil {
			return err
		}
		return r.validate(c, d)
	})
	assertedPass := newOnePass(asserted)
	if assertedPass == nil || !assertedPass.accepts(p) {
		b.Fatal("the one-pass check does not take the bench payload with formats asserted")
	}
	run("one-pass-formats", func() error {
		if !assertedPass.accepts(p) {
			return fmt.Errorf("refused")
		}
		return nil
	})
	run("check-formats", func() error {
		d, err := decode(p)
		if err != nil {
			return err
		}
		return asserted.Validate(d)
	})
}
